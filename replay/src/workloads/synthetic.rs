//! Synthetic shapes, each showing one mechanism: RMM's random allocations, small tensors after
//! large ones, several streams sharing a device.

use super::{Builder, Rng, MIB};
use crate::Trace;

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
/// pool that never borrows needs new pages for the last small tensors. Not in [`builtin`](super::builtin):
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
/// given back), so this is where the policies' pressure paths differ most. Not in [`builtin`](super::builtin):
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
