//! Programs of kinds no shared trace records: QLoRA fine-tuning and 3-D U-Net training.

use super::{Builder, Rng};
use crate::Trace;

/// QLoRA fine-tuning of a 7B-parameter decoder (32 layers, width 4096, MLP 11,008): the base
/// weights quantized to 4 bits (packed bytes plus one fp32 scale per 64 weights, 3.6 GiB, live
/// throughout), rank-16 LoRA adapters on the q, k, v and o projections with their gradients and
/// Adam moments (fp32), bf16 activations, gradient checkpointing per layer. Every linear layer
/// dequantizes its weight into a bf16 temporary (32 or 86 MiB) around its matmul, in the forward
/// pass, again in the recomputation, and again in the backward pass; batches of 4 sequences
/// of 128..=2048 tokens (no packing), so every step's activations have their own size.
///
/// Any seed: 135,154 events (24 steps); peak live 8.08 GiB for seed 1, 7.5 to 8.1 GiB for
/// seeds 2-6.
pub fn qlora(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let (layers, d, f, r, vocab) = (32u64, 4096u64, 11008u64, 16u64, 32000u64);
    let linears = [(d, d), (d, d), (d, d), (d, d), (d, f), (d, f), (f, d)];
    let mut b = Builder::new();
    for _ in 0..layers {
        for (i, o) in linears {
            b.alloc(i * o / 2);
            b.alloc(i * o / 64 * 4);
        }
        b.alloc(d * 2);
        b.alloc(d * 2);
    }
    b.alloc(vocab * d * 2);
    b.alloc(vocab * d * 2);
    // Adapters: A (r × in) and B (out × r) for q, k, v, o, each with two Adam moments.
    for _ in 0..layers * 4 {
        for _ in 0..3 {
            b.alloc(r * d * 4);
            b.alloc(d * r * 4);
        }
    }
    let batch = 4;
    for _ in 0..24 {
        let seq = rng.range(128, 2048);
        let bs = batch * seq;
        let x_bytes = bs * d * 2;
        let ids = b.alloc(bs * 8);
        let mut x = b.alloc(x_bytes);
        let mut checkpoints = Vec::new();
        // One layer's forward; with `keep`, what its backward needs stays live.
        let layer = |b: &mut Builder, keep: bool| -> (u64, Vec<u64>) {
            let mut saved = Vec::new();
            let normed = b.alloc(x_bytes);
            let [q, k, v, o] = std::array::from_fn(|_| {
                let w = b.alloc(d * d * 2);
                let out = b.alloc(x_bytes);
                b.free(w);
                let lora = b.alloc(bs * r * 2);
                b.temp(x_bytes);
                if keep {
                    saved.push(lora)
                } else {
                    b.free(lora)
                }
                out
            });
            let scores = b.alloc(bs * 32 * 4);
            b.free_all([q, k, v]);
            let mid = b.alloc(x_bytes);
            b.free_all([scores, o]);
            let normed2 = b.alloc(x_bytes);
            let mut mlp = Vec::new();
            for _ in 0..2 {
                let w = b.alloc(d * f * 2);
                mlp.push(b.alloc(bs * f * 2));
                b.free(w);
            }
            let act = b.alloc(bs * f * 2);
            let w = b.alloc(f * d * 2);
            let down = b.alloc(x_bytes);
            b.free(w);
            let out = b.alloc(x_bytes);
            b.free_all([down, mid]);
            if keep {
                saved.extend([normed, normed2, act]);
                saved.extend(mlp);
            } else {
                b.free_all([normed, normed2, act]);
                b.free_all(mlp);
            }
            (out, saved)
        };
        for _ in 0..layers {
            let (out, _) = layer(&mut b, false);
            checkpoints.push(x);
            x = out;
        }
        let logits = b.alloc(bs * vocab * 4);
        let g_logits = b.alloc(bs * vocab * 4);
        b.free_all([logits, x]);
        let mut g = b.alloc(x_bytes);
        b.free(g_logits);
        for input in checkpoints.into_iter().rev() {
            // Recompute the layer keeping its activations, then its backward pass.
            let (out, saved) = layer(&mut b, true);
            b.free(out);
            for (i, o) in linears.iter().rev() {
                let w = b.alloc(i * o * 2);
                let g_in = b.alloc(bs * i.max(o) * 2);
                b.free(w);
                b.free(g_in);
            }
            for _ in 0..4 {
                b.temp(r * d * 4);
                b.temp(d * r * 4);
            }
            let g_x = b.alloc(x_bytes);
            b.free_all(saved);
            b.free_all([g, input]);
            g = g_x;
        }
        b.free_all([g, ids]);
        for _ in 0..layers * 4 {
            b.temp(r * d * 4);
            b.temp(d * r * 4);
        }
    }
    b.finish(format!("qlora-s{seed}"))
}

