//! Trace input the other suites do not send: RMM logs with hostile fields and layouts, and
//! pickles whose danger sits inside an otherwise well-formed snapshot.

use vmm_replay::pickle::parse;
use vmm_replay::rmm_csv::read_rmm_csv;
use vmm_replay::snapshot::read_snapshot;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

fn csv_err(text: &str) -> String {
    match read_rmm_csv(text, "t") {
        Ok(t) => panic!("expected an error, read {} events", t.events.len()),
        Err(e) => e.message,
    }
}

#[test]
fn rmm_logs_with_hostile_fields() {
    let big = "9".repeat(1 << 20);
    let cases = [
        // A NUL, a quoted field, a unicode action, a tab-separated row.
        (
            format!("{HEADER}1,t,allocate,0x10\0,8,0\n"),
            "line 2: pointer",
        ),
        (
            format!("{HEADER}1,t,\"allocate\",0x10,8,0\n"),
            "line 2: unknown action \"\\\"allocate\\\"\"",
        ),
        (
            format!("{HEADER}1,t,allocaté,0x10,8,0\n"),
            "line 2: unknown action",
        ),
        (
            format!("{HEADER}1\tt\tallocate\t0x10\t8\t0\n"),
            "line 2: expected at least 6 fields, found 1",
        ),
        // A megabyte-long number: refused by value, not by running out of memory.
        (
            format!("{HEADER}1,t,allocate,0x10,{big},0\n"),
            "line 2: size",
        ),
        (
            format!("{HEADER}1,t,allocate,0x{big},8,0\n"),
            "line 2: pointer",
        ),
        (
            format!("{HEADER}1,t,allocate,0x10,8,{big}\n"),
            "line 2: stream",
        ),
        // The error is on the line where it is, however far down.
        (
            format!("{HEADER}{}1,t,allocate,0x10,x,0\n", "\n".repeat(100_000)),
            "line 100002: size",
        ),
    ];
    for (text, want) in &cases {
        let m = csv_err(text);
        assert!(m.contains(want), "{want}: {}", &m[..m.len().min(200)]);
        assert!(
            m.len() < 400,
            "the message does not echo megabytes: {} bytes",
            m.len()
        );
    }
    // A header naming a column twice uses the first; a header alone is refused (claims.rs).
    let dup = "Action,Pointer,Size,Size\nallocate,0x10,8,x\n";
    assert_eq!(read_rmm_csv(dup, "t").unwrap().events.len(), 1);
    // A header of a million columns without the needed ones.
    let wide = ",".repeat(1 << 20);
    assert!(csv_err(&wide).contains("has no \"Action\" column"));
}

/// A pickle built by hand: protocol 2, a dict `{"device_traces": [[ENTRY]]}` where `ENTRY` is
/// the given opcodes.
fn snapshot_with_entry(entry: &[u8]) -> Vec<u8> {
    let mut p = b"\x80\x02}X\x0d\x00\x00\x00device_traces]]".to_vec();
    p.extend_from_slice(entry);
    p.extend_from_slice(b"aas.");
    p
}

#[test]
fn code_inside_a_well_formed_snapshot_is_refused_by_name() {
    for (entry, name) in [
        (&b"cos\nsystem\nX\x02\x00\x00\x00ls\x85R"[..], "GLOBAL"),
        (
            b"X\x02\x00\x00\x00osX\x06\x00\x00\x00system\x93",
            "STACK_GLOBAL",
        ),
        (b"N)R", "REDUCE"),
        (b"}N\x81", "NEWOBJ"),
        (b"}}b", "BUILD"),
    ] {
        let e = read_snapshot(&snapshot_with_entry(entry), "evil").unwrap_err();
        assert!(e.to_string().contains(name), "{name}: {e}");
        assert_eq!(e.file, "evil");
    }
}

#[test]
fn pickle_claims_and_keys_at_the_limits() {
    // Memo keys at the top of the range are stored sparsely, not as a 4-billion-entry table.
    let v = parse(b"\x80\x02K\x07r\xff\xff\xff\xff0j\xff\xff\xff\xff.").unwrap();
    assert_eq!(v.as_int(), Some(7));
    // A protocol the reader does not know, and a frame claiming 2^64 - 1 bytes.
    for proto in [0u8, 1, 6, 255] {
        let e = parse(&[0x80, proto, b'N', b'.']).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("unsupported pickle protocol {proto}")),
            "{e}"
        );
    }
    let mut frame = b"\x80\x04\x95".to_vec();
    frame.extend_from_slice(&u64::MAX.to_le_bytes());
    frame.extend_from_slice(b"N.");
    assert!(parse(&frame).unwrap_err().to_string().contains("FRAME"));
    // An allocation size of 2^70 in a snapshot entry (LONG1): refused by value.
    let mut long1 =
        b"}(X\x06\x00\x00\x00actionX\x05\x00\x00\x00allocX\x04\x00\x00\x00size\x8a\x09".to_vec();
    long1.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0x40]);
    long1.extend_from_slice(b"X\x04\x00\x00\x00addrK\x10u");
    let e = read_snapshot(&snapshot_with_entry(&long1), "x").unwrap_err();
    assert!(e.to_string().contains("below 2^64"), "{e}");
}

/// Regression: an RMM log field of megabytes was echoed whole into the one-line error.
#[test]
fn rmm_error_messages_stay_one_short_line() {
    let long = "x".repeat(1 << 20);
    for text in [
        format!("{HEADER}1,t,{long},0x10,8,0\n"),
        format!("{long}\n1,t,allocate,0x10,8,0\n"),
    ] {
        let m = csv_err(&text);
        assert!(
            m.len() < 200 && m.contains("(1048576 bytes)"),
            "{}",
            &m[..m.len().min(300)]
        );
    }
}
