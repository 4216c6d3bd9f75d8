//! Inference with growing KV caches: one program serving requests one after another, and a
//! server with requests on many streams at once.

use super::{Builder, Rng};
use crate::{Event, Trace};

/// One request in flight on a stream: its per-layer K and V tensors and how far it has come.
struct InFlight {
    batch: u64,
    len: u64,
    left: u64,
    /// `torch.cat`-style growth (a new, one-token-longer tensor every token) or paged growth
    /// (a new 128-token block when the last is full).
    paged: bool,
    cache: Vec<Vec<u64>>,
    ids: u64,
}

const LAYERS: u64 = 24;
const WIDTH: u64 = 2048;
const FFN: u64 = 5504;
const HEADS: u64 = 16;
const VOCAB: u64 = 32000;
/// fp16.
const ACT: u64 = 2;
const BLOCK: u64 = 128;
const SHAPE: DecoderShape = DecoderShape {
    width: WIDTH,
    ffn: FFN,
    heads: HEADS,
    act: ACT,
};

/// The shape a decoder layer's allocations follow.
#[derive(Clone, Copy)]
pub(super) struct DecoderShape {
    pub(super) width: u64,
    pub(super) ffn: u64,
    pub(super) heads: u64,
    /// Bytes an activation element takes.
    pub(super) act: u64,
}

/// One layer of a prefill over `prompt` tokens with eager attention (the scores and their
/// softmax materialised): the layer's K and V allocated (`Some(block)`: in blocks of that many
/// tokens) and returned with the layer's output, which replaces `x` (freed).
pub(super) fn prefill_layer(
    b: &mut Builder,
    m: DecoderShape,
    batch: u64,
    prompt: u64,
    paged: Option<u64>,
    x: u64,
) -> (u64, Vec<u64>) {
    let (d, f, act) = (m.width, m.ffn, m.act);
    // Per token per layer, K and V each take batch × width × act bytes.
    let kv_token = batch * d * act;
    let normed = b.alloc(batch * prompt * d * act);
    let qkv = b.alloc(3 * batch * prompt * d * act);
    let kv = match paged {
        Some(block) => {
            let blocks = prompt.div_ceil(block);
            (0..2 * blocks).map(|_| b.alloc(block * kv_token)).collect()
        }
        None => vec![b.alloc(prompt * kv_token), b.alloc(prompt * kv_token)],
    };
    let scores = b.alloc(batch * m.heads * prompt * prompt * act);
    let probs = b.alloc(batch * m.heads * prompt * prompt * act);
    b.free(scores);
    let attn = b.alloc(batch * prompt * d * act);
    b.free_all([probs, qkv, normed]);
    let o = b.alloc(batch * prompt * d * act);
    b.free(attn);
    let mid = b.alloc(batch * prompt * d * act);
    b.free_all([o, x]);
    let up = b.alloc(2 * batch * prompt * f * act);
    let gated = b.alloc(batch * prompt * f * act);
    b.free(up);
    let down = b.alloc(batch * prompt * d * act);
    b.free(gated);
    let out = b.alloc(batch * prompt * d * act);
    b.free_all([down, mid]);
    (out, kv)
}

/// One layer of one generated token at sequence length `len`: q/k/v, the layer's K and V one
/// token longer (`torch.cat`: a new tensor each, the old freed; paged, `Some(block)`: two new
/// blocks when the last is full), scores over the cache, attention output and MLP; returns the
/// layer's output, which replaces `x` (freed).
pub(super) fn decode_layer(
    b: &mut Builder,
    m: DecoderShape,
    batch: u64,
    len: u64,
    paged: Option<u64>,
    kv: &mut Vec<u64>,
    x: u64,
) -> u64 {
    let kv_token = batch * m.width * m.act;
    let qkv = b.alloc(3 * batch * m.width * m.act);
    match paged {
        Some(block) => {
            if (len - 1).is_multiple_of(block) {
                kv.push(b.alloc(block * kv_token));
                kv.push(b.alloc(block * kv_token));
            }
        }
        None => {
            for slot in kv.iter_mut() {
                let grown = b.alloc(len * kv_token);
                b.free(*slot);
                *slot = grown;
            }
        }
    }
    let scores = b.alloc(batch * m.heads * len * 4);
    b.free(qkv);
    let attn = b.alloc(batch * m.width * m.act);
    b.free(scores);
    let mlp = b.alloc(2 * batch * m.ffn * m.act);
    b.free(attn);
    let out = b.alloc(batch * m.width * m.act);
    b.free_all([mlp, x]);
    out
}

