//! `vmm-replay`: would this allocator have saved my run? Replays allocation traces recorded by
//! real programs (PyTorch memory snapshots, RMM logs, our own format) or built-in workloads
//! against each allocator on the Sim backend, and reports how much memory each needed.

mod advise;
mod args;
mod check;
mod html;
mod load;
mod plot;
mod report;

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use vmm_replay::replay::{
    min_capacity, replay_with_progress, Policy, ReplayOptions, ReplayOutcome,
};
use vmm_replay::{native, workloads, Trace};

use args::Args;
use report::{AllocatorReport, TraceReport};

/// The step of the `--min-capacity` bisection: the Sim backend's granularity.
const CAPACITY_STEP: usize = 2 << 20;

fn main() -> ExitCode {
    let result = if std::env::args_os().nth(1).is_some_and(|a| a == "advise") {
        let name = std::ffi::OsString::from("vmm-replay advise");
        let args = advise::AdviseArgs::parse_from(
            std::iter::once(name).chain(std::env::args_os().skip(2)),
        );
        advise::run(&args)
    } else {
        run(&Args::parse())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vmm-replay: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    if args.check_classic {
        let capacity = usize::try_from(args.capacity).unwrap_or(usize::MAX);
        let (report, exact) = check::run(&args.files, capacity)?;
        print!("{report}");
        return if exact {
            Ok(())
        } else {
            Err("the classic allocator diverged from the recorded one (see the table)".into())
        };
    }
    let configs = configurations(&args.allocators, &args.conf)?;
    let policies: Vec<Policy> = configs.iter().map(|c| c.0).collect();
    let dumped = dumped_policy(args, &policies)?;
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
    let several = traces.len() > 1;
    let total: u64 = traces.iter().map(events).sum::<u64>() * configs.len() as u64;
    let bar = progress(total);
    let mut reports = Vec::new();
    for trace in traces {
        let mut outcomes = Vec::new();
        let mut dumped_once = false;
        for (policy, settings) in &configs {
            let policy = *policy;
            bar.set_message(format!("{} / {}", trace.name, policy.name()));
            let failed = |e: &dyn std::fmt::Display| {
                format!(
                    "{}: replay through {} failed: {e}",
                    trace.name,
                    policy.name()
                )
            };
            let record_history = dumped == Some(policy) && !dumped_once;
            dumped_once |= record_history;
            let opts = ReplayOptions {
                record_history,
                settings: settings.clone(),
                ..opts.clone()
            };
            let base = bar.position();
            let mut outcome = replay_with_progress(&trace, policy, &opts, &mut |done| {
                bar.set_position(base + done)
            })
            .map_err(|e| failed(&e))?;
            if let (Some(path), Some(history)) = (&args.dump_snapshot, outcome.history.take()) {
                let path = with_trace_name(path, &trace.name, several);
                let bytes = history.to_pickle().map_err(|e| failed(&e))?;
                std::fs::write(&path, bytes)
                    .map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
            }
            let at_min = if args.min_capacity {
                bar.set_message(format!("{} / {}: min capacity", trace.name, policy.name()));
                let upper = (outcome.peak_reserved_bytes as usize).max(capacity);
                Some(
                    min_capacity(&trace, policy, &opts, upper, CAPACITY_STEP)
                        .map_err(|e| failed(&e))?,
                )
            } else {
                None
            };
            outcomes.push(AllocatorReport { outcome, at_min });
        }
        reports.push(TraceReport { trace, outcomes });
    }
    bar.finish_and_clear();
    if let Some(path) = &args.plot {
        for r in &reports {
            let outcomes: Vec<&ReplayOutcome> = r.outcomes.iter().map(|a| &a.outcome).collect();
            plot::draw(
                &with_trace_name(path, &r.trace.name, several),
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

fn events(t: &Trace) -> u64 {
    (t.initial.len() + t.events.len()) as u64
}

/// The runs to make: each allocator of `--allocators` with each of its `--conf` settings (once
/// with the trace's own settings when it has none), then the allocators only `--conf` names.
fn configurations(
    names: &[String],
    confs: &[String],
) -> Result<Vec<(Policy, Option<String>)>, String> {
    let mut given: Vec<(Policy, String)> = Vec::new();
    for c in confs {
        let Some((name, settings)) = c.split_once('=') else {
            return Err(format!(
                "--conf {c:?}: expected ALLOCATOR=SETTINGS, e.g. classic=max_split_size_mb:128"
            ));
        };
        let p = policy(name)?;
        vmm_replay::conf::effective(p, None, Some(settings)).map_err(|e| format!("--conf {e}"))?;
        given.push((p, settings.trim().to_string()));
    }
    let mut out = Vec::new();
    let mut listed: Vec<Policy> = names.iter().map(|n| policy(n)).collect::<Result<_, _>>()?;
    for (p, _) in &given {
        if !listed.contains(p) {
            listed.push(*p);
        }
    }
    for p in listed {
        let mine: Vec<_> = given.iter().filter(|(q, _)| *q == p).collect();
        if mine.is_empty() {
            out.push((p, None));
        }
        out.extend(mine.into_iter().map(|(_, s)| (p, Some(s.clone()))));
    }
    Ok(out)
}

fn policy(name: &str) -> Result<Policy, String> {
    Policy::from_name(name.trim()).ok_or_else(|| {
        let known: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        format!(
            "unknown allocator {name:?}: expected one of {}",
            known.join(", ")
        )
    })
}

/// The policy whose replay `--dump-snapshot` writes, if any.
fn dumped_policy(args: &Args, policies: &[Policy]) -> Result<Option<Policy>, String> {
    if args.dump_snapshot.is_none() {
        return Ok(None);
    }
    let chosen = match &args.dump_allocator {
        Some(name) => policy(name)?,
        None if policies.contains(&Policy::Expandable) => Policy::Expandable,
        None if policies.contains(&Policy::PytorchExpandable) => Policy::PytorchExpandable,
        None => policies[0],
    };
    if chosen == Policy::Classic {
        return Err("--dump-snapshot of the classic allocator is not supported yet: dump pytorch-expandable or expandable".into());
    }
    if !policies.contains(&chosen) {
        return Err(format!(
            "--dump-allocator {} is not among --allocators",
            chosen.name()
        ));
    }
    Ok(Some(chosen))
}

/// `path` itself for a single trace, else `path` with the trace's name before the extension.
fn with_trace_name(path: &Path, name: &str, several: bool) -> std::path::PathBuf {
    if !several {
        return path.to_path_buf();
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("out");
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match path.extension().and_then(|s| s.to_str()) {
        Some(ext) => path.with_file_name(format!("{stem}-{safe}.{ext}")),
        None => path.with_file_name(format!("{stem}-{safe}")),
    }
}

fn read_traces(args: &Args) -> Result<Vec<Trace>, String> {
    let mut traces = Vec::new();
    for f in &args.files {
        let mut read = load::load(f).map_err(|e| e.to_string())?;
        if let (Some(d), n) = (args.device, read.len()) {
            if d >= n {
                return Err(format!(
                    "--device {d}: {} has {n} device trace(s)",
                    f.display()
                ));
            }
            read = vec![read.swap_remove(d)];
        }
        traces.extend(read);
    }
    for name in &args.workload {
        let trace = workloads::by_name(name, args.seed, args.ops, args.max_size);
        traces.push(trace.ok_or_else(|| {
            format!(
                "unknown workload {name:?}: expected one of {}, a mechanism workload ({}) or a \
                 program workload ({}, {})",
                workloads::NAMES.join(", "),
                workloads::MECHANISMS.join(", "),
                workloads::PROGRAMS.join(", "),
                workloads::SERVERS.join(", ")
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
                "--write-trace takes exactly one trace, {} were read (--device N picks one device of a snapshot)",
                traces.len()
            ));
        };
        native::write_native_file(out, single).map_err(|e| e.to_string())?;
    }
    Ok(traces)
}

/// A bar on stderr counting replayed events, only when a person is watching.
fn progress(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:30} {human_pos}/{human_len} events {elapsed} {msg}")
    {
        bar.set_style(style);
    }
    bar
}
