//! What `vmm-replay` reports, in each of its forms.

use super::*;

#[test]
fn no_arguments_compares_the_builtin_workloads() {
    let o = vmm_replay(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for name in [
        "transformer-training",
        "inference-kv-cache",
        "varying-batch",
        "rmm-random",
    ] {
        assert!(out.contains(name), "{name} missing from:\n{out}");
    }
    // One summary line per allocator over the four workloads.
    for allocator in ["classic", "pytorch-expandable", "expandable"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{allocator}: 4 traces"))),
            "no summary for {allocator}:\n{out}"
        );
    }
}

#[test]
fn json_reports_every_documented_field_with_consistent_figures() {
    let log = file("json", "small.csv", &small_log());
    let report = replay_json(&[log.to_str().unwrap()]);
    let trace = &report["traces"][0];
    assert_eq!(trace["trace"], "small");
    assert_eq!(trace["events"], 6);
    assert_eq!(trace["start_state"], "empty");
    assert_eq!(trace["skipped_frees"], 0);
    assert!(
        trace["recorded_peak_reserved_bytes"].is_null(),
        "an RMM log records no segments"
    );
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let a = allocator(&report, 0, name);
        let live = a["peak_live_bytes"].as_u64().unwrap();
        let reserved = a["peak_reserved_bytes"].as_u64().unwrap();
        assert_eq!(live, 8 * MIB, "{name}");
        assert!(
            reserved >= live,
            "{name}: reserved {reserved} < live {live}"
        );
        let utilization = a["utilization"].as_f64().unwrap();
        assert!((utilization - live as f64 / reserved as f64).abs() < 1e-9);
        assert_eq!(a["ooms"], 0);
        assert!(a["driver_calls"].as_u64().unwrap() > 0);
        assert!(a["bytes_created"].as_u64().unwrap() >= reserved);
        assert!(a["events_per_second"].as_f64().unwrap() > 0.0);
        assert!(
            a.get("min_capacity_bytes").is_none(),
            "only with --min-capacity"
        );
    }
}

#[test]
fn min_capacity_is_the_smallest_capacity_that_replays_without_oom() {
    let log = file("min", "small.csv", &small_log());
    let path = log.to_str().unwrap();
    let report = replay_json(&["--min-capacity", path]);
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let a = allocator(&report, 0, name);
        let min = a["min_capacity_bytes"].as_u64().expect("a capacity");
        assert_eq!(
            min % (2 * MIB),
            0,
            "bisection steps by the 2 MiB granularity"
        );
        assert_eq!(a["at_min_capacity"]["ooms"], 0);
        assert_eq!(a["at_min_capacity"]["capacity_bytes"], min);
        let at = |capacity: u64| {
            let r = replay_json(&[
                "--allocators",
                name,
                "--capacity",
                &capacity.to_string(),
                path,
            ]);
            allocator(&r, 0, name)["ooms"].as_u64().unwrap()
        };
        assert_eq!(at(min), 0, "{name} fits at its min capacity");
        assert!(
            at(min - 2 * MIB) > 0,
            "{name} must OOM below its min capacity {min}"
        );
    }
}

#[test]
fn each_stream_replays_on_its_own_stream() {
    let rows = |second_stream| {
        rmm_csv(&[
            ("allocate", 0x1000, MIB, 0),
            ("allocate", 0x2000, MIB, second_stream),
        ])
    };
    let reserved = |test: &str, stream| {
        let log = file(test, "streams.csv", &rows(stream));
        let r = replay_json(&["--allocators", "pytorch-expandable", log.to_str().unwrap()]);
        allocator(&r, 0, "pytorch-expandable")["peak_reserved_bytes"]
            .as_u64()
            .unwrap()
    };
    // Two 1 MiB blocks share one 2 MiB small page on one stream; two streams get a page each.
    assert_eq!(reserved("one-stream", 0), 2 * MIB);
    assert_eq!(reserved("two-streams", 0x7f00), 4 * MIB);
}

