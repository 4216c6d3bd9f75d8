//! `--check-classic`: is our classic allocator PyTorch's? Replays each snapshot's allocs and frees
//! through it and compares its `cudaMalloc`s with the ones the program's allocator recorded
//! (`vmm_replay::faithfulness`).

use std::path::PathBuf;

use vmm_alloc::units::human_bytes;
use vmm_replay::faithfulness::{check_classic, ClassicCheck};
use vmm_replay::snapshot::analyse_snapshot;

/// Checks every device of every file; the report, and whether every trace matched exactly.
pub fn run(files: &[PathBuf], capacity: usize) -> Result<(String, bool), String> {
    if files.is_empty() {
        return Err(
            "--check-classic needs PyTorch memory snapshots (.pickle) to compare with".into(),
        );
    }
    let mut checks: Vec<ClassicCheck> = Vec::new();
    let mut notes = Vec::new();
    for f in files {
        let file = f.display().to_string();
        let bytes = std::fs::read(f).map_err(|e| format!("{file}: cannot read: {e}"))?;
        if bytes.first() != Some(&0x80) {
            return Err(format!(
                "{file}: --check-classic needs a PyTorch memory snapshot (a pickle)"
            ));
        }
        let name = f.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
        let devices =
            analyse_snapshot(&bytes, name).map_err(|e| format!("{file}: {}", e.message))?;
        for d in devices {
            let conf = d.trace.alloc_conf.as_deref().unwrap_or("");
            if d.trace.events.is_empty() {
                notes.push(format!(
                    "{}: no trace entries (state only): nothing to compare",
                    d.trace.name
                ));
            } else if conf.contains("expandable_segments:True") {
                notes.push(format!(
                    "{}: recorded with expandable segments, not the classic allocator",
                    d.trace.name
                ));
            } else {
                checks.push(check_classic(&d, capacity).map_err(|e| format!("{file}: {e}"))?);
            }
        }
    }
    let mut out = String::from(
        "| trace | start | events | recorded cudaMallocs | replayed | recorded peak reserved | replayed | first divergence |\n|---|---|--:|--:|--:|--:|--:|---|\n",
    );
    for c in &checks {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.name,
            c.start,
            c.events,
            c.recorded.len(),
            c.replayed.len(),
            human_bytes(c.recorded_peak_reserved),
            human_bytes(c.replayed_peak_reserved),
            c.describe()
        ));
    }
    if checks.is_empty() {
        let why: Vec<String> = notes;
        return Err(format!(
            "nothing to check: no trace recorded the classic allocator's alloc/free history ({})",
            why.join("; ")
        ));
    }
    let exact = checks.iter().filter(|c| c.is_exact()).count();
    out.push_str(&format!(
        "\n{exact} of {} traces reproduced exactly (every cudaMalloc size for the same allocation, in order, and the peak reserved)\n",
        checks.len()
    ));
    for n in notes {
        out.push_str(&format!("{n}\n"));
    }
    Ok((out, exact == checks.len()))
}
