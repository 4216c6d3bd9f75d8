//! RAPIDS RMM `logging_resource_adaptor` CSV logs.

use super::*;

#[test]
fn csv_reads_rmm_log() {
    let text = "Thread,Time,Action,Pointer,Size,Stream\n\
        140573312345856,08:54:51:215806,allocate,0x7f8a40000000,1024,0x0\n\
        140573312345856,08:54:51:215810,allocate,0x7f8a40000400,2048,0x7f8a38001020\n\
        140573312345856,08:54:51:215900,allocate failure,0x0,1099511627776,0x0\n\
        140573312345856,08:54:51:216000,free,0x7f8a40000000,1024,0x0\n\
        140573312345856,08:54:51:216001,free,0x7f0000000000,64,0x0\n\
        140573312345856,08:54:51:216002,free,0x7f8a40000400,2048,0x7f8a38001020\n";
    let log = parse_rmm_csv(text, "log").unwrap();
    assert_eq!(log.allocate_failures, 1);
    assert_eq!(log.free_size_mismatches, 0);
    let t = log.trace;
    assert_eq!(t.name, "log");
    assert_eq!(
        t.events,
        vec![
            alloc(0, 1024, 0),
            alloc(1, 2048, 0x7f8a38001020),
            free(0),
            free(1)
        ]
    );
    assert_eq!(t.skipped_frees, 1);
    assert_eq!(t.start, StartState::Warm);
    assert!(t.initial.is_empty() && t.recorded.is_none() && t.alloc_conf.is_none());
}

#[test]
fn csv_column_order_comes_from_the_header() {
    let text = "size, STREAM ,Extra,pointer,action,Thread,Time\r\n\
        \r\n\
        100,16,x,7f00,allocate,1,t\r\n\
        200,0x10,y,0x7f10,allocate,1,t\r\n\
        0,(nil),z,(nil),allocate,1,t\r\n\
        300,0,z,0x7F00,free,1,t\r\n";
    let t = read_rmm_csv(text, "t").unwrap();
    // Decimal and hexadecimal streams; a free's size is ignored (the allocation's counts); the
    // zero-byte allocation is skipped and counted.
    assert_eq!(
        t.events,
        vec![alloc(0, 100, 16), alloc(1, 200, 16), free(0)]
    );
    assert_eq!(t.skipped.get("zero-byte allocations"), Some(&1));
    assert_eq!((t.start, t.skipped_frees), (StartState::Empty, 0));
    assert_eq!(parse_rmm_csv(text, "t").unwrap().free_size_mismatches, 1);
}

#[test]
fn csv_without_stream_column_uses_stream_zero_and_tolerates_a_bom() {
    let text = "\u{feff}Action,Pointer,Size\nallocate,0x10,5\ndeallocate,0x10,5\n";
    let t = read_rmm_csv(text, "t").unwrap();
    assert_eq!(t.events, vec![alloc(0, 5, 0), free(0)]);
}

#[test]
fn csv_pointer_reused_while_live_frees_latest_first() {
    let text = "Action,Pointer,Size,Stream\n\
        allocate,0x0,8,0\nallocate,0x0,16,1\nfree,0x0,16,1\nfree,0x0,8,0\nfree,0x20,8,0\n";
    let t = read_rmm_csv(text, "t").unwrap();
    assert_eq!(
        t.events,
        vec![alloc(0, 8, 0), alloc(1, 16, 1), free(1), free(0)]
    );
    assert_eq!(t.skipped_frees, 1);
}

