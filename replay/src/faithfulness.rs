//! Is [`ClassicAllocator`] PyTorch's allocator? A PyTorch memory snapshot records, besides each
//! tensor's alloc and free, every `segment_alloc` (`cudaMalloc`) the program's own allocator
//! made. Replaying the allocs and frees through the port, with the trace's
//! `PYTORCH_CUDA_ALLOC_CONF`, must reproduce them: the same sizes for the same allocations, in
//! order, and the same peak reserved bytes.
//!
//! The replay starts where the program's allocator was (reference `pytorch-allocator.md` §8):
//! its segments when recording began, rebuilt from the dump with their live blocks placed and the
//! rest cached ([`DeviceTrace::start_segments`]). A call that recorded a new segment runs through
//! [`ClassicAllocator::allocate_as_recorded`]: the frees since the previous call complete after
//! its search failed (some were pending cross-stream frees that PyTorch completed only inside
//! that call), and where it released segments first ([`DeviceTrace::retry_runs`]: the recording
//! GPU was full there, the simulated one is not) the port's own release chain runs until as many
//! are gone. Addresses are the simulator's, not the trace's.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::replay::Policy;
use crate::snapshot::DeviceTrace;
use crate::{Event, StartState};
use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::classic::{ClassicAllocator, SeedBlock};
use vmm_alloc::error::AllocError;
use vmm_alloc::{Allocation, Allocator, StreamId};

/// The comparison for one device trace.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClassicCheck {
    /// The trace.
    pub name: String,
    /// How its recording began.
    pub start: StartState,
    /// Alloc and free events replayed.
    pub events: usize,
    /// The recorded `segment_alloc`s as (allocation ordinal, bytes).
    pub recorded: Vec<(u64, u64)>,
    /// The port's device allocations, the same way.
    pub replayed: Vec<(u64, u64)>,
    /// The recorded peak reserved bytes (from the first allocation on).
    pub recorded_peak_reserved: u64,
    /// The port's.
    pub replayed_peak_reserved: u64,
}

impl ClassicCheck {
    /// The index of the first segment allocation that differs, if any.
    pub fn divergence(&self) -> Option<usize> {
        let (r, o) = (&self.recorded, &self.replayed);
        r.iter()
            .zip(o)
            .position(|(a, b)| a != b)
            .or_else(|| (r.len() != o.len()).then(|| r.len().min(o.len())))
    }

    /// Same segment allocations and the same peak reserved.
    pub fn is_exact(&self) -> bool {
        self.divergence().is_none() && self.recorded_peak_reserved == self.replayed_peak_reserved
    }

    /// What differs first, in words.
    pub fn describe(&self) -> String {
        match self.divergence() {
            Some(i) => format!(
                "segment {i}: recorded {}, replayed {}",
                show(self.recorded.get(i)),
                show(self.replayed.get(i))
            ),
            None if !self.is_exact() => "peak reserved differs".into(),
            None => "none".into(),
        }
    }
}

fn show(s: Option<&(u64, u64)>) -> String {
    s.map_or("nothing".into(), |(n, b)| {
        format!("{b} B for allocation {n}")
    })
}

/// Replays `d` through the classic allocator on a simulated device of `capacity` bytes and
/// compares its device allocations with the recorded ones.
pub fn check_classic(d: &DeviceTrace, capacity: usize) -> Result<ClassicCheck, AllocError> {
    let t = &d.trace;
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        ..SimConfig::default()
    })?;
    let alloc = ClassicAllocator::new(sim, Policy::alloc_conf(t.alloc_conf.as_deref()))?;
    let mut live: HashMap<u64, Allocation> = HashMap::new();
    let requested: HashMap<u64, u64> = t.initial.iter().map(|b| (b.id, b.size)).collect();
    for seg in &d.start_segments {
        let blocks: Vec<_> = seg
            .blocks
            .iter()
            .map(|b| {
                let asked = requested.get(&b.id).copied().unwrap_or(b.size);
                SeedBlock::new(b.offset as usize, b.size as usize, asked as usize)
            })
            .collect();
        let stream = StreamId::sim(seg.stream);
        let placed = alloc.seed_segment(seg.size as usize, stream, seg.small, &blocks)?;
        for (b, a) in seg.blocks.iter().zip(placed) {
            live.insert(b.id, a);
        }
    }
    // Blocks in no rebuilt segment (none in the shared traces) are allocated as usual.
    for b in &t.initial {
        if let Entry::Vacant(slot) = live.entry(b.id) {
            slot.insert(alloc.allocate(b.size as usize, StreamId::sim(b.stream))?);
        }
    }
    alloc.log_segments();
    let mut allocs = 0u64;
    let mut retries = d.retry_runs.iter().peekable();
    let mut fresh_segments = d.segment_allocs.iter().map(|s| s.allocs_before).peekable();
    // Frees since the previous call: a call that recorded a new segment completes them after
    // its search (Note [Recorded mallocs] in the classic allocator).
    let mut since: Vec<u64> = Vec::new();
    let flush = |since: &mut Vec<u64>, live: &mut HashMap<u64, Allocation>| {
        since
            .drain(..)
            .try_for_each(|id| live.remove(&id).map_or(Ok(()), |a| alloc.deallocate(a)))
    };
    for e in &t.events {
        match *e {
            Event::Alloc { id, size, stream } => {
                let mut released = 0;
                while let Some(r) = retries.next_if(|r| r.allocs_before == allocs) {
                    released += r.segments;
                }
                let mut fresh = false;
                while fresh_segments.next_if(|&n| n == allocs).is_some() {
                    fresh = true;
                }
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                let stream = StreamId::sim(stream);
                let a = if allocs > 0 && (fresh || released > 0) {
                    let frees = since.drain(..).filter_map(|id| live.remove(&id)).collect();
                    let released = usize::try_from(released).unwrap_or(usize::MAX);
                    alloc.allocate_as_recorded(size, stream, frees, released)?
                } else {
                    flush(&mut since, &mut live)?;
                    if released > 0 {
                        alloc.empty_cache()?;
                    }
                    if allocs == 0 {
                        // The recorded peak counts from the first allocation: a trace may
                        // first empty a previous run's cache.
                        alloc.reset_peak_stats();
                    }
                    alloc.allocate(size, stream)?
                };
                allocs += 1;
                live.insert(id, a);
            }
            Event::Free { id } => since.push(id),
            Event::EmptyCache => {
                flush(&mut since, &mut live)?;
                alloc.empty_cache()?;
            }
            // The recorded allocator released its cache before failing (§1.9); the run of
            // segment frees before the `oom` entry is that release.
            Event::FailedAlloc { .. } => {
                flush(&mut since, &mut live)?;
                alloc.empty_cache()?;
            }
        }
    }
    flush(&mut since, &mut live)?;
    Ok(ClassicCheck {
        name: t.name.clone(),
        start: t.start,
        events: t.events.len(),
        recorded: d
            .segment_allocs
            .iter()
            .map(|s| (s.allocs_before, s.size))
            .collect(),
        replayed: alloc
            .segment_log()
            .into_iter()
            .map(|(n, size)| (n, size as u64))
            .collect(),
        recorded_peak_reserved: t.recorded.map_or(0, |r| r.peak_reserved_bytes),
        replayed_peak_reserved: alloc.stats().reserved_bytes.all.peak,
    })
}
