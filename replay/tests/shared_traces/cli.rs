//! `vmm-replay` on every shared snapshot, as a user runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

use libtest_mimic::{Completion, Failed};

use crate::{Shared, SharedTest};

/// The tests of this file.
pub const TESTS: &[(&str, SharedTest)] = &[
    ("cli::every_file_replays", every_file_replays),
    (
        "cli::check_classic_reproduces_all_23",
        check_classic_reproduces_all_23,
    ),
    (
        "cli::advise_gives_every_configuration_a_min_capacity",
        advise_gives_every_configuration_a_min_capacity,
    ),
];

/// Runs `vmm-replay` with `args`; an error naming them when it does not succeed.
fn vmm_replay(args: &[&str]) -> Result<Output, Failed> {
    let o = Command::new(env!("CARGO_BIN_EXE_vmm-replay"))
        .args(args)
        .output()
        .map_err(|e| format!("vmm-replay does not run: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "vmm-replay {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    Ok(o)
}

fn every_file_replays(shared: &Shared) -> Result<Completion, Failed> {
    let mut files: Vec<PathBuf> = shared.pickles("traces/pytorch")?;
    files.extend(shared.pickles("traces/pytorch/state-only")?);
    files.sort();
    let mut args = vec!["--json"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let o = vmm_replay(&args)?;
    let report: serde_json::Value =
        serde_json::from_slice(&o.stdout).map_err(|e| format!("--json prints JSON: {e}"))?;
    let traces = report["traces"].as_array().unwrap();
    // One row per file, and one per device of the two-GPU state-only snapshot.
    assert_eq!(traces.len(), files.len() + 1, "{files:?}");
    for t in traces {
        for a in t["allocators"].as_array().unwrap() {
            assert_eq!(a["ooms"], 0, "{}: fits on 80 GiB", t["trace"]);
            let (live, reserved) = (
                a["peak_live_bytes"].as_u64(),
                a["peak_reserved_bytes"].as_u64(),
            );
            assert!(live > Some(0) && reserved >= live, "{t}");
        }
    }
    Ok(Completion::Completed)
}

fn check_classic_reproduces_all_23(shared: &Shared) -> Result<Completion, Failed> {
    let files: Vec<String> = shared
        .pickles("traces/pytorch")?
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut args = vec!["--check-classic"];
    args.extend(files.iter().map(String::as_str));
    let out = String::from_utf8_lossy(&vmm_replay(&args)?.stdout).into_owned();
    assert!(out.contains("23 of 23 traces reproduced exactly"), "{out}");
    Ok(Completion::Completed)
}

/// `advise` on a device smaller than any configuration needs: every row still says how much it
/// would need. Ours with fine pages near the device's end decides by the device's size, and did
/// not fit on a device of exactly the peak it reached unconstrained, where the bisection began:
/// its row said "-".
fn advise_gives_every_configuration_a_min_capacity(shared: &Shared) -> Result<Completion, Failed> {
    let trace = shared.path("traces/pytorch/cs336-medium-ctx128-train.pickle");
    let o = vmm_replay(&[
        "advise",
        trace.to_str().unwrap(),
        "--capacity",
        "6700MiB",
        "--json",
    ])?;
    let report: serde_json::Value =
        serde_json::from_slice(&o.stdout).map_err(|e| format!("--json prints JSON: {e}"))?;
    let rows = report["configurations"].as_array().unwrap();
    assert!(rows.iter().any(
        |c| c["configuration"] == "vmm-alloc (ours) fine_pages_above:0.85" && c["fits"] == false
    ));
    for c in rows {
        let min = c["min_capacity_bytes"].as_u64();
        let live = c["peak_live_bytes"].as_u64().unwrap();
        assert!(
            min.is_some_and(|m| m > 6700 << 20 && m >= live),
            "{}: min capacity {min:?}",
            c["configuration"]
        );
    }
    Ok(Completion::Completed)
}
