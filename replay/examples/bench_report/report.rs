//! The report itself: its sections in order, each a bench's tables and notes.

use super::*;

/// The GPU line: the device the GPU bench ran on, or why it was skipped.
pub(crate) fn gpu_line(d: &Data) -> String {
    match d.extra("gpu") {
        None => "not known (the GPU bench has not run)".into(),
        Some(g) => match g["skipped"].as_str() {
            Some(why) => format!("none (GPU benches skipped: {why})"),
            None => format!(
                "{}, {:.1} GiB",
                g["device"].as_str().unwrap_or("unknown"),
                g["total_bytes"].as_f64().unwrap_or(0.0) / GIB
            ),
        },
    }
}

/// Where a bench's source is: the replay crate holds those that replay traces.
fn bench_source(bench: &str) -> String {
    match bench {
        "churn" | "replay" | "gpu" => format!("replay/benches/{bench}.rs"),
        _ => format!("benches/{bench}.rs"),
    }
}

pub(crate) fn section_head(
    out: &mut String,
    d: &Data,
    title: &str,
    bench: &str,
    groups: &[String],
) {
    writeln!(out, "## {title}\n").expect("write to a String");
    let source = bench_source(bench);
    writeln!(
        out,
        "`cargo bench --bench {bench}` ([{source}]({source})), measured {}.",
        d.date(groups)
    )
    .expect("write to a String");
}

pub(crate) fn not_run(out: &mut String, group: &str) {
    writeln!(
        out,
        "_No results: `<target>/criterion/{group}` is missing (the bench has not run, or ran \
         with a filter that left it out)._\n"
    )
    .expect("write to a String");
}

