//! The command line.

use std::path::PathBuf;

use clap::Parser;

/// Replays allocation traces recorded by real programs against each allocator on a simulated
/// device, and compares how much memory each needed.
///
/// With no FILES, the built-in workloads run (transformer training, inference with a growing KV
/// cache, varying batch sizes, RMM-style random allocations): see --workload.
///
/// `vmm-replay advise TRACE [--capacity 24GiB] [--report FILE.html]` answers "would a
/// PYTORCH_CUDA_ALLOC_CONF setting have saved my run?" (see `vmm-replay advise --help`).
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    /// Trace files: PyTorch memory snapshots (.pickle), RMM logging CSV, or vmm-alloc traces
    /// (the format is chosen by content, not by name).
    pub files: Vec<PathBuf>,
    /// Replay this built-in workload (repeatable): transformer-training, inference-kv-cache,
    /// varying-batch or rmm-random; or a workload that shows one mechanism: small-after-large
    /// (small requests borrowing the large pool's free ranges under pressure), multi-stream,
    /// two-streams, ten-streams and thirty-two-streams (4, 2, 10 or 32 streams sharing the
    /// device); or a program of another kind: empty-cache-training (empty_cache() after every
    /// step), qlora (4-bit weights dequantized around every matmul), unet3d-training (3-D
    /// volumes), moe-training (mixture-of-experts: every expert's tensors a new size in every
    /// layer), inference-server, inference-server-4 or inference-server-32 (requests on 10, 4 or
    /// 32 streams at once, each growing its own KV cache). With no FILES and no --workload, the
    /// first four run.
    #[arg(long, value_name = "NAME")]
    pub workload: Vec<String>,
    /// Seed of the built-in workloads (the same seed gives the same trace).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Steps of the rmm-random workload.
    #[arg(long, default_value_t = 100_000)]
    pub ops: u64,
    /// Largest allocation of the rmm-random workload (sizes are uniform from 1 byte up to it).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub max_size: u64,
    /// Physical memory of the simulated device: bytes, or a number with a unit (KiB, MiB, GiB,
    /// TiB; K, M, G, T and KB, MB, GB, TB mean the same binary units, as nvidia-smi does).
    #[arg(long, default_value = "80GiB", value_parser = parse_size)]
    pub capacity: u64,
    /// Also find, by bisection to the 2 MiB granularity, the smallest capacity with which each
    /// trace replays without an out-of-memory error, and report the run at that capacity. The
    /// bisection assumes a trace that fits a device fits any larger one; where a policy's
    /// decisions make that false (several streams, pressure paths), the capacity reported
    /// fits and the one 2 MiB below it does not, but a smaller one may fit again.
    #[arg(long)]
    pub min_capacity: bool,
    /// Print JSON (field names in the README) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw live and reserved bytes over each trace into this file (.svg or .png). With several
    /// traces, one file each: NAME-TRACE.svg.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Allocators to compare, comma-separated: classic (PyTorch's caching allocator),
    /// pytorch-expandable (PyTorch's expandable segments), expandable (ours).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "classic,pytorch-expandable,expandable"
    )]
    pub allocators: Vec<String>,
    /// Settings for one allocator, ALLOCATOR=SETTINGS (repeatable; the same allocator twice runs
    /// it once with each): PYTORCH_CUDA_ALLOC_CONF's grammar and keys for all three (e.g.
    /// classic=max_split_size_mb:128,garbage_collection_threshold:0.6, or
    /// expandable=large_segment_size_mb:64), applied on top of the trace's recorded settings.
    /// Ours (expandable) also takes its own keys: headroom_fraction, headroom_mb, handle_cache,
    /// handle_cache_limit_mb, remap_defrag, remap_before_create, sync_only_after_frees,
    /// pressure_tail, borrow_across_pools, park_remaps, best_fit_growth,
    /// reuse_last_free, drain_after_sync, harvest_lowest_first, give_back_before_foreign_sync,
    /// tail_takes_rest, alias_rescue, rescue_after_oom, skip_hopeless_growth, put_back_after_retry, keep_after_retry, va_fallback (true/false), front_cache (true/false/auto; the replay is one thread, so auto never
    /// engages it),
    /// va_factor, fine_pages_above, reuse_last_free_above, give_back_below_free_pages, give_back_below_all_free_pages and stream_page_share
    /// (fractions), small_page_mb, large_page_mb, stream_page_floor_mb (e.g. expandable=remap_before_create:true,headroom_fraction:0.02). An allocator named here and
    /// not in --allocators is added.
    #[arg(long, value_name = "ALLOCATOR=SETTINGS")]
    pub conf: Vec<String>,
    /// Do not replay the traced program's empty_cache() calls.
    #[arg(long)]
    pub no_empty_cache: bool,
    /// Ignore the traced program's recorded PYTORCH_CUDA_ALLOC_CONF.
    #[arg(long)]
    pub ignore_trace_settings: bool,
    /// Instead of comparing allocators, check that our classic allocator is PyTorch's: replay
    /// each snapshot through it and compare its cudaMallocs with the recorded ones. Exit code 1
    /// if any trace diverges.
    #[arg(long)]
    pub check_classic: bool,
    /// Write the replay through one allocator (see --dump-allocator) as a PyTorch memory
    /// snapshot that pytorch.org/memory_viz opens: its history and final state. With several
    /// traces, one file each: NAME-TRACE.pickle.
    #[arg(long, value_name = "FILE.pickle")]
    pub dump_snapshot: Option<PathBuf>,
    /// The allocator whose replay --dump-snapshot writes (default: expandable, else the first
    /// of --allocators).
    #[arg(long, value_name = "NAME")]
    pub dump_allocator: Option<String>,
    /// Of a snapshot that recorded several devices, read only this one (its index).
    #[arg(long)]
    pub device: Option<usize>,
    /// Write the trace read (exactly one; --device picks one of a multi-device snapshot) in
    /// vmm-alloc's compact format to this file, then replay it as usual.
    #[arg(long, value_name = "FILE")]
    pub write_trace: Option<PathBuf>,
}

/// Parses `80GiB`, `24G`, `512 MiB`, `1.5TiB` or a plain byte count.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, KiB, MiB, GiB or TiB"
            ))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size: expected e.g. 80GiB, 512MiB or 1073741824")
    })?;
    let bytes = value * (1u64 << shift) as f64;
    // 1 EiB: far beyond any device, and well inside u64 and usize.
    if !(bytes.is_finite() && bytes >= 1.0 && bytes <= (1u64 << 60) as f64) {
        return Err(format!(
            "{text:?} is out of range: a capacity is between 1 byte and 1 EiB"
        ));
    }
    Ok(bytes as u64)
}
