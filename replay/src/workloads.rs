//! Built-in workloads: seeded, deterministic generators of realistic allocation patterns, for
//! replaying where no recorded trace fits, and for tests.
//!
//! Every generator is a pure function of its arguments: the same seed gives the same trace, event
//! for event. Ids are dense (the n-th allocation is id n - 1), every trace starts empty and every
//! `Free` names a live allocation. What stays live at the end is the long-lived state the workload
//! documents (weights, optimizer state), allocated before everything else and never freed.
//!
//! Sizes model real PyTorch programs: tensors of `batch × seq × width` elements, layer norm
//! statistics, dropout masks (one byte an element), logits over the vocabulary, weight gradients
//! dropped by `zero_grad(set_to_none=True)` and reallocated by the next backward pass.
//!
//! [`builtin`] is the default set; its figures (seed 1) are:
//!
//! | trace | events | peak live | live at end |
//! |---|---|---|---|
//! | `transformer-training-s1` | 36,666 | 19.11 GiB | 3.97 GiB |
//! | `inference-kv-cache-s1` | 136,412 | 18.15 GiB | 12.55 GiB |
//! | `varying-batch-s1` | 72,802 | 14.56 GiB | 1.22 GiB |
//! | `rmm-random-s1-max67108864-ops100000` | 100,000 | 15.62 GiB | 0 |
//!
//! Other seeds stay in the ranges each generator documents. Beyond the default set,
//! [`MECHANISMS`] each show one mechanism of the allocators, [`PROGRAMS`] are programs of
//! kinds no shared trace records (`empty_cache()` every step, QLoRA, 3-D U-Net training) and
//! [`SERVERS`] inference servers with one stream per request in flight.

use crate::{Event, StartState, Trace};

mod serving;
pub use serving::inference_server;

const MIB: u64 = 1 << 20;

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and good enough for workload shapes.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x05ee_d0fa_110c)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (Lemire's multiply-shift; `lo <= hi`).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = u128::from(hi.saturating_sub(lo)) + 1;
        lo + ((u128::from(self.next()) * span) >> 64) as u64
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 99) < percent
    }
}

/// Appends events, numbering allocations densely.
struct Builder {
    events: Vec<Event>,
    next_id: u64,
    stream: u64,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            events: Vec::new(),
            next_id: 0,
            stream: 0,
        }
    }

    fn alloc(&mut self, size: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.events.push(Event::Alloc {
            id,
            size,
            stream: self.stream,
        });
        id
    }

    fn free(&mut self, id: u64) {
        self.events.push(Event::Free { id });
    }

    fn free_all(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            self.free(id);
        }
    }

    /// Allocates and frees at once: a temporary.
    fn temp(&mut self, size: u64) {
        let id = self.alloc(size);
        self.free(id);
    }

    fn finish(self, name: String) -> Trace {
        Trace {
            name,
            initial: Vec::new(),
            events: self.events,
            start: StartState::Empty,
            skipped_frees: 0,
            recorded: None,
            alloc_conf: None,
            skipped: Default::default(),
        }
    }
}

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

/// Autoregressive generation with a growing KV cache on a 7B-parameter decoder (32 layers, width
/// 4096, MLP 11,008, fp16: 12.55 GiB of weights, allocated first and kept). Five requests, each
/// with its own batch (1, 2, 4 or 8), prompt (128..=2048 tokens) and generation length
/// (24..=80 tokens). The prefill allocates eager attention scores over the whole prompt; each
/// generated token then allocates per-layer temporaries (q/k/v, scores over the cache, MLP) and
/// grows each layer's K and V cache: requests alternate between `torch.cat`-style reallocation
/// (a new, one-token-longer tensor every token) and paged growth (a new 256-token block when
/// the last is full). The cache is freed and `empty_cache()` called after each request.
///
/// Seed 1: 136,412 events, peak live 18.15 GiB; any seed: 40k to 170k events, peak 13 to
/// 27 GiB.
pub fn inference_kv_cache(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let (layers, d, f, h, vocab, act) = (32u64, 4096u64, 11008u64, 32u64, 32000u64, 2u64);
    let mut b = Builder::new();
    for _ in 0..layers {
        for elems in [d, 3 * d * d, d * d, d, 2 * d * f, f * d] {
            b.alloc(act * elems);
        }
    }
    for elems in [vocab * d, d, vocab * d] {
        b.alloc(act * elems);
    }
    for request in 0..5 {
        let batch = 1 << rng.range(0, 3);
        let prompt = rng.range(128, 2048);
        let gen = rng.range(24, 80);
        let paged = request % 2 == 1;
        let block = 256;
        let mut ids = b.alloc(batch * prompt * 8);

        // Prefill.
        let mut cache: Vec<Vec<u64>> = Vec::new();
        let mut x = b.alloc(batch * prompt * d * act);
        let shape = serving::DecoderShape {
            width: d,
            ffn: f,
            heads: h,
            act,
        };
        for _ in 0..layers {
            let (out, kv) =
                serving::prefill_layer(&mut b, shape, batch, prompt, paged.then_some(block), x);
            cache.push(kv);
            x = out;
        }
        let logits = b.alloc(batch * vocab * 4);
        b.free_all([logits, x]);

        // Decode.
        for t in 0..gen {
            let len = prompt + t + 1;
            let mut x = b.alloc(batch * d * act);
            for kv in cache.iter_mut() {
                x = serving::decode_layer(&mut b, shape, batch, len, paged.then_some(block), kv, x);
            }
            let logits = b.alloc(batch * vocab * 4);
            let probs = b.alloc(batch * vocab * 4);
            b.free_all([logits, x]);
            let next = b.alloc(batch * 8);
            b.free(probs);
            let longer = b.alloc(batch * len * 8);
            b.free_all([ids, next]);
            ids = longer;
        }
        b.free(ids);
        b.free_all(cache.into_iter().flatten());
        b.events.push(Event::EmptyCache);
    }
    b.finish(format!("inference-kv-cache-s{seed}"))
}

