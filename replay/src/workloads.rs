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
//! kinds no shared trace records (`empty_cache()` every step, QLoRA, 3-D U-Net training,
//! mixture-of-experts training) and
//! [`SERVERS`] inference servers with one stream per request in flight.

use crate::{Event, Trace};

mod inference;
mod moe;
mod programs;
mod synthetic;
mod training;

pub use inference::{inference_kv_cache, inference_server};
pub use moe::moe_training;
pub use programs::{qlora, unet3d_training};
pub use synthetic::{multi_stream, rmm_random, small_after_large};
pub use training::{empty_cache_training, transformer_training, varying_batch};

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
        Trace::from_events(name, self.events)
    }
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
pub const MECHANISMS: [&str; 5] = [
    "small-after-large",
    "multi-stream",
    "two-streams",
    "ten-streams",
    "thirty-two-streams",
];

/// Workloads shaped like whole programs of kinds no shared trace has: a training loop calling
/// `empty_cache()` after every step ([`empty_cache_training`]), QLoRA fine-tuning ([`qlora`])
/// 3-D U-Net training ([`unet3d_training`]) and mixture-of-experts training
/// ([`moe_training`]).
pub const PROGRAMS: [&str; 4] = [
    "empty-cache-training",
    "qlora",
    "unet3d-training",
    "moe-training",
];

/// Inference servers ([`inference_server`]): requests on 10 (`inference-server`), 4
/// (`inference-server-4`) or 32 (`inference-server-32`) streams at once, each growing its own KV
/// cache. Programs too, listed apart because ours does not yet fit every one in as little as
/// PyTorch's expandable policy (POLICY.md, "Inference servers").
pub const SERVERS: [&str; 3] = [
    "inference-server",
    "inference-server-4",
    "inference-server-32",
];

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
        "thirty-two-streams" => Some(multi_stream(seed, 32)),
        "empty-cache-training" => Some(empty_cache_training(seed)),
        "qlora" => Some(qlora(seed)),
        "unet3d-training" => Some(unet3d_training(seed)),
        "moe-training" => Some(moe_training(seed)),
        "inference-server" => Some(inference_server(seed, 10)),
        "inference-server-4" => Some(inference_server(seed, 4)),
        "inference-server-32" => Some(inference_server(seed, 32)),
        _ => None,
    }
}
