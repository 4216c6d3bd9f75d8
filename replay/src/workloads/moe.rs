//! Mixture-of-experts training: token routing gives every expert's tensors a new size in every
//! layer of every step.

use super::{Builder, Rng};
use crate::Trace;

/// The model: a decoder of 8 layers, width 1,024, 16 heads, 8 experts of MLP width 2,816 per
/// layer (SwiGLU: `w1`, `w3` of `width × ffn`, `w2` of `ffn × width`), top-2 routing, vocabulary
/// 32,000, fp32 weights with their two Adam moments.
const LAYERS: u64 = 8;
const WIDTH: u64 = 1024;
const FFN: u64 = 2816;
const EXPERTS: usize = 8;
const TOP_K: u64 = 2;
const VOCAB: u64 = 32_000;

/// Mixture-of-experts training in the manner of Hugging Face's Mixtral implementation, the
/// most common way such models are fine-tuned: the router picks two experts per token, and
/// each expert in turn gathers its tokens (`index_select`), runs its SwiGLU MLP on them and
/// adds the result back (`index_add`). What an expert receives is redrawn for every layer of
/// every step with a skew that changes too (a few experts take most tokens in one layer, the
/// load is nearly even in the next), so every gathered input, hidden activation and output
/// has a size no earlier request had, while the weights' gradients (fp32, one per expert
/// weight, made on the first backward use of each and dropped by `zero_grad`) are made in
/// between, in the order the backward pass reaches them. Batches of 8 sequences of 512..=2,048
/// tokens; bf16 activations; attention fused (only its output and log-sum-exp kept).
///
/// Any seed: about 43,000 events (16 steps); peak live 13.70 GiB for seed 1, 12.9 to 14.4 GiB
/// over seeds 1-6.
pub fn moe_training(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let mut b = Builder::new();
    let (d, f) = (WIDTH, FFN);
    // Per layer: two norms, q/k/v/o, the router, then each expert's w1, w3 and w2; then the
    // embedding (tied to the output) and the final norm. fp32.
    let mut params = Vec::new();
    for _ in 0..LAYERS {
        params.extend([d * 4, d * 4, 4 * d * d * 4, d * EXPERTS as u64 * 4]);
        for _ in 0..EXPERTS {
            params.extend([d * f * 4, d * f * 4, f * d * 4]);
        }
    }
    params.extend([VOCAB * d * 4, d * 4]);
    for &p in &params {
        b.alloc(p);
    }
    for &p in &params {
        b.alloc(p);
        b.alloc(p);
    }
    let per_layer = 4 + 3 * EXPERTS;
    for _ in 0..16 {
        let tokens = 8 * rng.range(512, 2048);
        let x_bytes = tokens * d * 2;
        let ids = b.alloc(tokens * 8);
        let mut x = b.alloc(x_bytes);
        let mut saved: Vec<SavedLayer> = Vec::new();
        for _ in 0..LAYERS {
            let mut keep = vec![x];
            keep.push(b.alloc(x_bytes)); // normed
            keep.push(b.alloc(tokens * 4)); // its statistics
            let qkv = b.alloc(3 * x_bytes);
            keep.push(b.alloc(x_bytes)); // attention output
            keep.push(b.alloc(tokens * 16 * 4)); // log-sum-exp
            keep.push(qkv);
            let h = b.alloc(x_bytes);
            keep.push(b.alloc(x_bytes)); // normed again
            keep.push(b.alloc(tokens * 4));
            // The router: logits, probabilities, the top-2 weights and indices.
            let logits = b.alloc(tokens * EXPERTS as u64 * 4);
            keep.push(b.alloc(tokens * EXPERTS as u64 * 4));
            b.free(logits);
            keep.push(b.alloc(tokens * TOP_K * 4));
            keep.push(b.alloc(tokens * TOP_K * 8));
            let out = b.alloc(x_bytes);
            let mut experts = Vec::new();
            for (e, n) in route(&mut rng, tokens * TOP_K).into_iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let picked = b.alloc(n * 8); // the expert's token indices
                let xin = b.alloc(n * d * 2);
                let h1 = b.alloc(n * f * 2);
                let h3 = b.alloc(n * f * 2);
                let act = b.alloc(n * f * 2);
                let y = b.alloc(n * d * 2);
                b.temp(n * d * 2); // scaled by the routing weights, added into `out`
                b.free(y);
                keep.extend([picked, xin, h1, h3, act]);
                experts.push((e, n));
            }
            saved.push(SavedLayer { keep, experts });
            b.free(h);
            x = out;
        }
        // The output projection (bf16 logits over the vocabulary) and the gradient it sends back.
        let logits = b.alloc(tokens * VOCAB * 2);
        let mut g = b.alloc(x_bytes);
        b.free_all([logits, x]);
        let mut grads: Vec<Option<u64>> = params.iter().map(|_| None).collect();
        let mut grad = |b: &mut Builder, i: usize| {
            if grads[i].is_none() {
                grads[i] = Some(b.alloc(params[i]));
            }
        };
        grad(&mut b, params.len() - 2);
        for (layer, SavedLayer { keep, experts }) in saved.into_iter().enumerate().rev() {
            let base = layer * per_layer;
            let g_moe = b.alloc(x_bytes);
            for (e, n) in experts {
                let g_y = b.alloc(n * d * 2);
                let g_act = b.alloc(n * f * 2);
                grad(&mut b, base + 4 + 3 * e + 2);
                let g_h1 = b.alloc(n * f * 2);
                let g_h3 = b.alloc(n * f * 2);
                b.free_all([g_y, g_act]);
                grad(&mut b, base + 4 + 3 * e);
                grad(&mut b, base + 4 + 3 * e + 1);
                b.temp(n * d * 2); // the expert's input gradient, added into `g_moe`
                b.free_all([g_h1, g_h3]);
            }
            grad(&mut b, base + 3);
            let g_attn = b.alloc(x_bytes);
            b.temp(3 * x_bytes);
            grad(&mut b, base + 2);
            grad(&mut b, base);
            grad(&mut b, base + 1);
            b.free_all([g_moe, g]);
            b.free_all(keep);
            g = g_attn;
        }
        b.free_all([g, ids]);
        // AdamW, one tensor at a time; then `zero_grad(set_to_none=True)`.
        for &p in &params {
            b.temp(p);
        }
        b.free_all(grads.into_iter().flatten());
    }
    b.finish(format!("moe-training-s{seed}"))
}

/// What one layer's forward pass keeps for its backward pass.
struct SavedLayer {
    keep: Vec<u64>,
    /// The experts that received tokens, with how many.
    experts: Vec<(usize, u64)>,
}

/// How many of `slots` token slots each expert receives: a share drawn per expert from a skew
/// that is itself drawn (from nearly even to a few experts taking most), summing to `slots`.
fn route(rng: &mut Rng, slots: u64) -> [u64; EXPERTS] {
    let skew = rng.range(1, 4);
    let weights: [u64; EXPERTS] = std::array::from_fn(|_| rng.range(1, 100).pow(skew as u32));
    let total: u64 = weights.iter().sum();
    let mut counts = weights.map(|w| slots * w / total);
    let given: u64 = counts.iter().sum();
    counts[rng.range(0, EXPERTS as u64 - 1) as usize] += slots - given;
    counts
}