/// A server generating text for several clients at once, one CUDA stream each: a 1.3B-parameter
/// decoder (24 layers, width 2048, MLP 5504, fp16: 2.38 GiB of weights, allocated first on the
/// default stream and kept) and `streams` streams that each serve one request after another.
/// Every one of 1,200 scheduling steps picks a stream: an idle one starts a request (batch 1,
/// 2, 4 or 8, prompt of 32..=1024 tokens, 16..=128 tokens to generate, `torch.cat` or paged
/// KV growth) with a prefill (eager attention over the prompt); a busy one generates one token
/// (per-layer temporaries, each layer's K and V one token longer), and when its last token is
/// out frees its KV cache. No `empty_cache()`: a server keeps what it has. Memory one stream
/// frees is reusable by another only after a synchronization (or, in PyTorch's expandable
/// policy, after everything free was given back), and every stream's cache grows at its own
/// pace: the shape of the multi-stream inference traces issue 19 reported ours to lose on.
/// `--workload inference-server` (10 streams), `--workload inference-server-4` (4).
///
/// Seed 1, 10 streams: 390,290 events, peak live 8.83 GiB; seeds 1-6 of 10 or 4 streams: 350k
/// to 390k events, peak live 4.2 to 8.9 GiB.
pub fn inference_server(seed: u64, streams: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let streams = streams.max(1);
    let mut b = Builder::new();
    for _ in 0..LAYERS {
        for elems in [
            WIDTH,
            3 * WIDTH * WIDTH,
            WIDTH * WIDTH,
            WIDTH,
            2 * WIDTH * FFN,
            FFN * WIDTH,
        ] {
            b.alloc(ACT * elems);
        }
    }
    for elems in [VOCAB * WIDTH, WIDTH] {
        b.alloc(ACT * elems);
    }
    let mut flights: Vec<Option<InFlight>> = (0..streams).map(|_| None).collect();
    for _ in 0..1200 {
        let s = rng.range(0, streams - 1);
        b.stream = s;
        let slot = &mut flights[s as usize];
        match slot.take() {
            None => *slot = Some(prefill(&mut b, &mut rng)),
            Some(mut f) => {
                decode(&mut b, &mut f);
                if f.left == 0 {
                    b.free(f.ids);
                    b.free_all(f.cache.into_iter().flatten());
                } else {
                    *slot = Some(f);
                }
            }
        }
    }
    for (s, f) in flights.into_iter().enumerate() {
        if let Some(f) = f {
            b.stream = s as u64;
            b.free(f.ids);
            b.free_all(f.cache.into_iter().flatten());
        }
    }
    let name = match streams {
        10 => format!("inference-server-s{seed}"),
        n => format!("inference-server-{n}-s{seed}"),
    };
    b.finish(name)
}

/// A request's prefill: eager attention over the whole prompt, the KV cache allocated.
fn prefill(b: &mut Builder, rng: &mut Rng) -> InFlight {
    let batch = 1 << rng.range(0, 3);
    let prompt = rng.range(32, 1024);
    let left = rng.range(16, 128);
    let paged = rng.chance(50);
    let ids = b.alloc(batch * prompt * 8);
    let mut cache = Vec::new();
    let mut x = b.alloc(batch * prompt * WIDTH * ACT);
    for _ in 0..LAYERS {
        let (out, kv) = prefill_layer(b, SHAPE, batch, prompt, paged.then_some(BLOCK), x);
        cache.push(kv);
        x = out;
    }
    let logits = b.alloc(batch * VOCAB * 4);
    b.free_all([logits, x]);
    InFlight {
        batch,
        len: prompt,
        left,
        paged,
        cache,
        ids,
    }
}

/// One generated token: per-layer temporaries, each layer's K and V one token longer.
fn decode(b: &mut Builder, f: &mut InFlight) {
    let batch = f.batch;
    f.len += 1;
    let len = f.len;
    let mut x = b.alloc(batch * WIDTH * ACT);
    let block = f.paged.then_some(BLOCK);
    for kv in f.cache.iter_mut() {
        x = decode_layer(b, SHAPE, batch, len, block, kv, x);
    }
    let logits = b.alloc(batch * VOCAB * 4);
    b.free_all([logits, x]);
    let longer = b.alloc(batch * len * 8);
    b.free(f.ids);
    f.ids = longer;
    f.left -= 1;
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
        let shape = DecoderShape {
            width: d,
            ffn: f,
            heads: h,
            act,
        };
        for _ in 0..layers {
            let (out, kv) = prefill_layer(&mut b, shape, batch, prompt, paged.then_some(block), x);
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
                x = decode_layer(&mut b, shape, batch, len, paged.then_some(block), kv, x);
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
