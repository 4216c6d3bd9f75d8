//! The classic allocator against what PyTorch's own allocator did, on every shared snapshot
//! (`vmm_replay::faithfulness`): the same `segment_alloc` sizes for the same allocations,
//! in order, and the same peak reserved. `vmm-replay --check-classic FILES` prints the report;
//! so does `cargo test --release --test shared_traces classic -- --nocapture`.

use libtest_mimic::{Completion, Failed};
use vmm_replay::faithfulness::check_classic;
use vmm_replay::snapshot::analyse_snapshot;

use crate::{Shared, SharedTest};

/// The tests of this file.
pub const TESTS: &[(&str, SharedTest)] = &[(
    "classic::reproduces_recorded_segments",
    reproduces_recorded_segments,
)];

fn reproduces_recorded_segments(shared: &Shared) -> Result<Completion, Failed> {
    let files = shared.pickles("traces/pytorch")?;
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
            let c = check_classic(&d, 80 << 30).unwrap();
            eprintln!(
                "{:<32} {:>10} {:>6} {:>9} {:>9} {:>12} {:>12}  {}",
                c.name,
                c.start.to_string(),
                c.events,
                c.recorded.len(),
                c.replayed.len(),
                c.recorded_peak_reserved,
                c.replayed_peak_reserved,
                c.describe()
            );
            checked += 1;
            assert!(c.is_exact(), "{}: {}", c.name, c.describe());
        }
    }
    assert_eq!(checked, 23, "every shared trace with events is checked");
    Ok(Completion::Completed)
}
