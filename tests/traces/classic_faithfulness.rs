//! The classic allocator against what PyTorch's own allocator did, on every shared snapshot
//! (`vmm_alloc::trace::faithfulness`): the same `segment_alloc` sizes for the same allocations,
//! in order, and the same peak reserved. `vmm-replay --check-classic FILES` prints the report;
//! so does `cargo test --release --test traces classic_faithfulness -- --nocapture`.

use std::path::{Path, PathBuf};

use vmm_alloc::trace::faithfulness::check_classic;
use vmm_alloc::trace::snapshot::analyse_snapshot;

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
}