pub(crate) fn report(d: &Data, command: &str, machine: &str) -> String {
    let mut body = String::new();
    let mut verdicts = Vec::new();
    let out = &mut body;

    // Hot path.
    section_head(
        out,
        d,
        "Hot path: cached allocate + deallocate pair",
        "hot_path",
        &["hot_path".into()],
    );
    out.push_str(
        "Sim backend, 1 TiB. The \"live\" allocations are fragmented (twice as many allocated, \
every other one freed, sizes cycling 512 B / 4 KiB / 64 KiB / 768 KiB), so the free-range index \
holds about as many ranges. Each size is allocated and freed once untimed first, so the timed \
pair finds its memory cached. 20 samples, 2 s.\n\n",
    );
    if d.has("hot_path") {
        allocator_table(out, d, "hot_path", "case (size/live)", "expandable", "");
        driver_notes(out, d.extra("hot_path"));
    } else {
        not_run(out, "hot_path");
    }
    let hot = hot_path_verdicts(d, "hot_path", "Hot path (Sim)");
    write_verdicts(out, &hot);
    verdicts.extend(hot);

    // Churn.
    section_head(
        out,
        d,
        "Churn: RMM's `random_allocations` shape",
        "churn",
        &["churn".into()],
    );
    out.push_str(
        "`workloads::rmm_random(1, max, ops)` (73 % allocations, sizes uniform in [1 B, max]) \
replayed with `trace::replay::replay` on a fresh 16 GiB Sim per run: the time includes building \
and dropping the allocator. 10 samples, 2 s. Time per run:\n\n",
    );
    if d.has("churn") {
        allocator_table(out, d, "churn", "case", "expandable", "");
        if let Some(s) = churn_summary(d, "churn") {
            writeln!(out, "{s}\n").expect("write to a String");
        }
        if let Some(runs) = d.extra("churn").and_then(|c| c["runs"].as_array()) {
            out.push_str(
                "What each needed (deterministic: one untimed run per case; once max reaches 64 \
MiB the 16 GiB device is full, so time goes to the pressure path on the way to an OOM, and fewer \
OOMs means more of the requests were served):\n\n",
            );
            needed_table(out, runs, &d.functions("churn"));
        }
    } else {
        not_run(out, "churn");
    }

    // Replay.
    section_head(out, d, "Replay throughput", "replay", &["replay".into()]);
    out.push_str(
        "`trace::replay::replay` on the default 80 GiB Sim (fresh per run). Traces: the built-in \
`transformer_training(1)` and the largest file in `../shared/traces/pytorch` (initial blocks \
included). A run's time includes building the Sim and the allocator and, for a warm-start trace, \
its initial blocks, so a short trace pays that fixed cost over fewer events. Events/s is the \
trace's events over the median run time. 10 samples, 3 s.\n\n",
    );
    if let Some(why) = d
        .extra("replay")
        .and_then(|r| r["shared_trace_skipped"].as_str())
    {
        writeln!(out, "The shared trace was **skipped**: {why}.\n").expect("write to a String");
    }
    if d.has("replay") {
        allocator_table(out, d, "replay", "trace", "expandable", "events/s");
    } else {
        not_run(out, "replay");
    }
    let rates: Vec<(String, f64)> = d
        .cases("replay")
        .into_iter()
        .filter_map(|c| Some((c.clone(), d.get("replay", "expandable", &c)?.rate()?)))
        .collect();
    let replay_verdict = Verdict {
        target: "Replay (Sim): expandable ≥ 5 M events/s on every trace".into(),
        measured: if rates.is_empty() {
            "no results".into()
        } else {
            rates
                .iter()
                .map(|(c, r)| format!("{} events/s on `{c}`", rate(*r)))
                .collect::<Vec<_>>()
                .join(", ")
        },
        met: (!rates.is_empty()).then(|| rates.iter().all(|(_, r)| *r >= 5e6)),
    };
    write_verdicts(out, std::slice::from_ref(&replay_verdict));
    verdicts.push(replay_verdict);

    // Growth on Host.
    let growth_groups = d.groups_with("growth/");
    section_head(
        out,
        d,
        "Growth and release on Host",
        "growth",
        &growth_groups,
    );
    out.push_str(
        "Host backend: real `mmap`/`mprotect` mappings of a sparse memfd, 2 MiB granularity, \
16 GiB capacity; pages are mapped but never written, so 8 GiB costs VMAs, not RAM. Growth is \
64 MiB allocations until the target is allocated; release is deallocate everything + \
`empty_cache`; `expandable-warm-cache` is expandable with `handle_cache_limit` = 16 GiB, \
regrowing after a release that kept the handles. The floor is the raw backend loop with no \
allocator: create + map + set_access per page, with 2 MiB pages and with the 20 MiB pages both \
expandable policies use for large blocks (1 GiB is 52 of them, 8 GiB 410). Flat sampling, \
10 samples, 2 s. Ratios are against `raw-20MiB`, the loop with the same page count, and \
`raw-2MiB`; the call counts are those of the phase (for the raw loops, of the page loop).\n\n",
    );
    if growth_groups.is_empty() {
        not_run(out, "growth_<N>GiB");
    } else {
        growth_table(out, d, "growth", d.extra("growth"));
    }
    out.push_str(
        "Each expandable growth also makes one `cuMemAddressReserve`; each release one \
`cuMemAddressFree` and one `cuStreamSynchronize`, with one `cuMemUnmap` per run of adjacent \
pages (ours: one for the whole segment; PyTorch's policy: one per page) and one `cuMemRelease` per page except with the warm cache, which releases none. Classic makes one \
reserve + create + map + access per 64 MiB request (its own segment) and frees each on release. \
Expandable sets access once per allocation rather than once per page, which is how it can beat \
the raw loop. On Host a `cuMemCreate` only hands out a range of the memfd, so the warm cache \
saves little time here; the creations it avoids matter on a GPU (about 190 µs each on an A100, \
issue 7's anchor; see the GPU section).\n\n",
    );
    let growth = growth_verdicts(d, "growth", d.extra("growth"), "Growth (Host)", Some(1.5));
    write_verdicts(out, &growth);
    verdicts.extend(growth);

    // Threads.
    let thread_groups = d.groups_with("threads/");
    section_head(
        out,
        d,
        "Threads: one shared allocator, separate streams",
        "threads",
        &thread_groups,
    );
    out.push_str(
        "Sim. Each thread has its own stream and keeps a ring of 8 live blocks; per step it frees \
the oldest and allocates the next of 512 B / 4 KiB / 64 KiB / 1 MiB / 3 MiB / 20 MiB, 4,000 \
steps per iteration split between the threads (the same work for 1 and 2), on memory mapped \
before timing. One operation is one `allocate` or one `deallocate`; ops/s counts all threads \
together. The time runs from a common start barrier to the last thread's end. 20 samples, 2 s. \
`expandable` is the default: its per-stream front cache (`front_cache`, Note [Front cache] in \
`src/expandable/front/mod.rs`) engages once frees find the lock taken and disengages while it \
serves too few requests (Note [Engage on contention] in `src/expandable/front/engage.rs`); \
`expandable-front-cache` has it on from the first call (`front_cache:true`), \
`expandable-single-lock` off (`front_cache:false`: every call takes the one lock); \
`expandable-unshared` gives each thread an allocator of its own, nothing shared: the most any \
locking could reach on the machine.\n\n",
    );
    if thread_groups.is_empty() {
        not_run(out, "threads_<N>");
    } else {
        threads_table(out, d, &thread_groups);
    }
    let mut scaling = vec![threads_verdict(
        d,
        &thread_groups,
        "Threads (Sim), mixed sizes",
    )];
    let same_size = d.groups_with("threads-same-size/");
    out.push_str(
        "The same with fixed shapes (`threads-same-size`): per step each thread frees the oldest \
of its 8 blocks and allocates the size it just freed, what the front cache serves without the \
lock.\n\n",
    );
    if same_size.is_empty() {
        not_run(out, "threads-same-size_<N>");
    } else {
        threads_table(out, d, &same_size);
    }
    scaling.push(threads_verdict(
        d,
        &same_size,
        "Threads (Sim), fixed shapes",
    ));
    let varied = d.groups_with("threads-varied/");
    out.push_str(
        "The same with sizes that do not come back soon (`threads-varied`): per step each thread \
frees the oldest of its 8 blocks and allocates the next of 48 sizes (512 B to 8.5 MiB, 23 % \
apart), so no freed block is asked for again within 48 steps: every request misses the front \
cache and takes its slow path, what the switch costs where shapes do not recur.\n\n",
    );
    if varied.is_empty() {
        not_run(out, "threads-varied_<N>");
    } else {
        threads_table(out, d, &varied);
    }
    write_verdicts(out, &scaling);
    verdicts.extend(scaling);

    // GPU.
    buffer_section(out, d, &mut verdicts);

    gpu_section(out, d, &mut verdicts);

    // Assemble: header, targets, sections.
    let mut all: Vec<String> = d.groups.keys().cloned().collect();
    all.sort();
    let mut doc = String::new();
    let w = &mut doc;
    w.push_str("# Benchmarks\n\n");
    writeln!(
        w,
        "<!-- Generated by replay/examples/bench_report from target/criterion and target/bench-extra: \
edit the generator, not this file. -->\n"
    )
    .expect("write to a String");
    writeln!(
        w,
        "**Regenerate:** `{command}` (runs `cargo bench`, then `cargo run --release --example \
bench_report`, which writes this file). `scripts/benchmarks.sh --report-only` rewrites it from \
the last run's results without benchmarking.\n"
    )
    .expect("write to a String");
    writeln!(w, "**Machine:** {machine}. **GPU:** {}.", gpu_line(d)).expect("write to a String");
    writeln!(
        w,
        "**Date:** measured {} (newest result; each section gives its own), report written {}.\n",
        d.date(&all),
        date(SystemTime::now())
    )
    .expect("write to a String");
    w.push_str(
        "Criterion benchmarks under `benches/` and `replay/benches/` (issue 7). Every bench runs all allocators in the \
same process, so the **ratios** (first columns) hold on a noisy machine; absolute medians follow. \
A ratio is that case's median time over the named allocator's (usually `expandable`): below 1 \
means faster than it. Medians are criterion's `median.point_estimate` in \
`target/criterion/<group>/<allocator>/<case>/new/estimates.json`; OOM counts, peaks, driver call \
counts and skips come from the benches' side outputs in `target/bench-extra/`. One bench alone: \
`cargo bench --bench <name>`, then `scripts/benchmarks.sh --report-only`.\n\n",
    );
    w.push_str("## Targets\n\n");
    header(w, &["target", "measured", "status"].map(String::from));
    for v in &verdicts {
        row(
            w,
            &[
                v.target.clone(),
                v.measured.clone(),
                format!("**{}**", v.status()),
            ],
        );
    }
    w.push('\n');
    w.push_str(&body);
    doc
}

