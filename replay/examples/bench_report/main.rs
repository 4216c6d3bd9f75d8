//! Writes BENCHMARKS.md from the last `cargo bench` run: criterion's medians
//! (`<target>/criterion/**/new/estimates.json`, `median.point_estimate`, with the throughput from
//! `benchmark.json`) and the benches' side outputs (`<target>/bench-extra/*.json`: OOMs and peaks,
//! driver calls, skipped parts). Every figure and every "met"/"missed" comes from those files;
//! the text around them (what each bench measures and how to read it) is written here.
//!
//! Usage: `cargo run --release --example bench_report -- [--target DIR] [--out FILE]
//! [--command TEXT]`. `scripts/benchmarks.sh` runs `cargo bench` and then this.
//! `--target` defaults to `$CARGO_TARGET_DIR`, else `target`; `--out` to `BENCHMARKS.md`.
//! Text of the file being replaced between `<!-- kept: NAME -->` and `<!-- end kept: NAME -->`
//! is put back at the end of its section (`kept.rs`).

mod buffer;
mod data;
mod format;
mod kept;
mod report;
mod tables;
mod verdicts;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use serde_json::Value;

use buffer::*;
use data::*;
use format::*;
use report::*;
use tables::*;
use verdicts::*;

/// Allocators and baselines, in column order; anything else follows in measurement order.
const ORDER: [&str; 6] = [
    "expandable",
    "classic",
    "pytorch-expandable",
    "cudarc-alloc",
    "cuMemAllocAsync",
    "cuMemAlloc",
];

const GIB: f64 = (1u64 << 30) as f64;

const MIB: f64 = (1u64 << 20) as f64;

fn main() -> ExitCode {
    let mut target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let mut out = PathBuf::from("BENCHMARKS.md");
    let mut command = String::from("scripts/benchmarks.sh");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or_else(|| format!("{a} needs {what}"));
        let parsed = match a.as_str() {
            "--target" => value("a directory").map(|v| target = v.into()),
            "--out" => value("a file").map(|v| out = v.into()),
            "--command" => value("the command text").map(|v| command = v),
            _ => Err(format!(
                "unknown argument {a:?}; usage: bench_report [--target DIR] [--out FILE] [--command TEXT]"
            )),
        };
        if let Err(e) = parsed {
            eprintln!("bench_report: {e}");
            return ExitCode::from(2);
        }
    }
    let data = match Data::load(&target) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bench_report: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut text = report(&data, &command, &recorded_machine(&target));
    // Hand-written notes of the file being replaced go back where they were (kept.rs).
    if let Ok(old) = std::fs::read_to_string(&out) {
        match kept::extract(&old) {
            Ok(blocks) => text = kept::restore(&text, &blocks),
            Err(e) => {
                eprintln!("bench_report: {}: {e}", out.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if let Err(e) = std::fs::write(&out, text) {
        eprintln!("bench_report: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let results: usize = data.groups.values().map(HashMap::len).sum();
    println!(
        "bench_report: wrote {} from {results} results in {}",
        out.display(),
        target.join("criterion").display()
    );
    ExitCode::SUCCESS
}
