//! Bad files and bad arguments: a one-line error naming what is wrong, a non-zero exit, never a
//! panic (exit code 101).

use super::*;

/// `vmm-replay FILE` must fail with one line that names the file and says `what`.
fn refused(test: &str, name: &str, bytes: &[u8], what: &str) {
    let path = file(test, name, bytes);
    let o = vmm_replay(&[path.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{name}: {err}");
    assert_eq!(err.lines().count(), 1, "{name}: one line, got:\n{err}");
    assert!(err.starts_with("vmm-replay: "), "{err}");
    assert!(
        err.contains(path.to_str().unwrap()),
        "{name}: the file is not named: {err}"
    );
    assert!(
        err.to_lowercase().contains(what),
        "{name}: expected {what:?} in: {err}"
    );
    assert!(stdout(&o).is_empty(), "{name}: nothing on stdout");
}

#[test]
fn missing_and_unreadable_files() {
    let o = vmm_replay(&["/nonexistent/trace.pickle"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("/nonexistent/trace.pickle"),
        "{}",
        stderr(&o)
    );
    refused("empty", "empty.csv", b"", "");
    refused(
        "binary",
        "noise.bin",
        &[0xff, 0xfe, 0x00, 0x13, 0x37],
        "not a pytorch snapshot",
    );
}

#[test]
fn broken_pickles() {
    // A snapshot with no segments and no trace entries.
    refused(
        "list",
        "list.pickle",
        b"\x80\x04]\x94.",
        "nothing to replay",
    );
    // A pickled string, not a snapshot.
    refused(
        "str",
        "str.pickle",
        b"\x80\x04\x8c\x02hi\x94.",
        "not a pytorch memory snapshot",
    );
    // Cut off in the middle of a string.
    refused("cut", "cut.pickle", b"\x80\x04}\x94(\x8c\x08segm", "");
    // Would import os.system if unpickled by Python.
    refused(
        "global",
        "global.pickle",
        b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
        "",
    );
    // A million nested lists.
    let mut deep = b"\x80\x04".to_vec();
    deep.extend(std::iter::repeat_n(b']', 1_000_000));
    refused("deep", "deep.pickle", &deep, "");
    // A string that claims 4 GiB.
    refused("huge", "huge.pickle", b"\x80\x04X\xff\xff\xff\xff", "");
}

#[test]
fn broken_rmm_logs() {
    refused(
        "columns",
        "columns.csv",
        b"Thread,Time,Action\n1,t,allocate\n",
        "pointer",
    );
    let negative = b"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,-5,0x0\n";
    refused("negative", "negative.csv", negative, "line 2");
    let absurd =
        b"Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,99999999999999999999,0x0\n";
    refused("absurd", "absurd.csv", absurd, "line 2");
    let action = b"Thread,Time,Action,Pointer,Size,Stream\n1,t,reticulate,0x10,5,0x0\n";
    refused("action", "action.csv", action, "line 2");
}

#[test]
fn corrupted_native_traces() {
    let log = file("native", "small.csv", &small_log());
    let native = log.with_file_name("small.vmmtrace");
    let o = vmm_replay(&[
        "--write-trace",
        native.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let good = std::fs::read(&native).unwrap();
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    refused("native", "flipped.vmmtrace", &flipped, "");
    refused("native", "cut.vmmtrace", &good[..good.len() - 3], "");
}

#[test]
fn bad_arguments_print_usage_or_a_clear_error() {
    let o = vmm_replay(&["--frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("Usage"), "{}", stderr(&o));
    for capacity in ["0", "-1GiB", "12XB", "1e30", "lots", "2048PiB", "1.5.2GiB"] {
        let o = vmm_replay(&[&format!("--capacity={capacity}")]);
        assert_eq!(
            o.status.code(),
            Some(2),
            "--capacity {capacity}: {}",
            stderr(&o)
        );
        assert!(stderr(&o).contains("--capacity"), "{}", stderr(&o));
    }
    let o = vmm_replay(&["--allocators", "magic"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown allocator \"magic\""),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("pytorch-expandable"),
        "lists the known ones"
    );
    let o = vmm_replay(&["--plot", "out.txt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(".svg or .png"), "{}", stderr(&o));
    let a = file("write-several", "a.csv", &small_log());
    let b = file("write-several", "b.csv", &small_log());
    let out = a.with_file_name("out.vmmtrace");
    let o = vmm_replay(&[
        "--write-trace",
        out.to_str().unwrap(),
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("exactly one trace"), "{}", stderr(&o));
}

/// Issue 21, item 3: inputs that are not what they claim are refused by the tool with one line
/// naming the file, the entry and what was expected (they replayed with exit 0, or failed in the
/// replay naming only the trace).
#[test]
fn inputs_that_are_not_what_they_claim() {
    refused(
        "claims",
        "empty.pickle",
        b"",
        "the file is empty: expected a pytorch memory snapshot (pickle), an rmm log (csv) or a vmm-alloc trace",
    );
    // pickle.dumps([1, 2, 3], protocol=4)
    refused(
        "claims",
        "ints.pickle",
        b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00]\x94(K\x01K\x02K\x03e.",
        "item 0 of the top-level list is a int, expected a segment",
    );
    let header_only = b"Thread,Time,Action,Pointer,Size,Stream\n";
    refused(
        "claims",
        "header.csv",
        header_only,
        "line 1: the header is the only line",
    );
    let double = rmm_csv(&[
        ("allocate", 0x10, MIB, 0),
        ("free", 0x10, MIB, 0),
        ("free", 0x10, MIB, 0),
    ]);
    refused(
        "claims",
        "double.csv",
        &double,
        "line 4: free of pointer 0x10",
    );
}

/// What a reader skips on purpose is printed after the table and carried in `--json`.
#[test]
fn skipped_lines_are_counted_in_the_summary_and_the_json() {
    let log = rmm_csv(&[
        ("allocate", 0x10, MIB, 0),
        ("allocate failure", 0, 1 << 40, 0),
        ("allocate", 0x20, 0, 0),
        ("free", 0x20, 0, 0),
        ("free", 0x10, MIB, 0),
    ]);
    let path = file("skipped", "skipped.csv", &log);
    let path = path.to_str().unwrap();
    let o = vmm_replay(&["--allocators", "classic", path]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "Skipped on purpose (understood, not needed to replay):\n  skipped: 1 allocate failure lines, 1 zero-byte allocations\n"
        ),
        "{}",
        stdout(&o)
    );
    let report = replay_json(&["--allocators", "classic", path]);
    let trace = &report["traces"][0];
    assert_eq!(trace["skipped"]["allocate failure lines"], 1);
    assert_eq!(trace["skipped"]["zero-byte allocations"], 1);
    assert_eq!(trace["events"], 2);
}

#[test]
fn an_unknown_workload_lists_every_workload_including_the_mechanism_ones() {
    let o = vmm_replay(&["--workload", "no-such-workload"]);
    assert!(!o.status.success(), "an unknown workload must fail");
    let err = stderr(&o);
    for name in ["transformer-training", "rmm-random", "small-after-large"] {
        assert!(err.contains(name), "the message lists {name}: {err}");
    }
    // The mechanism workload it names is one the CLI runs.
    let report = replay_json(&["--workload", "small-after-large"]);
    assert_eq!(report["traces"].as_array().map(Vec::len), Some(1));
}
