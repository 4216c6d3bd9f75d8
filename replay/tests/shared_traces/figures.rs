//! Every real snapshot in `../shared/traces/pytorch` against the independent reader
//! `../shared/tools/trace_summary.py --json`: per device, peak live, recorded peak reserved and
//! start state must be equal; release runs of known files; the decode time of the largest.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use libtest_mimic::{Completion, Failed};
use vmm_replay::pickle;
use vmm_replay::snapshot::{analyse_snapshot, ReleaseRuns};
use vmm_replay::Event;

use crate::json::{self, Json};
use crate::{Shared, SharedTest};

/// The tests of this file.
pub const TESTS: &[(&str, SharedTest)] = &[
    ("figures::match_trace_summary", figures_match_trace_summary),
    (
        "figures::release_runs_of_known_files",
        release_runs_of_known_files,
    ),
    (
        "figures::state_only_snapshots_read",
        state_only_snapshots_read,
    ),
    (
        "figures::decode_time_of_largest_file",
        decode_time_of_largest_file,
    ),
];

fn stem(p: &Path) -> String {
    p.file_stem().unwrap().to_string_lossy().into_owned()
}

fn figures_match_trace_summary(shared: &Shared) -> Result<Completion, Failed> {
    let files = shared.pickles("traces/pytorch")?;
    let tool = match shared.trace_summary()? {
        Ok(tool) => tool,
        Err(ignored) => return Ok(ignored),
    };
    let out = Command::new("python3")
        .arg(&tool)
        .arg("--json")
        .args(&files)
        .output()
        .map_err(|e| format!("python3 {}: {e}", tool.display()))?;
    assert!(
        out.status.success(),
        "trace_summary.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = json::parse(&String::from_utf8_lossy(&out.stdout)).expect("trace_summary JSON");
    let results = summary.as_arr();
    assert_eq!(results.len(), files.len());

    eprintln!(
        "{:<34} {:>6} {:>14} {:>14} {:>14} {:>14} {:>10} {:>4} {:>4} {:>6} {:>7} {:>4}",
        "file",
        "events",
        "peak live",
        "(summary)",
        "peak reserved",
        "(summary)",
        "start",
        "skip",
        "EC",
        "retry",
        "partial",
        "oom"
    );
    let mut mismatches = Vec::new();
    for (file, res) in files.iter().zip(results) {
        let name = stem(file);
        assert_eq!(res.get("error"), None, "{name}: trace_summary error");
        let bytes = std::fs::read(file).unwrap();
        let mut ours = analyse_snapshot(&bytes, &name).unwrap_or_else(|e| panic!("{e}"));
        // Devices with segments and no entries are compared by the state-only test.
        ours.retain(|d| !d.trace.events.is_empty());
        let devices: Vec<&Json> = res
            .get("devices")
            .map(Json::as_arr)
            .unwrap_or(&[])
            .iter()
            .filter(|d| d.get("events").and_then(Json::as_u64).unwrap_or(0) > 0)
            .collect();
        assert_eq!(ours.len(), devices.len(), "{name}: devices with events");
        for (d, mine) in devices.iter().zip(&ours) {
            let dev = d.get("device").and_then(Json::as_u64).unwrap();
            assert_eq!(mine.device, dev, "{name}");
            let t = &mine.trace;
            let num = |k: &str| d.get(k).and_then(Json::as_u64);
            let live = t.peak_live_bytes();
            let reserved = t.recorded.map(|r| r.peak_reserved_bytes);
            let state = d.get("start_state").and_then(Json::as_str).unwrap_or("?");
            let ec = t.events.iter().filter(|e| **e == Event::EmptyCache).count();
            eprintln!(
                "{:<34} {:>6} {:>14} {:>14} {:>14} {:>14} {:>10} {:>4} {:>4} {:>6} {:>7} {:>4}",
                t.name,
                num("events").unwrap_or(0),
                live,
                num("peak_live_total").unwrap_or(0),
                reserved.unwrap_or(0),
                num("peak_reserved").unwrap_or(0),
                t.start.to_string(),
                t.skipped_frees,
                ec,
                mine.release_runs.alloc_retry,
                mine.release_runs.partial,
                mine.release_runs.before_oom
            );
            let mut check = |what: &str, ok: bool| {
                if !ok {
                    mismatches.push(format!("{}: {what}", t.name));
                }
            };
            check("peak live", Some(live) == num("peak_live_total"));
            if let Some(pr) = num("peak_reserved") {
                check("peak reserved", reserved == Some(pr));
            }
            check("start state", t.start.to_string() == state);
            let allocs = t
                .events
                .iter()
                .filter(|e| matches!(e, Event::Alloc { .. }))
                .count();
            check("allocs", Some(allocs as u64) == num("n_alloc"));
            let before = num("preexisting_blocks").unwrap_or(0) + num("orphan_frees").unwrap_or(0);
            check("initial blocks", t.initial.len() as u64 == before);
            let actions = d.get("actions");
            let count = |a: &str| {
                actions
                    .and_then(|x| x.get(a))
                    .and_then(Json::as_u64)
                    .unwrap_or(0)
            };
            let r = t.recorded.unwrap_or_default();
            check(
                "segment counts",
                r.segment_allocs == count("segment_alloc") + count("segment_map")
                    && r.segment_frees == count("segment_free") + count("segment_unmap"),
            );
            check(
                "alloc_conf parses",
                t.alloc_conf
                    .as_deref()
                    .is_none_or(|c| vmm_alloc::config::parse_alloc_conf(c).is_ok()),
            );
        }
    }
    assert!(
        mismatches.is_empty(),
        "differences from trace_summary: {mismatches:#?}"
    );
    Ok(Completion::Completed)
}

fn release_runs_of_known_files(shared: &Shared) -> Result<Completion, Failed> {
    let dir = shared.path("traces/pytorch");
    // From the README and the frames: two CS336 runs start with empty_cache(); nca2d-peso event
    // 2045 and nca3d-cholec event 2077 are malloc's release-and-retry; nca3d-cholec also calls
    // empty_cache() at its start.
    let retry = |n| ReleaseRuns {
        empty_cache: 0,
        alloc_retry: n,
        partial: 0,
        before_oom: 0,
    };
    for (name, expected) in [
        (
            "cs336-2.7b-ctx512-forward-bf16",
            ReleaseRuns {
                empty_cache: 1,
                ..retry(0)
            },
        ),
        (
            "cs336-2.7b-forward-compiled",
            ReleaseRuns {
                empty_cache: 1,
                ..retry(0)
            },
        ),
        ("nca2d-peso-inference", retry(1)),
        (
            "nca3d-cholec-inference",
            ReleaseRuns {
                empty_cache: 1,
                ..retry(1)
            },
        ),
        ("cs336-2.7b-ctx128-fullstep", retry(0)),
    ] {
        let path = dir.join(format!("{name}.pickle"));
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let d = analyse_snapshot(&bytes, name).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].release_runs, expected, "{name}");
        let ec = d[0]
            .trace
            .events
            .iter()
            .filter(|e| **e == Event::EmptyCache)
            .count();
        assert_eq!(ec as u64, expected.empty_cache, "{name}");
    }
    Ok(Completion::Completed)
}