pub(crate) fn gpu_section(out: &mut String, d: &Data, verdicts: &mut Vec<Verdict>) {
    let mut groups = vec![
        "gpu_hot_path".to_string(),
        "gpu_churn".into(),
        "gpu_replay".into(),
    ];
    groups.extend(d.groups_with("gpu_growth/"));
    section_head(
        out,
        d,
        "On a GPU: the Cuda backend and the driver's own allocators",
        "gpu",
        &groups,
    );
    out.push_str(
        "On a machine without a GPU this section has no figures; the GPU runs' (criterion \
`--quick`, with what each found) are in [GPU.md](GPU.md), which `scripts/gpu-validate.sh` \
writes.\n",
    );
    out.push_str(
        "Benchmarks 1–4 on the Cuda backend (device 0), against what a Rust user would otherwise \
call, and the raw driver loop as the physical floor for growth:\n\n\
* `gpu_hot_path`: the hot-path pair above (same sizes and background, live 0 and 1,000) for the \
three allocators, and the baselines at the same sizes: `cudarc-alloc` (`CudaStream::alloc` + \
drop on the default stream: `cuMemAllocAsync` + `cuMemFreeAsync`, plus cudarc's two events per \
slice), `cuMemAllocAsync` (the same driver calls without cudarc) and `cuMemAlloc` \
(`cuMemAlloc` + `cuMemFree`). Stream-ordered pairs are timed per batch, with the stream \
synchronized after it, untimed.\n\
* `gpu_threads`: the threads loops above on 1 and 2 threads, each thread on a registered cudarc \
stream of its own; `bench-extra/gpu.json`'s `threads` holds two threads' throughput over one's, \
timed alternately outside criterion.\n\
* `gpu_growth`: the Host growth cases above on Cuda, the raw loop being `cuMemCreate` + \
`cuMemMap` + `cuMemSetAccess` per page through the backend.\n\
* `gpu_churn`: the churn shape, 10,000 operations, on a 16 GiB budget \
(`per_process_memory_fraction`), a fresh allocator per run.\n\
* `gpu_replay`: the replay traces on the whole device. Sim's replay engine cannot drive a \
device, so the bench replays with the same loop (OOMs counted and skipped, `held_bytes()` read after \
every event), each trace stream a registered cudarc stream.\n\n",
    );
    let gpu = d.extra("gpu");
    if let Some(why) = gpu.and_then(|g| g["skipped"].as_str()) {
        writeln!(
            out,
            "**Skipped:** {why}. Run `scripts/benchmarks.sh` (or `cargo bench --bench gpu`, then \
`scripts/benchmarks.sh --report-only`) on a machine with an NVIDIA driver and GPU.\n"
        )
        .expect("write to a String");
        return;
    }
    if gpu.is_none() && !d.has("gpu_hot_path") {
        not_run(out, "gpu_hot_path");
        return;
    }
    if let Some(g) = gpu {
        writeln!(out, "Device: {}.\n", gpu_line(d)).expect("write to a String");
        for why in g["growth"]["skipped"].as_array().into_iter().flatten() {
            writeln!(out, "Skipped: {}.\n", why.as_str().unwrap_or("?"))
                .expect("write to a String");
        }
    }
    out.push_str("### Hot path and the baselines\n\n");
    if d.has("gpu_hot_path") {
        allocator_table(out, d, "gpu_hot_path", "case (size/live)", "expandable", "");
        driver_notes(out, gpu.map(|g| &g["hot_path"]));
    } else {
        not_run(out, "gpu_hot_path");
    }
    let hot = hot_path_verdicts(d, "gpu_hot_path", "Hot path (Cuda)");
    write_verdicts(out, &hot);
    verdicts.extend(hot);

    out.push_str(
        "### Threads

The Sim's threads loops above (mixed ring, fixed shapes, sizes that do not \
come back soon) on the Cuda backend, each thread on a registered cudarc stream of its own.\n\n",
    );
    let mut scaling = Vec::new();
    for (short, label) in [
        ("ring", "Threads (Cuda), mixed sizes"),
        ("same_size", "Threads (Cuda), fixed shapes"),
        ("varied", "Threads (Cuda), sizes that do not recur"),
    ] {
        let groups = d.groups_with(&format!("gpu_threads/{short}/"));
        if groups.is_empty() {
            not_run(out, &format!("gpu_threads_{short}_<N>"));
        } else {
            writeln!(out, "`{short}`:\n").expect("write to a String");
            threads_table(out, d, &groups);
        }
        scaling.push(threads_verdict(d, &groups, label));
    }
    write_verdicts(out, &scaling);
    verdicts.extend(scaling);

    out.push_str("### Growth and release\n\n");
    let counts = gpu.map(|g| &g["growth"]);
    if d.groups_with("gpu_growth/").is_empty() {
        not_run(out, "gpu_growth_<N>GiB");
    } else {
        growth_table(out, d, "gpu_growth", counts);
    }
    let growth = growth_verdicts(d, "gpu_growth", counts, "Growth (Cuda)", None);
    write_verdicts(out, &growth);
    verdicts.extend(growth);

    out.push_str("### Churn\n\n");
    if let Some(cap) = gpu.and_then(|g| g["churn"]["capacity_bytes"].as_f64()) {
        writeln!(out, "Budget: {:.1} GiB of the device.\n", cap / GIB).expect("write to a String");
    }
    if d.has("gpu_churn") {
        allocator_table(out, d, "gpu_churn", "case", "expandable", "");
        if let Some(s) = churn_summary(d, "gpu_churn") {
            writeln!(out, "{s}\n").expect("write to a String");
        }
        if let Some(runs) = gpu.and_then(|g| g["churn"]["runs"].as_array()) {
            needed_table(out, runs, &d.functions("gpu_churn"));
        }
    } else {
        not_run(out, "gpu_churn");
    }

    out.push_str("### Replay throughput\n\n");
    if let Some(why) = gpu.and_then(|g| g["replay"]["shared_trace_skipped"].as_str()) {
        writeln!(out, "The shared trace was **skipped**: {why}.\n").expect("write to a String");
    }
    if d.has("gpu_replay") {
        allocator_table(out, d, "gpu_replay", "trace", "expandable", "events/s");
        if let Some(runs) = gpu.and_then(|g| g["replay"]["runs"].as_array()) {
            needed_table(out, runs, &d.functions("gpu_replay"));
        }
    } else {
        not_run(out, "gpu_replay");
    }
}