#[test]
fn csv_malformed_inputs_are_line_numbered_errors() {
    let h = "Thread,Time,Action,Pointer,Size,Stream\n";
    let row = "1,t,allocate,0x10,5,0\n";
    assert!(csv_err("").starts_with("the file is empty: expected an RMM log"));
    assert!(csv_err("\n  \n\r\n").starts_with("the file is blank: expected an RMM log"));
    assert!(csv_err("Thread,Time,Action,Pointer,Stream\n").contains("\"Size\""));
    assert!(csv_err("Thread,Time,Pointer,Size\n").contains("\"Action\""));
    assert!(csv_err("Action,Size\n").contains("\"Pointer\""));
    assert_eq!(
        csv_err(&format!("{h}{row}1,t,allocate,0x20,-5,0\n")),
        "line 3: size \"-5\" is not a non-negative integer"
    );
    let cases = [
        ("1,t,allocate,0x20,1152921504606846977,0", "line 2: size"),
        (
            "1,t,allocate,0x20,99999999999999999999999,0",
            "larger than 2^60",
        ),
        ("1,t,allocate,0x20,,0", "size \"\""),
        ("1,t,allocate,0x20,1e3,0", "size \"1e3\""),
        ("1,t,allocate,0x20,+5,0", "size \"+5\""),
        ("1,t,allocate,0x20", "expected at least 6 fields, found 4"),
        ("1,t,allocate,0xZZ,5,0", "pointer \"0xZZ\""),
        ("1,t,allocate,-0x20,5,0", "pointer"),
        ("1,t,allocate,0x1ffffffffffffffff,5,0", "pointer"),
        ("1,t,allocate,0x20,5,-1", "stream \"-1\""),
        ("1,t,allocate,0x20,5,0xg", "stream"),
        ("1,t,free,0x20,5,abc", "stream"),
        ("1,t,free,0x20,x,0", "size"),
        ("1,t,free,,5,0", "pointer"),
        ("1,t,reallocate,0x20,5,0", "unknown action \"reallocate\""),
    ];
    for (line, want) in cases {
        let m = csv_err(&format!("{h}{line}\n"));
        assert!(m.starts_with("line 2: ") && m.contains(want), "{line}: {m}");
    }
    // 2^60 itself is accepted.
    let max = format!("{h}1,t,allocate,0x20,1152921504606846976,0\n");
    assert_eq!(
        read_rmm_csv(&max, "t").unwrap().events,
        [alloc(0, 1 << 60, 0)]
    );
}

#[test]
fn csv_garbage_never_panics() {
    let base =
        "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,5,0x0\n1,t,free,0x10,5,0\n";
    let alphabet: Vec<char> = "0x,\n\r-+ afllocreAPSizeStream\u{e9}9(nil)"
        .chars()
        .collect();
    let mut rng = 0x1234_5678_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..20_000 {
        let mut s: Vec<char> = base.chars().collect();
        for _ in 0..1 + next() % 4 {
            let i = (next() % s.len() as u64) as usize;
            let c = alphabet[(next() % alphabet.len() as u64) as usize];
            match next() % 3 {
                0 => s[i] = c,
                1 => s.insert(i, c),
                _ => {
                    s.remove(i);
                }
            }
        }
        let text: String = s.into_iter().collect();
        let _ = read_rmm_csv(&text, "fuzz");
    }
}

#[test]
fn csv_file_variant_names_the_trace_and_the_file() {
    let path = temp_path("log.csv");
    std::fs::write(&path, "Action,Pointer,Size,Stream\nallocate,0x10,7,0\n").unwrap();
    let t = read_rmm_csv_file(&path).unwrap();
    assert_eq!(t.events, vec![alloc(0, 7, 0)]);
    assert!(t.name.ends_with("log"));
    std::fs::write(&path, "Action,Pointer,Size,Stream\nallocate,0x10,x,0\n").unwrap();
    let e = read_rmm_csv_file(&path).unwrap_err();
    assert_eq!(e.file, path.display().to_string());
    assert!(e.message.starts_with("line 2: size"), "{e}");
    std::fs::remove_file(&path).unwrap();
    assert!(message(read_rmm_csv_file(&path)).contains("cannot read"));
}

/// Reliability bug 15 (PyTorch PR #192269): an RMM log of 4,000 streams, each holding 4 KiB at
/// once, on the default 80 GiB Sim (128 TiB of addresses). Each stream needs a segment of its
/// own, and PyTorch's expandable policy reserves 90 GiB of addresses for each: from about the
/// 1,450th stream on, its requests fail with the device nearly empty. Ours reserves the request
/// alone once addresses are short (Note [Address space budget]) and serves every one.
#[test]
fn an_rmm_log_of_thousands_of_streams_outlasts_the_address_space_only_through_ours() {
    use vmm_replay::replay::{replay, Policy, ReplayOptions};
    const STREAMS: u64 = 4_000;
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for action in ["allocate", "free"] {
        for i in 0..STREAMS {
            text += &format!("1,t,{action},{:#x},4096,{}\n", 0x10000 + i * 4096, i + 1);
        }
    }
    let trace = parse_rmm_csv(&text, "streams").unwrap().trace;
    let opts = ReplayOptions::default();
    let ours = replay(&trace, Policy::Expandable, &opts).unwrap();
    let theirs = replay(&trace, Policy::PytorchExpandable, &opts).unwrap();
    assert_eq!(ours.ooms, 0, "every stream's 4 KiB is served");
    assert!(
        theirs.ooms > 2_000,
        "PyTorch's policy runs out of addresses first: {} OOMs",
        theirs.ooms
    );
    assert!(
        theirs.peak_reserved_bytes < 16 << 30,
        "with the device nearly empty"
    );
    let first = &theirs.oom_moments[0];
    assert!(
        first.address_space_exhausted && first.describe().contains("virtual address space ran out"),
        "the diagnosis names the cause: {}",
        first.describe()
    );
}
