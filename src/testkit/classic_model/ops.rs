//! The operations of the classic state machine, their strategies, and the loop that applies them
//! to `ClassicAllocator` on Sim and to the model, checking everything after each step.

use crate::backend::{Backend, PhysHandle, SimBackend, SimConfig};
use crate::classic::ClassicAllocator;
use crate::config::AllocConf;
use crate::snapshot::{BlockState, SegmentInfo, Snapshot};
use crate::stats::PoolKind;
use crate::testkit::EmulatedBackend;
use crate::{AllocError, Allocator, DevAddr, MemoryStats, StreamId};
use proptest::prelude::*;

use super::reference::{best_fit, free_blocks, no_overlap, pool_of, Model, Rules};
use crate::testkit::pytorch_rounding::{round_size, SMALL_SIZE};

const STREAMS: u64 = 3;
const MB: usize = 1 << 20;

/// An input the allocator must refuse without changing anything.
#[derive(Clone, Copy, Debug)]
pub enum Bad {
    /// `deallocate_ptr` of an address no allocation ever had.
    FreeForeign,
    /// `record_stream` of an address no allocation ever had.
    RecordForeign,
    /// `deallocate_ptr` of an address inside a live allocation.
    FreeInterior,
    /// `record_stream` of an address inside a live allocation.
    RecordInterior,
    /// The allocation freed last, freed again.
    FreeAgain,
    /// `allocate(0)`.
    ZeroBytes,
    /// `allocate(usize::MAX)`.
    MaxBytes,
}

/// One step. Picks count back from the latest live allocation, modulo the live count: they
/// shrink to 0, the latest, and keep their target when an earlier allocation is deleted.
#[derive(Clone, Debug)]
pub enum Op {
    /// `allocate(size)` on a stream; the model predicts where it lands, or that it fails.
    Alloc {
        /// Requested bytes.
        size: usize,
        /// Stream number (0, 1 or 2).
        stream: u64,
    },
    /// `deallocate_ptr` of a live allocation.
    Free {
        /// Which allocation: the pick-th latest, modulo the live count.
        pick: usize,
    },
    /// `record_stream` of a live allocation on another stream.
    Record {
        /// Which allocation: the pick-th latest, modulo the live count.
        pick: usize,
        /// Stream number (0, 1 or 2).
        stream: u64,
    },
    /// Holds a stream (its work keeps running: events recorded on it stay pending) or releases
    /// it (its work completes).
    Stream {
        /// Stream number (0, 1 or 2).
        stream: u64,
        /// Hold (true) or release (false).
        hold: bool,
    },
    /// `empty_cache`.
    EmptyCache,
    /// Another user of the device takes `Some(mb)` MiB (then the device, not the fraction,
    /// says OOM), or gives its latest piece back.
    Squeeze {
        /// MiB taken, or `None` to give the latest piece back.
        mb: Option<usize>,
    },
    /// An input the allocator must refuse, changing nothing.
    Invalid {
        /// Which one.
        bad: Bad,
        /// The allocation it concerns, as in [`Op::Free`].
        pick: usize,
    },
}

impl Op {
    /// The pick of an op that names a live allocation.
    pub fn pick_mut(&mut self) -> Option<&mut usize> {
        match self {
            Op::Free { pick } | Op::Record { pick, .. } | Op::Invalid { pick, .. } => Some(pick),
            _ => None,
        }
    }
}

/// Sizes across the small pool, the large pool below 10 MiB (shared 20 MiB segments) and above
/// (a segment each), with a few 512-byte blocks (remainders of exactly 512 bytes), the
/// boundaries and one request no device holds.
fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => 1usize..=4096,
        4 => 1usize..=SMALL_SIZE,
        3 => (SMALL_SIZE + 1)..(10 * MB),
        2 => (10 * MB)..(48 * MB),
        1 => prop::sample::select(vec![
            512,
            SMALL_SIZE,
            SMALL_SIZE + 1,
            10 * MB - 1,
            10 * MB,
            19 * MB,
            20 * MB,
            40 * MB,
            1 << 40,
        ]),
    ]
}

