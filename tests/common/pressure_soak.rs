//! A seeded multi-stream workload that keeps an `ExpandableAllocator` under memory pressure,
//! with real bytes: every block is filled with a value (one of twelve) and incremented in its
//! stream's order, and what every block holds is checked before it is freed (about half of
//! them) and at checkpoints (the blocks kept across steps). Shared by the Host run in
//! `tests/all` (CI: the mappings that remaps, parked pages, alias rescues and their rescue
//! space make are the right physical pages) and the GPU run in `tests/cuda_pressure.rs` (the
//! same on the driver, with kernels in flight on other streams while their freed memory is
//! remapped: a synchronization missed shows as a block whose value a stale kernel changed).

use std::collections::HashMap;

use vmm_alloc::backend::{Backend, StreamId};
use vmm_alloc::{Allocation, Allocator, DevAddr, ExpandableAllocator, MemoryStats};

const MIB: usize = 1 << 20;

/// How the soak writes, increments and reads blocks on one kind of device.
pub trait Device {
    /// Sets every byte of the `floats` f32 at `at` to `byte`, in `stream`'s order (a memset:
    /// what a GPU does without a kernel of its own).
    fn fill(&self, at: DevAddr, floats: usize, byte: u8, stream: StreamId);
    /// Adds 1.0 to each of them, in `stream`'s order (asynchronously where the device can).
    fn bump(&self, at: DevAddr, floats: usize, stream: StreamId);
    /// `n` f32 from `at`, once `stream`'s work queued so far is done.
    fn read(&self, at: DevAddr, n: usize, stream: StreamId) -> Vec<f32>;
}

/// What a soak did: requests served and refused, blocks checked, and the allocator's counters
/// at the end (before everything was freed).
#[derive(Debug)]
pub struct SoakReport {
    pub served: usize,
    pub out_of_memory: usize,
    pub checked: usize,
    pub stats: MemoryStats,
}

impl SoakReport {
    /// Fails unless the run was what it is meant to be: the budget filled (requests refused),
    /// most requests served anyway, pages remapped, partly used pages mapped twice (alias
    /// rescues), and hundreds of blocks checked.
    pub fn assert_pressured(&self) {
        let s = &self.stats;
        assert!(self.out_of_memory > 0, "the budget filled: {self:?}");
        assert!(self.served > 5 * self.out_of_memory, "{self:?}");
        assert!(s.remapped_bytes > 0, "pages were remapped: {s:?}");
        assert!(
            s.alias_rescues > 0,
            "partly used pages were mapped twice: {s:?}"
        );
        assert!(self.checked > 400, "{self:?}");
    }
}

/// SplitMix64, as the replay workloads use.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// A live block and what it must hold.
struct Held {
    alloc: Allocation,
    stream: StreamId,
    floats: usize,
    expect: f32,
}

/// Checks the first and last 16 Ki floats of `h` (all of a smaller block, read once).
fn check<D: Device>(d: &D, h: &Held, what: &str) -> Result<(), String> {
    let n = h.floats.min(16 << 10);
    let at = h.alloc.ptr();
    let mut parts = vec![("head", at)];
    if h.floats > n {
        parts.push(("tail", DevAddr::new(at.get() + ((h.floats - n) * 4) as u64)));
    }
    for (place, from) in parts {
        let got = d.read(from, n, h.stream);
        if let Some(i) = got.iter().position(|&x| x != h.expect) {
            return Err(format!(
                "{what} block at {at:?} ({} bytes, {:?}): its {place}'s float {i} is {}, not {}",
                h.floats * 4,
                h.stream,
                got[i],
                h.expect
            ));
        }
    }
    Ok(())
}