/// The shape of RMM's `random_allocations` benchmark: `ops` steps, each allocating (with
/// probability 73 %, while fewer than `ops / 2` allocations were made and the live total stays
/// under 16,000 MiB, RMM's `max_usage`) a size uniform in `1..=max_size`, or else freeing a
/// uniformly chosen live allocation. As in RMM, a step with nothing live always allocates, and
/// a size is drawn every step. Whatever is still live after the last step is freed, in random
/// order, so the trace ends with nothing live; it has at most `ops` events plus those frees
/// (RMM's shape leaves almost none).
pub fn rmm_random(seed: u64, max_size: u64, ops: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let max_usage = 16_000 * MIB;
    let max_size = max_size.max(1);
    let num_allocations = ops / 2;
    let mut b = Builder::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let (mut live_bytes, mut allocated) = (0u64, 0u64);
    for _ in 0..ops {
        let size = rng.range(1, max_size);
        let mut do_alloc = true;
        if !live.is_empty() {
            do_alloc = rng.chance(73)
                && allocated < num_allocations
                && live_bytes.saturating_add(size) < max_usage;
        }
        if do_alloc {
            live.push((b.alloc(size), size));
            live_bytes += size;
            allocated += 1;
        } else if !live.is_empty() {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let (id, size) = live.swap_remove(i);
            b.free(id);
            live_bytes -= size;
        }
    }
    while !live.is_empty() {
        let i = rng.range(0, live.len() as u64 - 1) as usize;
        let (id, _) = live.swap_remove(i);
        b.free(id);
    }
    b.finish(format!("rmm-random-s{seed}-max{max_size}-ops{ops}"))
}

/// Small tensors that arrive after large ones were freed: the shape where separate small and
/// large pools waste memory (Note \[Borrowing\] in vmm-alloc's `expandable/allocate.rs`). Each
/// of 120 steps allocates an activation of 9 to 15 MiB and a 3 to 6 MiB tensor kept to the end
/// (saved for a backward pass that never comes), frees the activation, then allocates one to
/// four small tensors of 256 KiB to 1 MiB (statistics, masks), also kept. Live memory only
/// grows, so the peak is the end, where the last activation's 9 to 15 MiB lie free in a large
/// page that also holds a kept tensor: with 20 MiB pages no remap can take them, and a small
/// pool that never borrows needs new pages for the last small tensors. Not in [`builtin`]:
/// `--workload small-after-large`.
///
/// Seed 1: 665 events, peak live 0.74 GiB.
pub fn small_after_large(seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let mut b = Builder::new();
    for _ in 0..120 {
        let activation = b.alloc(rng.range(9 * MIB, 15 * MIB));
        b.alloc(rng.range(3 * MIB, 6 * MIB));
        b.free(activation);
        for _ in 0..rng.range(1, 4) {
            b.alloc(rng.range(MIB / 4, MIB));
        }
    }
    b.finish(format!("small-after-large-s{seed}"))
}