/// Random operations, weighted towards allocating and freeing, with sizes across both pools
/// and the oversize range.
pub fn op_strategy() -> impl Strategy<Value = Op> {
    use Bad::*;
    let bad = prop::sample::select(vec![
        FreeForeign,
        RecordForeign,
        FreeInterior,
        RecordInterior,
        FreeAgain,
        ZeroBytes,
        MaxBytes,
    ]);
    let streams = 0..STREAMS;
    prop_oneof![
        10 => (size_strategy(), streams.clone()).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => (0usize..64).prop_map(|pick| Op::Free { pick }),
        3 => (0usize..64, streams.clone()).prop_map(|(pick, stream)| Op::Record { pick, stream }),
        3 => (streams, prop::bool::weighted(0.6)).prop_map(|(stream, hold)| Op::Stream { stream, hold }),
        1 => Just(Op::EmptyCache),
        2 => prop::option::of(1usize..40).prop_map(|mb| Op::Squeeze { mb }),
        1 => (bad, 0usize..64).prop_map(|(bad, pick)| Op::Invalid { bad, pick }),
    ]
}

/// `PYTORCH_CUDA_ALLOC_CONF` strings in PyTorch's grammar: none, `max_split_size_mb` (≥ the
/// 20 MiB segment), `roundup_power2_divisions` (one value or per interval), a memory fraction,
/// and a garbage collection threshold with it.
pub fn conf_strategy() -> impl Strategy<Value = String> {
    let max_split = prop::option::of(prop::sample::select(vec![20usize, 24, 32, 40]));
    let roundup = prop::option::of(prop::sample::select(vec![
        "4",
        "[1:2,4:4,16:8,>:1]",
        "[2:8,>:2]",
    ]));
    let gc = prop::option::of(prop::sample::select(vec![0.4f64, 0.7]));
    let fraction = prop::option::of((prop::sample::select(vec![0.3f64, 0.5, 0.8]), gc));
    (max_split, roundup, fraction).prop_map(|(max_split, roundup, fraction)| {
        let mut parts = Vec::new();
        if let Some(mb) = max_split {
            parts.push(format!("max_split_size_mb:{mb}"));
        }
        if let Some(r) = roundup {
            parts.push(format!("roundup_power2_divisions:{r}"));
        }
        if let Some((f, gc)) = fraction {
            parts.push(format!("per_process_memory_fraction:{f}"));
            if let Some(t) = gc {
                parts.push(format!("garbage_collection_threshold:{t}"));
            }
        }
        parts.join(",")
    })
}

/// What a sequence reached: a test can tell that its sequences reach the states worth testing
/// (the crate's `classic_sequences_reach_the_interesting_states`).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Reached {
    /// The allocator's stats at the end, before teardown.
    pub stats: MemoryStats,
    /// Frees left pending on a held stream.
    pub pending_held: u64,
    /// Allocations that could not reuse a block because its free was pending.
    pub blocked_reuse: u64,
    /// Frees that merged a block with a free neighbour.
    pub merges: u64,
    /// Allocations served from the cache.
    pub cached: u64,
    /// Allocations served by a new segment.
    pub fresh: u64,
    /// Most oversize allocations live at once.
    pub oversize: u64,
    /// Segments freed inside a `malloc` that did not retry by the garbage collector (threshold
    /// set, no `max_split_size`).
    pub gc_frees: u64,
    /// Segments freed inside a `malloc` that did not retry by `release_available_cached_blocks`
    /// (`max_split_size` set, no threshold).
    pub oversize_frees: u64,
}

/// The index in `live` (oldest first) of the pick-th latest allocation.
fn latest(pick: usize, len: usize) -> usize {
    len.saturating_sub(1 + pick % len.max(1))
}

fn fail(step: usize, e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("step {step}: {e}"))
}

/// The allocator under test, with what the loop needs beside it.
struct Rig {
    backend: SimBackend,
    alloc: ClassicAllocator<SimBackend>,
    conf: AllocConf,
    rules: Rules,
    /// `allowed_memory_maximum`, when a fraction is set.
    allowed: Option<u64>,
    model: Model,
    held: Vec<StreamId>,
    taken: Vec<PhysHandle>,
    last_freed: Option<DevAddr>,
    /// The snapshot after the last step: the state the next operation starts from.
    snap: Snapshot,
    reached: Reached,
}