/// Runs `steps` steps on `streams`: each picks a stream and runs a "layer" there, one to four
/// activations of up to `max_mib` MiB (filled, incremented twice, freed at the layer's end in
/// a random order, about half checked first), and with probability 30 % one block of 2 to 16
/// MiB kept across steps (the stream's cache, dropped when it holds more than six or at
/// random). Refused requests are counted and skipped. Every 25 steps every kept block is
/// checked; at the end every block is freed, the cache emptied, and the backend must hold
/// nothing.
pub fn soak<B: Backend, D: Device>(
    a: &ExpandableAllocator<B>,
    d: &D,
    streams: &[StreamId],
    seed: u64,
    steps: usize,
    max_mib: usize,
) -> Result<SoakReport, String> {
    let mut rng = Rng(seed ^ 0x50a6);
    let mut kept: HashMap<StreamId, Vec<Held>> = HashMap::new();
    let (mut served, mut refused, mut checked, mut next_value) = (0, 0, 0, 0u32);
    let mut allocate = |rng: &mut Rng, bytes: usize, stream: StreamId| -> Option<Held> {
        match a.allocate(bytes, stream) {
            Ok(alloc) => {
                served += 1;
                // Bytes 0x38..=0x43 four times over are normal floats from 4e-5 to 195.
                next_value = (next_value + 1) % 12;
                let byte = 0x38 + next_value as u8;
                let floats = bytes / 4;
                d.fill(alloc.ptr(), floats, byte, stream);
                let mut expect = f32::from_bits(u32::from_ne_bytes([byte; 4]));
                for _ in 0..1 + rng.below(2) {
                    d.bump(alloc.ptr(), floats, stream);
                    expect += 1.0;
                }
                Some(Held {
                    alloc,
                    stream,
                    floats,
                    expect,
                })
            }
            Err(e) if e.is_out_of_memory() => {
                refused += 1;
                None
            }
            Err(e) => panic!("allocate({bytes}) failed: {e}"),
        }
    };
    for step in 0..steps {
        let stream = streams[rng.below(streams.len() as u64) as usize];
        let mut acts: Vec<Held> = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let bytes = (1 + rng.below((max_mib * MIB / 4) as u64) as usize) * 4;
            acts.extend(allocate(&mut rng, bytes, stream));
        }
        if rng.below(100) < 30 {
            let bytes = (2 * MIB / 4 + rng.below((14 * MIB / 4) as u64) as usize) * 4;
            if let Some(h) = allocate(&mut rng, bytes, stream) {
                kept.entry(stream).or_default().push(h);
            }
        }
        let cache = kept.entry(stream).or_default();
        if cache.len() > 6 || (!cache.is_empty() && rng.below(100) < 10) {
            for h in std::mem::take(cache) {
                check(d, &h, "a kept")?;
                checked += 1;
                a.deallocate(h.alloc).map_err(|e| e.to_string())?;
            }
        }
        while !acts.is_empty() {
            let h = acts.swap_remove(rng.below(acts.len() as u64) as usize);
            if rng.below(2) == 0 {
                check(d, &h, "an activation")?;
                checked += 1;
            }
            // No synchronization here: the allocator must wait for the stream's kernels before
            // anyone else's block lands on this memory.
            a.deallocate(h.alloc).map_err(|e| e.to_string())?;
        }
        if step % 25 == 24 {
            for h in kept.values().flatten() {
                check(d, h, "a kept")?;
                checked += 1;
            }
            a.check_invariants().map_err(|e| e.to_string())?;
        }
    }
    let stats = a.stats();
    for h in kept.into_values().flatten() {
        check(d, &h, "a kept")?;
        checked += 1;
        a.deallocate(h.alloc).map_err(|e| e.to_string())?;
    }
    a.empty_cache().map_err(|e| e.to_string())?;
    a.check_invariants().map_err(|e| e.to_string())?;
    let live = a.with_backend(|b| b.live());
    if live.mappings != 0 || live.handles != 0 || live.reservations != 0 {
        return Err(format!(
            "the backend still holds {live:?} after empty_cache"
        ));
    }
    Ok(SoakReport {
        served,
        out_of_memory: refused,
        checked,
        stats,
    })
}
