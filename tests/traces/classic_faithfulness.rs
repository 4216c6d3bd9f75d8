//! The classic allocator against what PyTorch's own allocator did: every shared snapshot
//! recorded, besides each tensor's alloc and free, every `segment_alloc` (cudaMalloc) of the
//! program's allocator. Replaying the allocs and frees through [`ClassicAllocator`] with the
//! trace's settings must reproduce them: the same sizes for the same allocations, in order.
//!
//! Not yet done (so only traces that start empty must match exactly; the others are reported):
//! rebuilding the *cached* segments of a warm start from the dump (the reader rebuilds the live
//! blocks only), and replaying the allocator's own release-and-retry runs in place.
//! `cargo test --release --test traces classic_faithfulness -- --nocapture` prints the report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::trace::replay::Policy;
use vmm_alloc::trace::snapshot::{analyse_snapshot, DeviceTrace};
use vmm_alloc::trace::Event;
use vmm_alloc::{Allocation, Allocator, StreamId};

/// What the replay did: its device allocations as (allocation ordinal, size) counted from the
/// first traced allocation, and its peak reserved bytes from there on.
fn replay_classic(d: &DeviceTrace) -> (Vec<(u64, u64)>, u64) {
    let t = &d.trace;
    let sim = SimBackend::with_config(SimConfig {
        capacity: 80 << 30,
        ..SimConfig::default()
    })
    .unwrap();
    let alloc = ClassicAllocator::new(sim, Policy::alloc_conf(t.alloc_conf.as_deref())).unwrap();
    let mut live: HashMap<u64, Allocation> = HashMap::new();
    let requested: HashMap<u64, u64> = t.initial.iter().map(|b| (b.id, b.size)).collect();
    for seg in &d.start_segments {
        let blocks: Vec<_> = seg
            .blocks
            .iter()
            .map(|b| {
                (
                    b.offset as usize,
                    b.size as usize,
                    requested[&b.id] as usize,
                )
            })
            .collect();
        let stream = StreamId::sim(seg.stream);
        let placed = alloc
            .seed_segment(seg.size as usize, stream, seg.small, &blocks)
            .unwrap_or_else(|e| panic!("{}: seeding a {} B segment: {e}", t.name, seg.size));
        for (b, a) in seg.blocks.iter().zip(placed) {
            live.insert(b.id, a);
        }
    }
    // Blocks in no rebuilt segment (none in the shared traces) are allocated as usual.
    for b in &t.initial {
        if let std::collections::hash_map::Entry::Vacant(slot) = live.entry(b.id) {
            slot.insert(
                alloc
                    .allocate(b.size as usize, StreamId::sim(b.stream))
                    .unwrap(),
            );
        }
    }
    alloc.log_segments();
    let mut allocs = 0u64;
    let mut retries = d.retry_runs.iter().peekable();
    for e in &t.events {
        match *e {
            Event::Alloc { id, size, stream } => {
                while retries.next_if(|&&r| r == allocs).is_some() {
                    alloc.empty_cache().unwrap();
                }
                if allocs == 0 {
                    // The recorded peak counts from the first allocation: a trace may first
                    // empty a previous run's cache.
                    alloc.reset_peak_stats();
                }
                allocs += 1;
                let a = alloc
                    .allocate(size as usize, StreamId::sim(stream))
                    .unwrap();
                live.insert(id, a);
            }
            Event::Free { id } => {
                if let Some(a) = live.remove(&id) {
                    alloc.deallocate(a).unwrap();
                }
            }
            Event::EmptyCache => alloc.empty_cache().unwrap(),
        }
    }
    let log = alloc
        .segment_log()
        .into_iter()
        .map(|(n, size)| (n, size as u64))
        .collect();
    (log, alloc.stats().reserved_bytes.all.peak)
}

fn traces_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/pytorch");
    dir.is_dir().then_some(dir)
}

#[test]
fn requires_shared_traces_classic_reproduces_recorded_segments() {
    let Some(dir) = traces_dir() else {
        eprintln!("SKIPPED: ../shared/traces not found");
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    eprintln!(
        "{:<32} {:>10} {:>6} {:>9} {:>9} {:>12} {:>12}  first divergence",
        "trace", "start", "events", "recorded", "replayed", "peak rec.", "peak ours"
    );
    let mut checked = 0;
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        for d in analyse_snapshot(&bytes, &stem).unwrap() {
            let t = &d.trace;
            if t.events.is_empty() {
                continue;
            }
            let recorded: Vec<(u64, u64)> = d
                .segment_allocs
                .iter()
                .map(|s| (s.allocs_before, s.size))
                .collect();
            let (ours, peak) = replay_classic(&d);
            let divergence = recorded
                .iter()
                .zip(&ours)
                .position(|(a, b)| a != b)
                .or_else(|| (recorded.len() != ours.len()).then(|| recorded.len().min(ours.len())));
            let what = match divergence {
                None => "none".to_string(),
                Some(i) => format!(
                    "segment {i}: recorded {:?}, replayed {:?} (allocation ordinal, bytes)",
                    recorded.get(i),
                    ours.get(i)
                ),
            };
            let recorded_peak = t.recorded.map_or(0, |r| r.peak_reserved_bytes);
            eprintln!(
                "{:<32} {:>10} {:>6} {:>9} {:>9} {:>12} {:>12}  {what}",
                t.name,
                t.start.to_string(),
                t.events.len(),
                recorded.len(),
                ours.len(),
                recorded_peak,
                peak
            );
            checked += 1;
            assert_eq!(divergence, None, "{}: {what}", t.name);
            assert_eq!(peak, recorded_peak, "{}: peak reserved", t.name);
        }
    }
    assert_eq!(checked, 23, "every shared trace with events is checked");
}