/// Runs `ops`, then tears down: with `free_all`, frees everything and empties the cache first;
/// without, drops the allocator with its live and pending blocks.
pub fn run(
    conf: &str,
    capacity_mb: usize,
    ops: &[Op],
    free_all: bool,
) -> Result<Reached, TestCaseError> {
    let backend = SimBackend::with_config(SimConfig {
        capacity: capacity_mb * MB,
        ..SimConfig::default()
    })
    .map_err(|e| fail(0, e))?;
    let alloc = ClassicAllocator::with_alloc_conf(backend.clone(), conf).map_err(|e| fail(0, e))?;
    let conf = alloc.alloc_conf();
    let fraction = conf.per_process_memory_fraction;
    let mut rig = Rig {
        rules: Rules::new(&conf),
        allowed: (fraction < 1.0).then_some(((capacity_mb * MB) as f64 * fraction) as u64),
        conf,
        alloc,
        backend,
        model: Model::default(),
        held: Vec::new(),
        taken: Vec::new(),
        last_freed: None,
        snap: Snapshot::default(),
        reached: Reached::default(),
    };
    for (step, op) in ops.iter().enumerate() {
        rig.apply(op).map_err(|e| fail(step, e))?;
        rig.check().map_err(|e| fail(step, e))?;
        rig.alloc.check_invariants().map_err(|e| fail(step, e))?;
    }
    rig.teardown(free_all).map_err(|e| fail(ops.len(), e))
}

impl Rig {
    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Alloc { size, stream } => self.allocate(size, StreamId::sim(stream))?,
            Op::Free { pick } => {
                if self.model.live.is_empty() {
                    return Ok(());
                }
                let l = self.model.live.remove(latest(pick, self.model.live.len()));
                let (at, size, pending) = (l.alloc.ptr(), l.alloc.size(), !l.uses.is_empty());
                self.alloc.deallocate_ptr(at).map_err(|e| e.to_string())?;
                self.last_freed = Some(at);
                let gen = |s| self.backend.stream_generation(s);
                self.model.freed(l, &self.held, gen);
                if !pending {
                    // Merged with a free neighbour: the free block holding it is larger.
                    let merged = free_blocks(&self.alloc.snapshot(), &[])
                        .iter()
                        .any(|f| f.2 <= at.get() && at.get() < f.2 + f.3 as u64 && f.3 > size);
                    self.model.merges += merged as u64;
                }
            }
            Op::Record { pick, stream } => {
                if self.model.live.is_empty() {
                    return Ok(());
                }
                let i = latest(pick, self.model.live.len());
                let (s, l) = (StreamId::sim(stream), &mut self.model.live[i]);
                self.alloc
                    .record_stream(l.alloc.ptr(), s)
                    .map_err(|e| e.to_string())?;
                if s != l.alloc.stream() && !l.uses.contains(&s) {
                    l.uses.push(s);
                }
            }
            Op::Stream { stream, hold } => {
                let s = StreamId::sim(stream);
                self.held.retain(|&h| h != s);
                if hold {
                    self.backend.hold_stream(s);
                    self.held.push(s);
                } else {
                    self.backend.release_stream(s);
                }
            }
            Op::EmptyCache => {
                self.alloc.empty_cache().map_err(|e| e.to_string())?;
                self.model.process_all();
                let snap = self.alloc.snapshot();
                let whole_and_free = |s: &&SegmentInfo| {
                    s.blocks.len() == 1 && s.blocks[0].state == BlockState::Inactive
                };
                if let Some(s) = snap.segments.iter().find(whole_and_free) {
                    return Err(format!("empty_cache kept the free segment {:?}", s.address));
                }
            }
            Op::Squeeze { mb: Some(mb) } => {
                match self.backend.create((mb * MB).next_multiple_of(2 * MB)) {
                    Ok(h) => self.taken.push(h),
                    Err(e) if e.is_out_of_memory() => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            Op::Squeeze { mb: None } => {
                if let Some(h) = self.taken.pop() {
                    self.backend.release(h).map_err(|e| e.to_string())?;
                }
            }
            Op::Invalid { bad, pick } => self.refused(bad, pick)?,
        }
        Ok(())
    }

