//! Training loops: a transformer's forward, backward and optimizer steps, BERT-base with
//! varying batches, and the same calling `empty_cache()` after every step.

use super::{Builder, Rng};
use crate::{Event, Trace};

/// A decoder-style transformer, as far as its allocations go.
#[derive(Clone, Copy)]
struct Model {
    layers: u64,
    width: u64,
    ffn: u64,
    heads: u64,
    vocab: u64,
    /// Bytes an activation element takes (4 fp32, 2 bf16).
    act: u64,
    /// Materialise `batch × heads × seq × seq` attention scores (eager attention) instead of
    /// keeping only the log-sum-exp (fused attention).
    eager_attention: bool,
    dropout: bool,
    clip_grad_norm: bool,
}

/// The parameters' sizes in bytes (fp32). Per layer: ln1 w/b, qkv w/b, proj w/b, ln2 w/b,
/// fc1 w/b, fc2 w/b. Then the token and position embeddings and the final norm (the output
/// projection is tied to the token embedding).
fn params(m: &Model, max_seq: u64) -> Vec<u64> {
    let (d, f) = (m.width, m.ffn);
    let mut p = Vec::new();
    for _ in 0..m.layers {
        for elems in [d, d, 3 * d * d, 3 * d, d * d, d, d, d, d * f, f, f * d, d] {
            p.push(4 * elems);
        }
    }
    for elems in [m.vocab * d, max_seq * d, d, d] {
        p.push(4 * elems);
    }
    p
}

/// Allocates the weights and the two Adam moments of each, never freed.
fn setup_training(b: &mut Builder, params: &[u64]) {
    for &p in params {
        b.alloc(p);
    }
    for &p in params {
        b.alloc(p);
        b.alloc(p);
    }
}

/// What one layer's forward pass keeps for its backward pass.
struct Saved {
    x_in: u64,
    ln1: [u64; 3],
    qkv: u64,
    attn: Vec<u64>,
    mask1: Option<u64>,
    x_mid: u64,
    ln2: [u64; 3],
    fc1: u64,
    gelu: u64,
    mask2: Option<u64>,
}