fn state_only_snapshots_read(shared: &Shared) -> Result<Completion, Failed> {
    let files = shared.pickles("traces/pytorch/state-only")?;
    let tool = match shared.trace_summary()? {
        Ok(tool) => tool,
        Err(ignored) => return Ok(ignored),
    };
    let o = Command::new("python3")
        .arg(&tool)
        .arg("--json")
        .args(&files)
        .output()
        .map_err(|e| format!("python3 {}: {e}", tool.display()))?;
    if !o.status.success() {
        return Err(format!(
            "trace_summary.py failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    let summary = json::parse(&String::from_utf8_lossy(&o.stdout)).expect("trace_summary JSON");
    for (i, f) in files.iter().enumerate() {
        let bytes = std::fs::read(f).unwrap();
        let ours = analyse_snapshot(&bytes, &stem(f)).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !ours.is_empty(),
            "{}: every device with segments replays",
            stem(f)
        );
        for d in &ours {
            let t = &d.trace;
            assert!(t.events.is_empty(), "{}: no events", t.name);
            assert!(
                !t.initial.is_empty(),
                "{}: the blocks live at the dump",
                t.name
            );
            let theirs = summary
                .as_arr()
                .get(i)
                .unwrap_or_else(|| panic!("{}: not in trace_summary's output", t.name));
            let dev = theirs
                .get("devices")
                .map(Json::as_arr)
                .unwrap_or(&[])
                .iter()
                .find(|x| x.get("device").and_then(Json::as_u64) == Some(d.device))
                .unwrap_or_else(|| panic!("{}: device {} not in trace_summary", t.name, d.device));
            let num = |k: &str| dev.get(k).and_then(Json::as_u64);
            assert_eq!(
                Some(t.peak_live_bytes()),
                num("peak_live_total"),
                "{}",
                t.name
            );
            let reserved = t.recorded.map(|r| r.peak_reserved_bytes);
            assert_eq!(reserved, num("peak_reserved"), "{}", t.name);
        }
    }
    Ok(Completion::Completed)
}

fn decode_time_of_largest_file(shared: &Shared) -> Result<Completion, Failed> {
    let files = shared.pickles("traces/pytorch")?;
    let largest = files
        .iter()
        .max_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .expect("pickles() returns at least one file");
    let bytes = std::fs::read(largest).unwrap();
    // Best of 3 (the first run also pays for faulting in fresh heap pages).
    let (mut decode, mut whole) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let t0 = Instant::now();
        let v = pickle::parse(&bytes).unwrap();
        decode = decode.min(t0.elapsed().as_secs_f64() * 1e3);
        assert!(v.get("device_traces").is_some());
        drop(v);
        let t1 = Instant::now();
        let traces = analyse_snapshot(&bytes, "largest").unwrap();
        whole = whole.min(t1.elapsed().as_secs_f64() * 1e3);
        assert!(!traces.is_empty());
    }
    eprintln!(
        "{} ({} bytes): pickle decode {decode:.1} ms, decode + snapshot conversion {whole:.1} ms \
         (best of 3; the decode figure excludes dropping the values)",
        largest.display(),
        bytes.len(),
    );
    Ok(Completion::Completed)
}
