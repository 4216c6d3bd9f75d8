//! `vmm-replay`: would this allocator have saved my run? Replays allocation traces recorded by
//! real programs (PyTorch memory snapshots, RMM logs, our own format) or built-in workloads
//! against each allocator on the Sim backend, and reports how much memory each needed.

mod args;
mod load;
mod plot;
mod report;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use vmm_alloc::trace::replay::{min_capacity, replay, Policy, ReplayOptions};
use vmm_alloc::trace::{native, workloads, Trace};

use args::Args;
use report::{AllocatorReport, TraceReport};

/// The step of the `--min-capacity` bisection: the Sim backend's granularity.
const CAPACITY_STEP: usize = 2 << 20;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vmm-replay: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let policies = policies(&args.allocators)?;
    let capacity = usize::try_from(args.capacity)
        .map_err(|_| "--capacity does not fit this machine's address size".to_string())?;
    if let Some(path) = &args.plot {
        plot::check_path(path)?;
    }
    let traces = read_traces(args)?;
    let opts = ReplayOptions {
        capacity,
        replay_empty_cache: !args.no_empty_cache,
        use_trace_settings: !args.ignore_trace_settings,
        ..ReplayOptions::default()
    };
    let bar = progress((traces.len() * policies.len()) as u64);
    let mut reports = Vec::new();
    for trace in traces {
        let mut outcomes = Vec::new();
        for &policy in &policies {
            bar.set_message(format!("{} / {}", trace.name, policy.name()));
            let failed = |e: &dyn std::fmt::Display| {
                format!(
                    "{}: replay through {} failed: {e}",
                    trace.name,
                    policy.name()
                )
            };
            let outcome = replay(&trace, policy, &opts).map_err(|e| failed(&e))?;
            let at_min = if args.min_capacity {
                let upper = (outcome.peak_reserved_bytes as usize).max(capacity);
                Some(
                    min_capacity(&trace, policy, &opts, upper, CAPACITY_STEP)
                        .map_err(|e| failed(&e))?,
                )
            } else {
                None
            };
            outcomes.push(AllocatorReport { outcome, at_min });
            bar.inc(1);
        }
        reports.push(TraceReport { trace, outcomes });
    }
    bar.finish_and_clear();
    if let Some(path) = &args.plot {
        for r in &reports {
            let outcomes: Vec<_> = r.outcomes.iter().map(|a| &a.outcome).collect();
            plot::draw(
                &plot::path_for(path, &r.trace.name, reports.len() > 1),
                &r.trace.name,
                &outcomes,
            )?;
        }
    }
    if args.json {
        let text = serde_json::to_string_pretty(&report::json(&reports))
            .map_err(|e| format!("cannot write JSON: {e}"))?;
        println!("{text}");
    } else {
        print!("{}", report::table(&reports));
    }
    Ok(())
}

fn policies(names: &[String]) -> Result<Vec<Policy>, String> {
    names
        .iter()
        .map(|n| {
            Policy::from_name(n.trim()).ok_or_else(|| {
                let known: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown allocator {n:?}: expected one of {}",
                    known.join(", ")
                )
            })
        })
        .collect()
}

fn read_traces(args: &Args) -> Result<Vec<Trace>, String> {
    let mut traces = Vec::new();
    for f in &args.files {
        traces.extend(load::load(f).map_err(|e| e.to_string())?);
    }
    for name in &args.workload {
        let trace = workloads::by_name(name, args.seed, args.ops, args.max_size);
        traces.push(trace.ok_or_else(|| {
            format!(
                "unknown workload {name:?}: expected one of {}",
                workloads::NAMES.join(", ")
            )
        })?);
    }
    if traces.is_empty() {
        for name in workloads::NAMES {
            traces.extend(workloads::by_name(name, args.seed, args.ops, args.max_size));
        }
    }
    if let Some(out) = &args.write_trace {
        let [single] = traces.as_slice() else {
            return Err(format!(
                "--write-trace takes exactly one trace, {} were read",
                traces.len()
            ));
        };
        native::write_native_file(out, single).map_err(|e| e.to_string())?;
    }
    Ok(traces)
}

/// A bar on stderr counting replays, only when a person is watching.
fn progress(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} replays {msg}") {
        bar.set_style(style);
    }
    bar
}