    /// One `malloc`, checked against the placement the model predicts from the state before it:
    /// the best-fitting free block of the stream and pool (pending blocks whose events completed
    /// included), subject to the oversize rules; else a new segment of `get_allocation_size`.
    fn allocate(&mut self, size: usize, stream: StreamId) -> Result<(), String> {
        let gens: Vec<u64> = (0..STREAMS)
            .map(|s| self.backend.stream_generation(StreamId::sim(s)))
            .collect();
        let before = self.alloc.stats();
        let result = self.alloc.allocate(size, stream);
        let after = self.alloc.stats();
        let done = self.model.process(|s| gens[s.raw() as usize]);
        let retried = after.num_alloc_retries > before.num_alloc_retries;
        if retried {
            self.model.process_all();
        }
        let rounded = round_size(size, &self.conf.roundup_power2_divisions);
        let pool = pool_of(rounded);
        let free = free_blocks(&self.snap, &done);
        let cached =
            best_fit(&free, stream, pool, rounded).filter(|f| self.rules.may_serve(f.3, rounded));
        let new_segments = after.num_device_alloc - before.num_device_alloc;
        let a = match (result, cached) {
            (Err(e), None) if e.is_out_of_memory() => {
                if after.num_ooms != before.num_ooms + 1 || new_segments != 0 {
                    return Err(format!("an OOM counted {after:?}"));
                }
                return Ok(());
            }
            (Err(e), _) => return Err(format!("allocate({size}) on {stream:?}: {e}")),
            (Ok(a), Some((_, _, at, len))) => {
                let want = (at, self.rules.usable(pool, len, rounded));
                if (a.ptr().get(), a.size()) != want || new_segments != 0 || retried {
                    return Err(format!(
                        "allocate({size} → {rounded}) on {stream:?} gave {a:?}, not the cached block {at:#x}+{len:#x} as {want:x?}"
                    ));
                }
                if after.num_device_free != before.num_device_free {
                    return Err("a segment was freed although a cached block fitted".into());
                }
                self.reached.cached += 1;
                a
            }
            (Ok(a), None) => {
                self.collected(&before, &after, &done)?;
                let seg_len = self.rules.segment_size(rounded);
                let snap = self.alloc.snapshot();
                let seg = snap
                    .segments
                    .iter()
                    .find(|s| s.address == a.ptr())
                    .map(|s| s.total_size);
                let want = self.rules.usable(pool, seg_len, rounded);
                if new_segments != 1 || seg != Some(seg_len) || a.size() != want {
                    return Err(format!(
                        "allocate({size} → {rounded}) on {stream:?} gave {a:?} in a segment of {seg:x?}, not the first {want:#x} of a new {seg_len:#x} segment ({new_segments} new)"
                    ));
                }
                let frees = after.num_device_free - before.num_device_free;
                if !retried && self.conf.max_split_size.is_none() {
                    self.reached.gc_frees += frees;
                }
                if !retried && self.conf.garbage_collection_threshold == 0.0 {
                    self.reached.oversize_frees += frees;
                }
                self.reached.fresh += 1;
                a
            }
        };
        if self.last_freed == Some(a.ptr()) {
            self.last_freed = None;
        }
        self.model.allocated(a, pool)
    }

    /// With a garbage collection threshold, a `malloc` that found no cached block while the
    /// segments exceed the threshold frees at least one whole free large segment (the oldest is
    /// always at least as old as the average) when there is one.
    fn collected(
        &self,
        before: &MemoryStats,
        after: &MemoryStats,
        done: &[u64],
    ) -> Result<(), String> {
        let (Some(allowed), t) = (self.allowed, self.conf.garbage_collection_threshold) else {
            return Ok(());
        };
        let threshold = (t * allowed as f64) as u64;
        let whole_free = |s: &&SegmentInfo| {
            s.pool == PoolKind::Large
                && s.blocks.iter().all(|b| {
                    b.state == BlockState::Inactive
                        || (b.state == BlockState::ActivePendingFree
                            && done.contains(&b.address.get()))
                })
        };
        let over = t > 0.0 && before.reserved_bytes.all.current > threshold;
        if over
            && self.snap.segments.iter().any(|s| whole_free(&s))
            && after.num_device_free == before.num_device_free
        {
            return Err(format!(
                "above the collection threshold ({threshold} bytes) with free segments cached, nothing was collected"
            ));
        }
        Ok(())
    }