/// One training step (forward, backward, optional gradient clipping, AdamW, `zero_grad`) on a
/// batch of `batch × seq` tokens.
fn train_step(b: &mut Builder, rng: &mut Rng, m: &Model, params: &[u64], batch: u64, seq: u64) {
    let (bs, d, f, h) = (batch * seq, m.width, m.ffn, m.heads);
    let bsd = bs * d * m.act;
    let stats = bs * 4;
    let tokens = b.alloc(bs * 8);
    let targets = b.alloc(bs * 8);
    let mut grads: Vec<Option<u64>> = params.iter().map(|_| None).collect();
    let per_layer = 12;
    let mut grad = |b: &mut Builder, i: usize| {
        if let (Some(slot), Some(&p)) = (grads.get_mut(i), params.get(i)) {
            if slot.is_none() {
                *slot = Some(b.alloc(p));
            }
        }
    };

    // Forward.
    let mut x = b.alloc(bsd);
    let mut saved = Vec::new();
    for _ in 0..m.layers {
        let x_in = x;
        let ln1 = [b.alloc(bsd), b.alloc(stats), b.alloc(stats)];
        let qkv = b.alloc(3 * bsd);
        let mut attn = Vec::new();
        if m.eager_attention {
            let scores = b.alloc(batch * h * seq * seq * m.act);
            let probs = b.alloc(batch * h * seq * seq * m.act);
            b.free(scores);
            attn.push(probs);
            if m.dropout {
                attn.push(b.alloc(batch * h * seq * seq));
                attn.push(b.alloc(batch * h * seq * seq * m.act));
            }
            attn.push(b.alloc(bsd));
        } else {
            attn.push(b.alloc(bsd));
            attn.push(b.alloc(batch * h * seq * 4));
        }
        let mut proj = b.alloc(bsd);
        let mask1 = m.dropout.then(|| b.alloc(bs * d));
        if m.dropout {
            let dropped = b.alloc(bsd);
            b.free(proj);
            proj = dropped;
        }
        let x_mid = b.alloc(bsd);
        b.free(proj);
        let ln2 = [b.alloc(bsd), b.alloc(stats), b.alloc(stats)];
        let fc1 = b.alloc(bs * f * m.act);
        let gelu = b.alloc(bs * f * m.act);
        let mut fc2 = b.alloc(bsd);
        let mask2 = m.dropout.then(|| b.alloc(bs * d));
        if m.dropout {
            let dropped = b.alloc(bsd);
            b.free(fc2);
            fc2 = dropped;
        }
        x = b.alloc(bsd);
        b.free(fc2);
        saved.push(Saved {
            x_in,
            ln1,
            qkv,
            attn,
            mask1,
            x_mid,
            ln2,
            fc1,
            gelu,
            mask2,
        });
    }
    let lnf = [b.alloc(bsd), b.alloc(stats), b.alloc(stats)];
    let logits = b.alloc(bs * m.vocab * 4);
    let lse = b.alloc(stats);
    let loss = b.alloc(4);
    for _ in 0..rng.range(0, 6) {
        b.temp(rng.range(1, 16) * 4);
    }

    // Backward: each op allocates the gradient of its input, then drops what it saved and the
    // gradient of its output.
    let head = params.len() - 4;
    let g_logits = b.alloc(bs * m.vocab * 4);
    b.free_all([lse, logits]);
    grad(b, head);
    let g_lnf = b.alloc(bsd);
    b.free(g_logits);
    let mut g = b.alloc(bsd);
    grad(b, head + 2);
    grad(b, head + 3);
    b.free_all(lnf);
    b.free(x);
    b.free(g_lnf);
    for (layer, s) in saved.into_iter().enumerate().rev() {
        let p = layer * per_layer;
        let mut g_branch = g;
        if let Some(mask) = s.mask2 {
            let gd = b.alloc(bsd);
            b.free(mask);
            g_branch = gd;
        }
        let g_gelu = b.alloc(bs * f * m.act);
        grad(b, p + 10);
        grad(b, p + 11);
        b.free(s.gelu);
        if g_branch != g {
            b.free(g_branch);
        }
        let g_fc1 = b.alloc(bs * f * m.act);
        b.free_all([s.fc1, g_gelu]);
        let g_ln2 = b.alloc(bsd);
        grad(b, p + 8);
        grad(b, p + 9);
        b.free_all([s.ln2[0], g_fc1]);
        let g_res = b.alloc(bsd);
        grad(b, p + 6);
        grad(b, p + 7);
        b.free_all([s.ln2[1], s.ln2[2], s.x_mid, g_ln2]);
        let g_mid = b.alloc(bsd);
        b.free_all([g_res, g]);

        let mut g_branch = g_mid;
        if let Some(mask) = s.mask1 {
            let gd = b.alloc(bsd);
            b.free(mask);
            g_branch = gd;
        }
        let g_attn = b.alloc(bsd);
        grad(b, p + 4);
        grad(b, p + 5);
        if g_branch != g_mid {
            b.free(g_branch);
        }
        let mut attn = s.attn.into_iter().rev();
        if let Some(out) = attn.next() {
            b.free(out);
        }
        if m.eager_attention {
            // Through dropout and softmax, each step allocating a gradient of scores' size.
            let mut g_s = g_attn;
            for t in attn {
                let next = b.alloc(batch * h * seq * seq * m.act);
                b.free_all([t, g_s]);
                g_s = next;
            }
            let g_qkv = b.alloc(3 * bsd);
            b.free_all([s.qkv, g_s]);
            g = g_qkv;
        } else {
            let g_qkv = b.alloc(3 * bsd);
            b.free_all(attn);
            b.free_all([s.qkv, g_attn]);
            g = g_qkv;
        }
        let g_ln1 = b.alloc(bsd);
        grad(b, p + 2);
        grad(b, p + 3);
        b.free_all([s.ln1[0], g]);
        let g_x = b.alloc(bsd);
        grad(b, p);
        grad(b, p + 1);
        b.free_all([s.ln1[1], s.ln1[2], g_ln1]);
        let g_in = b.alloc(bsd);
        b.free_all([g_x, g_mid]);
        // The layer's input (for layer 0, the embedding output).
        b.free(s.x_in);
        g = g_in;
    }
    grad(b, head);
    grad(b, head + 1);
    b.free(g);

    // Gradient clipping: a norm per parameter, stacked, then the total.
    if m.clip_grad_norm {
        let norms: Vec<u64> = params.iter().map(|_| b.alloc(4)).collect();
        let stacked = b.alloc(4 * params.len() as u64);
        b.free_all(norms);
        let total = b.alloc(4);
        b.free(stacked);
        b.temp(4);
        b.free(total);
    }
    // AdamW, one parameter at a time: the denominator and the update are temporaries.
    for &p in params {
        b.temp(p);
        b.temp(p);
    }
    // zero_grad(set_to_none=True).
    b.free_all(grads.into_iter().flatten());
    b.free_all([loss, tokens, targets]);
}

/// A GPT-2-medium-sized language model (24 layers, width 1024, vocabulary 50,304; 354 M
/// parameters) trained in fp32 with fused attention, batch 8 × 1,024 tokens, AdamW, for 12
/// steps. Weights and both Adam moments (3.97 GiB) are allocated first and stay live; each
/// step's activations (about 0.5 GiB a layer) are kept for the backward pass, which frees them
/// in reverse while allocating gradients. The seed decides dropout (on or off), gradient
/// clipping, and a few small metric temporaries per step.
///
/// Seed 1: 36,666 events, peak live 19.11 GiB; any seed: 36k to 48k events, peak 19.0 to
/// 19.6 GiB.
pub fn transformer_training(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let m = Model {
        layers: 24,
        width: 1024,
        ffn: 4096,
        heads: 16,
        vocab: 50304,
        act: 4,
        eager_attention: false,
        dropout: rng.chance(50),
        clip_grad_norm: rng.chance(50),
    };
    let seq = 1024;
    let p = params(&m, seq);
    let mut b = Builder::new();
    setup_training(&mut b, &p);
    for _ in 0..12 {
        train_step(&mut b, &mut rng, &m, &p, 8, seq);
    }
    b.finish(format!("transformer-training-s{seed}"))
}