/// A 3-D U-Net trained with mixed precision (fp16 activations) on volume patches, in the
/// manner of nnU-Net: five levels of 32, 64, 128, 256 and 320 channels, two convolutions per
/// level (each followed by instance norm and a leaky ReLU, whose outputs are kept for the
/// backward pass), a cuDNN workspace per convolution of a size the algorithm chooses (0 to
/// 1.5 × its output), batch 2. Each step draws its patch edge from 96, 112, 128 or 160 voxels
/// (training patches and sliding-window validation windows alternate in such programs), so
/// activations of one level change size from step to step.
///
/// Any seed: 5,536 events (16 steps); peak live 11.90 GiB for seed 1, 12.0 to 12.1 GiB for
/// seeds 2-6.
pub fn unet3d_training(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let channels = [32u64, 64, 128, 256, 320];
    let batch = 2;
    let mut b = Builder::new();
    // Weights (fp32) and their two Adam moments: 3³ kernels, two convolutions per level in the
    // encoder and in the decoder.
    let mut params = Vec::new();
    let mut c_in = 1;
    for &c in &channels {
        params.extend([c_in * c * 27 * 4, c * c * 27 * 4, c * 4, c * 4]);
        c_in = c;
    }
    for w in channels.windows(2).rev() {
        params.extend([
            w[1] * w[0] * 8 * 4,
            2 * w[0] * w[0] * 27 * 4,
            w[0] * w[0] * 27 * 4,
        ]);
    }
    for &p in &params {
        b.alloc(p);
        b.alloc(p);
        b.alloc(p);
    }
    for _ in 0..16 {
        let edge = [96u64, 112, 128, 160][rng.range(0, 3) as usize];
        let input = b.alloc(batch * edge * edge * edge * 2);
        let mut x = input;
        let mut saved: Vec<Vec<u64>> = Vec::new();
        let mut skips = Vec::new();
        let conv = |b: &mut Builder, rng: &mut Rng, vox: u64, c: u64, keep: &mut Vec<u64>| {
            let out_bytes = batch * c * vox * 2;
            let ws = rng.range(0, out_bytes * 3 / 2);
            let w = (ws > 0).then(|| b.alloc(ws));
            let out = b.alloc(out_bytes);
            if let Some(w) = w {
                b.free(w);
            }
            let stats = b.alloc(batch * c * 8);
            let normed = b.alloc(out_bytes);
            let act = b.alloc(out_bytes);
            keep.extend([out, stats, normed]);
            act
        };
        // Encoder: two convolutions per level; the first of a deeper level strides by 2.
        for (level, &c) in channels.iter().enumerate() {
            let e = edge >> level;
            let vox = e * e * e;
            let mut keep = Vec::new();
            let a = conv(&mut b, &mut rng, vox, c, &mut keep);
            if level == 0 {
                // Deeper levels' inputs are the skips, which the decoder frees.
                keep.push(x);
            }
            let a2 = conv(&mut b, &mut rng, vox, c, &mut keep);
            keep.push(a);
            saved.push(keep);
            skips.push(a2);
            x = a2;
        }
        // Decoder: upsample, concatenate with the skip, two convolutions.
        let mut up_saved = Vec::new();
        let _ = skips.pop();
        for (level, &c) in channels.iter().enumerate().rev().skip(1) {
            let e = edge >> level;
            let vox = e * e * e;
            let up = b.alloc(batch * c * vox * 2);
            let cat = b.alloc(2 * batch * c * vox * 2);
            let mut keep = vec![up];
            keep.extend(skips.pop());
            let a = conv(&mut b, &mut rng, vox, c, &mut keep);
            keep.push(cat);
            let a2 = conv(&mut b, &mut rng, vox, c, &mut keep);
            keep.push(a);
            keep.push(x);
            up_saved.push((keep, vox, c));
            x = a2;
        }
        let logits = b.alloc(batch * 4 * (edge * edge * edge) * 4);
        let loss = b.alloc(4);
        let mut g = b.alloc(batch * 4 * (edge * edge * edge) * 4);
        b.free_all([logits, x, loss]);
        // Backward: each level's gradients, then what it kept.
        for (keep, vox, c) in up_saved.into_iter().rev() {
            for _ in 0..2 {
                let ws = rng.range(0, batch * c * vox * 3);
                let g_in = b.alloc(2 * batch * c * vox * 2);
                if ws > 0 {
                    b.temp(ws);
                }
                b.free(g);
                g = g_in;
            }
            b.free_all(keep);
        }
        for (level, keep) in saved.into_iter().enumerate().rev() {
            let e = edge >> level;
            let c = channels[level];
            for _ in 0..2 {
                let ws = rng.range(0, batch * c * e * e * e * 3);
                let g_in = b.alloc(batch * c * e * e * e * 2);
                if ws > 0 {
                    b.temp(ws);
                }
                b.free(g);
                g = g_in;
            }
            b.free_all(keep);
        }
        b.free(g);
        // Adam, one tensor at a time.
        for &p in &params {
            b.temp(p);
        }
    }
    b.finish(format!("unet3d-training-s{seed}"))
}