#[test]
fn several_files_give_a_row_each_and_a_summary() {
    let a = file("several", "first.csv", &small_log());
    let b = file("several", "second.csv", &small_log());
    let o = vmm_replay(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // A row per allocator (three by default) for each file, then a summary line per allocator.
    assert_eq!(
        out.lines().filter(|l| l.starts_with("| first |")).count(),
        3
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("| second |")).count(),
        3
    );
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let line = format!("{name}: 2 traces");
        assert!(out.lines().any(|l| l.starts_with(&line)), "{out}");
    }
}

#[test]
fn plots_are_written_as_svg_and_png() {
    let log = file("plot", "small.csv", &small_log());
    let svg = log.with_file_name("plot.svg");
    let png = log.with_file_name("plot.png");
    for out in [&svg, &png] {
        let o = vmm_replay(&["--plot", out.to_str().unwrap(), log.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
    for label in [
        "reserved: pytorch-expandable",
        "reserved: expandable",
        "live (requested)",
    ] {
        assert!(text.contains(label), "{label} missing from the SVG");
    }
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[test]
fn a_written_trace_replays_to_the_same_figures() {
    let log = file("write", "small.csv", &small_log());
    let native = log.with_file_name("small.vmmtrace");
    let first = replay_json(&[
        "--write-trace",
        native.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    let second = replay_json(&[native.to_str().unwrap()]);
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let (a, b) = (allocator(&first, 0, name), allocator(&second, 0, name));
        for field in [
            "peak_live_bytes",
            "peak_reserved_bytes",
            "ooms",
            "driver_calls",
            "bytes_created",
        ] {
            assert_eq!(a[field], b[field], "{name}: {field}");
        }
    }
    assert_eq!(first["traces"][0]["events"], second["traces"][0]["events"]);
}

#[test]
fn a_dumped_snapshot_replays_from_empty_to_the_same_peak() {
    let log = file("dump", "small.csv", &small_log());
    let dump = log.with_file_name("small-dump.pickle");
    let first = replay_json(&[
        "--dump-snapshot",
        dump.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&dump).expect("the snapshot was written");
    assert_eq!(
        &bytes[..2],
        b"\x80\x04",
        "pickle protocol 4, as memory_viz reads"
    );
    // The dump is a PyTorch snapshot of our allocator: replayed, it starts empty, needs the same
    // live bytes, and records what our allocator mapped as the traced program's reserved memory.
    let second = replay_json(&[dump.to_str().unwrap()]);
    let trace = &second["traces"][0];
    assert_eq!(trace["start_state"], "empty");
    let ours = allocator(&first, 0, "expandable");
    assert_eq!(
        allocator(&second, 0, "expandable")["peak_live_bytes"],
        ours["peak_live_bytes"]
    );
    assert_eq!(
        trace["recorded_peak_reserved_bytes"],
        ours["peak_reserved_bytes"]
    );
    // Asking for an allocator that is not replayed is an error.
    let o = vmm_replay(&[
        "--allocators",
        "expandable",
        "--dump-allocator",
        "pytorch-expandable",
        "--dump-snapshot",
        dump.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not among --allocators"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn driver_calls_are_reported_by_kind() {
    let log = file("kinds", "small.csv", &small_log());
    let report = replay_json(&[log.to_str().unwrap()]);
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let a = allocator(&report, 0, name);
        let kinds = a["driver_calls_by_kind"].as_object().expect("an object");
        let sum: u64 = kinds.values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(sum, a["driver_calls"].as_u64().unwrap(), "{name}");
        // Two pages or segments (20 MiB large, 2 MiB small): two creates, two maps.
        assert_eq!(kinds["cuMemCreate"], 2, "{name}: {kinds:?}");
        assert_eq!(kinds["cuMemMap"], 2, "{name}: {kinds:?}");
    }
}