/// BERT-base (12 layers, width 768, vocabulary 30,522) in fp32 with eager attention and dropout
/// (the seed decides gradient clipping), its parameters for 512 positions, and a trace that
/// begins with the weights and Adam moments allocated.
fn bert_training(seed: u64) -> (Rng, Model, Vec<u64>, Builder) {
    let mut rng = Rng::new(seed);
    let m = Model {
        layers: 12,
        width: 768,
        ffn: 3072,
        heads: 12,
        vocab: 30522,
        act: 4,
        eager_attention: true,
        dropout: true,
        clip_grad_norm: rng.chance(50),
    };
    let p = params(&m, 512);
    let mut b = Builder::new();
    setup_training(&mut b, &p);
    (rng, m, p, b)
}

/// An encoder (BERT-base sized: 12 layers, width 768, vocabulary 30,522) trained in fp32 with
/// eager attention for 40 steps, each with its own batch size (uniform in 4..=48) of 256-token
/// sequences, so every step's activations differ in size and the cache fragments. The batch is
/// allocated on a side stream (stream 7, as a prefetching data loader does). Weights and Adam
/// moments (1.22 GiB) stay live.
///
/// Seed 1: 72,802 events, peak live 14.56 GiB; any seed: 72k to 86k events, peak 3 to 15 GiB
/// (the peak follows the largest batch drawn, 14 to 15 GiB for most seeds).
pub fn varying_batch(seed: u64) -> Trace {
    let (mut rng, m, p, mut b) = bert_training(seed);
    let seq = 256;
    for _ in 0..40 {
        let batch = rng.range(4, 48);
        // The data loader's copy stream allocates the batch; the step runs on stream 0.
        b.stream = 7;
        let input = b.alloc(batch * seq * 8);
        b.stream = 0;
        train_step(&mut b, &mut rng, &m, &p, batch, seq);
        b.free(input);
    }
    b.finish(format!("varying-batch-s{seed}"))
}

/// A training loop that calls `torch.cuda.empty_cache()` after every step, as notebooks and
/// scripts fighting fragmentation do: the BERT-base encoder of [`varying_batch`] (fp32, eager
/// attention) for 30 steps, each with its own batch size (uniform in 8..=40) of 256-token
/// sequences and, with probability 25 %, an evaluation pass on a batch of its own (forward only,
/// no gradients) before the cache is emptied. Every step starts from an allocator that gave
/// back every free page: what differs between the policies is how they regrow, and how much
/// each empty_cache costs. Weights and Adam moments (1.22 GiB) stay live.
///
/// Seed 1: 56,900 events, peak live 12.57 GiB; seeds 2-6: 64k to 66k events, 11.1 to 12.6 GiB.
pub fn empty_cache_training(seed: u64) -> Trace {
    let (mut rng, m, p, mut b) = bert_training(seed);
    let seq = 256;
    for _ in 0..30 {
        let batch = rng.range(8, 40);
        train_step(&mut b, &mut rng, &m, &p, batch, seq);
        if rng.chance(25) {
            eval_forward(&mut b, &m, rng.range(8, 64), seq);
        }
        b.events.push(Event::EmptyCache);
    }
    b.finish(format!("empty-cache-training-s{seed}"))
}

/// A forward pass without gradients: each layer's temporaries are freed before the next layer.
fn eval_forward(b: &mut Builder, m: &Model, batch: u64, seq: u64) {
    let (bs, d, f, h) = (batch * seq, m.width, m.ffn, m.heads);
    let bsd = bs * d * m.act;
    let tokens = b.alloc(bs * 8);
    let mut x = b.alloc(bsd);
    for _ in 0..m.layers {
        let ln = b.alloc(bsd);
        let qkv = b.alloc(3 * bsd);
        b.free(ln);
        let scores = b.alloc(batch * h * seq * seq * m.act);
        let probs = b.alloc(batch * h * seq * seq * m.act);
        b.free(scores);
        let attn = b.alloc(bsd);
        b.free_all([probs, qkv]);
        let mid = b.alloc(bsd);
        b.free_all([attn, x]);
        let fc1 = b.alloc(bs * f * m.act);
        let gelu = b.alloc(bs * f * m.act);
        b.free(fc1);
        let out = b.alloc(bsd);
        b.free(gelu);
        x = b.alloc(bsd);
        b.free_all([out, mid]);
    }
    let logits = b.alloc(bs * m.vocab * 4);
    b.free_all([logits, x, tokens]);
}
