//! Replays dumped as PyTorch memory snapshots, read by the independent
//! `shared/tools/trace_summary.py`: the same figures as the replay's.

use std::path::Path;
use std::process::Command;

use libtest_mimic::{Completion, Failed};
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::{workloads, Event};

use crate::json::{self, Json};
use crate::pressure::{pressure, tight_capacity};
use crate::{Shared, SharedTest};

/// The tests of this file.
pub const TESTS: &[(&str, SharedTest)] = &[(
    "dump_summary::trace_summary_reads_the_dump_with_our_figures",
    trace_summary_reads_the_dump_with_our_figures,
)];

fn trace_summary_reads_the_dump_with_our_figures(shared: &Shared) -> Result<Completion, Failed> {
    let tool = match shared.trace_summary()? {
        Ok(tool) => tool,
        Err(ignored) => return Ok(ignored),
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let pressured = tight_capacity(&pressure());
    let cases = [
        (pressure(), pressured),
        (pressure(), 48 << 20),
        (workloads::transformer_training(1), 80 << 30),
    ];
    for (t, cap) in cases {
        for policy in Policy::EXPANDABLE {
            let what = format!("{} at {cap} / {}", t.name, policy.name());
            // tests/traces/dump.rs checks that our reader reads these dumps back.
            let opts = ReplayOptions {
                capacity: cap,
                record_history: true,
                ..ReplayOptions::default()
            };
            let outcome = replay(&t, policy, &opts).unwrap();
            let dump = outcome.history.as_ref().unwrap();
            let bytes = dump.to_pickle().unwrap();
            let file = dir.join(format!("dump-{}-{cap}-{}.pickle", t.name, policy.name()));
            std::fs::write(&file, &bytes).unwrap();
            let out = Command::new("python3")
                .arg(&tool)
                .arg("--json")
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let summary = json::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
            let res = &summary.as_arr()[0];
            assert_eq!(res.get("error"), None, "{what}");
            assert_eq!(
                res.get("expandable_segments"),
                Some(&Json::Bool(true)),
                "{what}"
            );
            let devices = res.get("devices").map(Json::as_arr).unwrap();
            assert_eq!(devices.len(), 1, "{what}");
            let d = &devices[0];
            let num = |k: &str| d.get(k).and_then(Json::as_u64);
            assert_eq!(
                d.get("start_state").and_then(Json::as_str),
                Some("empty"),
                "{what}"
            );
            assert_eq!(
                num("peak_live_total"),
                Some(outcome.peak_live_bytes),
                "{what}"
            );
            assert_eq!(num("peak_reserved"), Some(dump.peak_mapped_bytes), "{what}");
            assert_eq!(num("trace_live_not_in_dump"), Some(0), "{what}");
            let allocs = t
                .events
                .iter()
                .filter(|e| matches!(e, Event::Alloc { .. }))
                .count();
            assert_eq!(num("n_alloc"), Some(allocs as u64 - outcome.ooms), "{what}");
            let ooms = d.get("oom").map(Json::as_arr).unwrap_or(&[]);
            assert_eq!(ooms.len() as u64, outcome.ooms, "{what}: oom entries");
        }
    }
    Ok(Completion::Completed)
}