/// Several streams sharing one device, each running its own layers: the shape of a server that
/// serves requests on separate CUDA streams (the shared traces are all single-stream). Each of
/// 3,000 steps picks one of `streams` streams and runs a layer there: one to six activations of
/// 1 byte up to 0.5, 4, 40 or 200 MiB (chosen per layer), freed in random order at the layer's
/// end; with probability 30 % a cache block of 2 to 64 MiB is kept, and the stream's cache is
/// dropped when it holds more than 8 blocks or, with probability 10 %, at any step. Each stream
/// starts with five small long-lived tensors. Memory freed on one stream is reusable on another
/// only after a synchronization (or, in PyTorch's expandable policy, after everything free was
/// given back), so this is where the policies' pressure paths differ most. Not in [`builtin`]:
/// `--workload multi-stream` (4 streams), `--workload two-streams`, `--workload ten-streams`
/// (the many streams of an inference server).
///
/// Seed 1, 4 streams: 22,783 events, peak live 1.45 GiB; 2 streams: 22,512 events, 1.20 GiB.
pub fn multi_stream(seed: u64, streams: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let mut b = Builder::new();
    let streams = streams.max(1);
    let mut caches: Vec<Vec<u64>> = vec![Vec::new(); streams as usize];
    for s in 0..streams {
        b.stream = s;
        for _ in 0..5 {
            let size = [512, 4096, 64 * 1024, MIB][rng.range(0, 3) as usize];
            b.alloc(size);
        }
    }
    for _ in 0..3000 {
        let s = rng.range(0, streams - 1);
        b.stream = s;
        let max = [MIB / 2, 4 * MIB, 40 * MIB, 200 * MIB][rng.range(0, 3) as usize];
        let mut acts: Vec<u64> = (0..rng.range(1, 6))
            .map(|_| {
                let size = rng.range(1, max);
                b.alloc(size)
            })
            .collect();
        let cache = &mut caches[s as usize];
        if rng.chance(30) {
            cache.push(b.alloc(rng.range(2 * MIB, 64 * MIB)));
        }
        if cache.len() > 8 || (!cache.is_empty() && rng.chance(10)) {
            let dropped = std::mem::take(cache);
            b.free_all(dropped);
        }
        while !acts.is_empty() {
            let i = rng.range(0, acts.len() as u64 - 1) as usize;
            b.free(acts.swap_remove(i));
        }
    }
    let name = match streams {
        4 => format!("multi-stream-s{seed}"),
        2 => format!("two-streams-s{seed}"),
        n => format!("multi-stream-{n}-s{seed}"),
    };
    b.finish(name)
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

/// The default set, seed 1: [`transformer_training`], [`inference_kv_cache`],
/// [`varying_batch`] and [`rmm_random`] with sizes up to 64 MiB over 100,000 steps. Each has
/// between 20k and 200k events and a peak live between 1 and 40 GiB (figures in the module
/// docs).
pub fn builtin() -> Vec<Trace> {
    vec![
        transformer_training(1),
        inference_kv_cache(1),
        varying_batch(1),
        rmm_random(1, 64 * MIB, 100_000),
    ]
}

/// The names [`by_name`] knows, in the order [`builtin`] lists them.
pub const NAMES: [&str; 4] = [
    "transformer-training",
    "inference-kv-cache",
    "varying-batch",
    "rmm-random",
];

/// Workloads [`by_name`] knows beyond [`NAMES`]: each shows one mechanism of the allocators.
pub const MECHANISMS: [&str; 4] = [
    "small-after-large",
    "multi-stream",
    "two-streams",
    "ten-streams",
];

/// Workloads shaped like whole programs of kinds no shared trace has: a training loop calling
/// `empty_cache()` after every step ([`empty_cache_training`]), QLoRA fine-tuning ([`qlora`])
/// and 3-D U-Net training ([`unet3d_training`]).
pub const PROGRAMS: [&str; 3] = ["empty-cache-training", "qlora", "unet3d-training"];

/// Inference servers ([`inference_server`]): requests on 10 (`inference-server`) or 4
/// (`inference-server-4`) streams at once, each growing its own KV cache. Programs too, listed
/// apart because ours does not yet fit every one in as little as PyTorch's expandable policy
/// (README, Results, "Inference servers").
pub const SERVERS: [&str; 2] = ["inference-server", "inference-server-4"];

/// The workload called `name` (one of [`NAMES`], [`MECHANISMS`], [`PROGRAMS`] or [`SERVERS`])
/// with `seed`; `ops` and `max_size` shape
/// [`rmm_random`] and are ignored by the others. `None` for an unknown name.
pub fn by_name(name: &str, seed: u64, ops: u64, max_size: u64) -> Option<Trace> {
    match name {
        "transformer-training" => Some(transformer_training(seed)),
        "inference-kv-cache" => Some(inference_kv_cache(seed)),
        "varying-batch" => Some(varying_batch(seed)),
        "rmm-random" => Some(rmm_random(seed, max_size, ops)),
        "small-after-large" => Some(small_after_large(seed)),
        "multi-stream" => Some(multi_stream(seed, 4)),
        "two-streams" => Some(multi_stream(seed, 2)),
        "ten-streams" => Some(multi_stream(seed, 10)),
        "empty-cache-training" => Some(empty_cache_training(seed)),
        "qlora" => Some(qlora(seed)),
        "unet3d-training" => Some(unet3d_training(seed)),
        "inference-server" => Some(inference_server(seed, 10)),
        "inference-server-4" => Some(inference_server(seed, 4)),
        _ => None,
    }
}