    /// A bad input gives an error of the right kind and changes nothing: stats (call counts
    /// too) and snapshot are equal before and after.
    fn refused(&mut self, bad: Bad, pick: usize) -> Result<(), String> {
        let (alloc, live) = (&self.alloc, &self.model.live);
        let stats = alloc.stats();
        let foreign = DevAddr::new(0x1234_5600);
        let interior = live.get(latest(pick, live.len())).map(|l| {
            let a = &l.alloc;
            DevAddr::new(a.ptr().get() + (a.size() / 2).max(1) as u64)
        });
        let result = match (bad, interior) {
            (Bad::FreeForeign, _) => alloc.deallocate_ptr(foreign),
            (Bad::RecordForeign, _) => alloc.record_stream(foreign, StreamId::sim(1)),
            (Bad::FreeInterior, Some(p)) => alloc.deallocate_ptr(p),
            (Bad::RecordInterior, Some(p)) => alloc.record_stream(p, StreamId::sim(2)),
            (Bad::FreeInterior | Bad::RecordInterior, None) => return Ok(()),
            (Bad::FreeAgain, _) => {
                let Some(p) = self.last_freed else {
                    return Ok(());
                };
                // A pointer that still starts a free (or pending) block is a double free; one
                // merged into the block before it is just not a block any more.
                let starts_free = self
                    .snap
                    .segments
                    .iter()
                    .flat_map(|s| &s.blocks)
                    .any(|b| b.address == p && b.state != BlockState::ActiveAllocated);
                match alloc.deallocate_ptr(p) {
                    Err(AllocError::DoubleFree(_)) if starts_free => Err(AllocError::DoubleFree(p)),
                    Err(AllocError::InvalidPointer(_)) if !starts_free => {
                        Err(AllocError::InvalidPointer(p))
                    }
                    other => return Err(format!("double free of {p:?} gave {other:?}")),
                }
            }
            (Bad::ZeroBytes, _) => alloc.allocate(0, StreamId::DEFAULT).map(drop),
            (Bad::MaxBytes, _) => alloc.allocate(usize::MAX, StreamId::DEFAULT).map(drop),
        };
        match (bad, &result) {
            (_, Ok(())) => return Err(format!("{bad:?} was accepted")),
            (Bad::ZeroBytes, Err(AllocError::InvalidSize { .. }))
            | (Bad::MaxBytes, Err(AllocError::TooLarge { .. }))
            | (Bad::FreeAgain, Err(_))
            | (_, Err(AllocError::InvalidPointer(_))) => {}
            (_, Err(e)) => return Err(format!("{bad:?} gave {e:?}")),
        }
        if alloc.stats() != stats || alloc.snapshot() != self.snap {
            return Err(format!("{bad:?} changed the allocator's state"));
        }
        Ok(())
    }

    /// Everything after a step: stats and snapshot against the model, the backend's own view.
    fn check(&mut self) -> Result<(), String> {
        let (stats, snap) = (self.alloc.stats(), self.alloc.snapshot());
        self.model.check_stats(&stats)?;
        let oversize = self.alloc.oversize();
        self.model
            .check_snapshot(&stats, &snap, &self.rules, oversize)?;
        no_overlap(&self.model.live)?;
        let live = self.backend.live();
        let segments = snap.segments.len();
        let held = (live.mapped_bytes as u64, live.mappings, live.reservations);
        let want = (stats.reserved_bytes.all.current, segments, segments);
        if held != want || live.handles != segments + self.taken.len() {
            return Err(format!(
                "the backend holds {live}, the allocator {want:?} (reserved, segments) and {} taken",
                self.taken.len()
            ));
        }
        if live.events != self.model.outstanding_events() {
            return Err(format!(
                "{} events live, the model expects {}",
                live.events,
                self.model.outstanding_events()
            ));
        }
        if let Some(max) = self.allowed {
            if stats.reserved_bytes.all.current > max {
                return Err(format!(
                    "reserved {} above the allowed {max}",
                    stats.reserved_bytes.all.current
                ));
            }
        }
        self.reached.oversize = self.reached.oversize.max(oversize.0);
        self.snap = snap;
        Ok(())
    }

    /// Frees everything and empties the cache (`free_all`), then drops the allocator: the
    /// backend holds nothing.
    fn teardown(mut self, free_all: bool) -> Result<Reached, String> {
        let mut reached = std::mem::take(&mut self.reached);
        reached.stats = self.alloc.stats();
        reached.pending_held = self.model.pending_held;
        reached.blocked_reuse = self.model.blocked_reuse;
        reached.merges = self.model.merges;
        for h in self.taken.drain(..) {
            self.backend.release(h).map_err(|e| e.to_string())?;
        }
        if free_all {
            for l in self.model.live.drain(..) {
                self.alloc.deallocate(l.alloc).map_err(|e| e.to_string())?;
            }
            self.alloc.empty_cache().map_err(|e| e.to_string())?;
            let s = self.alloc.stats();
            let left = [
                &s.reserved_bytes,
                &s.allocated_bytes,
                &s.active_bytes,
                &s.requested_bytes,
                &s.inactive_split_bytes,
                &s.segment,
            ];
            if left.iter().any(|a| a.all.current != 0) || !self.alloc.snapshot().segments.is_empty()
            {
                return Err(format!("after freeing all and empty_cache: {s:?}"));
            }
        }
        let backend = self.backend.clone();
        drop(self);
        let left = backend.live();
        if !left.is_empty() {
            return Err(format!("leaked after teardown: {left}"));
        }
        Ok(reached)
    }
}
