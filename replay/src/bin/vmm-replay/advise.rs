//! `vmm-replay advise TRACE [--capacity 24GiB]`: which settings would have fit, and what to paste.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use vmm_alloc::backend::CallKind;
use vmm_alloc::units::human_bytes;
use vmm_replay::advise::{candidates_for, default_capacity, recommend, sweep, Verdict};

use crate::args::parse_size;

/// Replays a trace under the PYTORCH_CUDA_ALLOC_CONF settings that matter (max_split_size_mb,
/// roundup_power2_divisions, garbage_collection_threshold, expandable_segments) and under
/// vmm-alloc, in parallel, and recommends the smallest change that fits your GPU.
#[derive(Parser, Debug)]
#[command(name = "vmm-replay advise")]
pub struct AdviseArgs {
    /// The trace: a PyTorch memory snapshot, an RMM log or a vmm-alloc trace (one device).
    pub file: PathBuf,
    /// Your GPU's memory (default: the smallest common GPU that held the recording, stated).
    #[arg(long, value_parser = parse_size)]
    pub capacity: Option<u64>,
    /// The device of a multi-device snapshot (its index; default: the only one).
    #[arg(long)]
    pub device: Option<usize>,
    /// Threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of the table (every figure of the report, timelines included).
    #[arg(long)]
    pub json: bool,
    /// Also write the report as one self-contained HTML page (inline SVG, nothing fetched).
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
}

/// Runs the sweep and prints the advice.
pub fn run(args: &AdviseArgs) -> Result<(), String> {
    let mut traces = crate::load::load(&args.file).map_err(|e| e.to_string())?;
    let trace = match (args.device, traces.len()) {
        (None, 1) => traces.remove(0),
        (None, n) => {
            return Err(format!(
                "{}: {n} devices recorded; choose one with --device 0..{}",
                args.file.display(),
                n - 1
            ))
        }
        (Some(d), n) if d < n => traces.remove(d),
        (Some(d), n) => {
            return Err(format!(
                "--device {d}: {} has {n} device trace(s)",
                args.file.display()
            ))
        }
    };
    let (capacity, basis) = match args.capacity {
        Some(c) => (c, format!("capacity {} (--capacity)", human_bytes(c))),
        None => default_capacity(&trace),
    };
    let cap = usize::try_from(capacity)
        .map_err(|_| "--capacity does not fit this machine's address size".to_string())?;
    let list = candidates_for(&trace);
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(list.len() as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:30} {pos}/{len} configurations {elapsed}")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let verdicts = sweep(&trace, &list, cap, threads, &|| bar.inc(1))
        .map_err(|e| format!("{}: {e}", trace.name))?;
    bar.finish_and_clear();
    let advice = recommend(&trace, capacity, &verdicts);
    let text = table(&trace.name, &basis, &verdicts, &advice);
    if let Some(path) = &args.report {
        let page = crate::html::page(&trace.name, &basis, &text, &advice, &verdicts, capacity);
        std::fs::write(path, page).map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
    }
    if args.json {
        let v = json!({
            "trace": trace.name,
            "capacity_bytes": capacity,
            "capacity_basis": basis,
            "recorded_settings": trace.alloc_conf,
            "configurations": verdicts.iter().map(verdict_json).collect::<Vec<_>>(),
            "recommendation": advice,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        print!("{text}");
    }
    Ok(())
}

/// The sweep as a table, then the recommendation.
pub fn table(name: &str, basis: &str, verdicts: &[Verdict], advice: &str) -> String {
    let mut out = format!("{name}: {basis}\n\n| configuration | fits | peak reserved | min capacity | driver calls | cudaMalloc retries | syncs | OOMs |\n|---|---|--:|--:|--:|--:|--:|--:|\n");
    for v in verdicts {
        let o = &v.at_capacity;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.candidate.name(),
            if v.fits() { "yes" } else { "no" },
            human_bytes(o.peak_reserved_bytes),
            v.min_capacity.map_or("-".into(), human_bytes),
            o.driver_calls,
            o.alloc_retries,
            o.calls.calls(CallKind::Synchronize),
            o.ooms
        ));
    }
    out.push_str(&format!("\n{advice}\n"));
    out
}

/// One configuration's figures as JSON.
pub fn verdict_json(v: &Verdict) -> Value {
    let o = &v.at_capacity;
    json!({
        "configuration": v.candidate.name(),
        "allocator": o.allocator,
        "change": v.candidate.change,
        "settings": o.settings,
        "fits": v.fits(),
        "peak_reserved_bytes": o.peak_reserved_bytes,
        "peak_live_bytes": o.peak_live_bytes,
        "min_capacity_bytes": v.min_capacity,
        "driver_calls": o.driver_calls,
        "alloc_retries": o.alloc_retries,
        "syncs": o.calls.calls(CallKind::Synchronize),
        "ooms": o.ooms,
        "oom_moments": o.oom_moments.iter().map(crate::report::moment_json).collect::<Vec<_>>(),
        "timeline": o.timeline.iter().map(|p| [p.event, p.live, p.reserved]).collect::<Vec<_>>(),
    })
}
