//! RMM logs and native traces that are not what they claim (issue 21, item 3): each is refused
//! with a message naming the line or byte and what was expected, or, where understood and skipped
//! on purpose, read with the skipped lines counted in `Trace::skipped`.

use super::*;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

/// Regression: an empty file said only "no header"; a header alone was an empty trace that
/// replayed with exit 0.
#[test]
fn rmm_logs_with_nothing_in_them_are_refused() {
    assert_eq!(
        csv_err(""),
        "the file is empty: expected an RMM log, starting with its CSV header \
         (Thread,Time,Action,Pointer,Size,Stream)"
    );
    let m = csv_err(&format!("\n{HEADER}\n\n"));
    assert!(m.starts_with("line 2: the header is the only line"), "{m}");
}

#[test]
fn rmm_double_frees_are_refused_naming_both_lines() {
    let text = format!(
        "{HEADER}1,t,allocate,0x10,8,0\n1,t,free,0x10,8,0\n1,t,allocate,0x10,8,0\n\
         1,t,free,0x10,8,0\n1,t,free,0x10,8,0\n"
    );
    assert_eq!(
        csv_err(&text),
        "line 6: free of pointer 0x10, which line 5 already freed with no allocate there in \
         between (a double free)"
    );
    // Two frees of an allocation made before logging began: the second is the double.
    let text = format!("{HEADER}1,t,free,0x20,8,0\n1,t,free,0x20,8,0\n");
    assert!(csv_err(&text).starts_with("line 3: free of pointer 0x20, which line 2"));
}

#[test]
fn rmm_lines_skipped_on_purpose_are_counted() {
    let text = format!(
        "{HEADER}1,t,allocate,0x10,0,0\n1,t,allocate failure,0x0,1099511627776,0\n\
         1,t,allocate,0x20,8,0\n1,t,free,0x10,0,0\n1,t,allocate failure,0x0,5,0\n\
         1,t,free,0x20,8,0\n"
    );
    let log = parse_rmm_csv(&text, "t").unwrap();
    assert_eq!(log.trace.events, [alloc(0, 8, 0), free(0)]);
    assert_eq!(log.allocate_failures, 2);
    let skipped: Vec<(&str, u64)> = log
        .trace
        .skipped
        .iter()
        .map(|(k, n)| (k.as_str(), *n))
        .collect();
    assert_eq!(
        skipped,
        [("allocate failure lines", 2), ("zero-byte allocations", 1)]
    );
    // Nothing skipped: an empty map, and a trace starting empty.
    let plain = read_rmm_csv(&format!("{HEADER}1,t,allocate,0x20,8,0\n"), "t").unwrap();
    assert!(plain.skipped.is_empty() && plain.start == StartState::Empty);
}

#[test]
fn rmm_unknown_actions_list_the_known_ones() {
    assert_eq!(
        csv_err(&format!("{HEADER}1,t,reallocate,0x20,5,0\n")),
        "line 2: unknown action \"reallocate\" (expected allocate, allocate failure, free or \
         deallocate)"
    );
}

/// Native traces carry the skipped counts through the round trip, and refuse empty requests.
#[test]
fn native_refuses_empty_requests_and_unordered_skip_kinds() {
    let mut t = workloads::rmm_random(1, 1 << 20, 20);
    t.skipped.insert("snapshot entries".into(), 3);
    let good = write_native(&t);
    assert_eq!(read_native(&good, "x").unwrap(), t);
    assert!(message(read_native(b"", "x")).contains("the file is empty"));

    // An allocation of 0 bytes, a failed request of 0 bytes, an initial block of 0 bytes.
    let mut zero = t.clone();
    zero.events.push(alloc(1000, 0, 0));
    let m = message(read_native(&write_native(&zero), "x"));
    assert!(m.contains("an allocation of 0 bytes"), "{m}");
    let mut failed = t.clone();
    failed
        .events
        .push(Event::FailedAlloc { size: 0, stream: 0 });
    let m = message(read_native(&write_native(&failed), "x"));
    assert!(m.contains("failed request size is 0"), "{m}");
    let mut initial = t.clone();
    initial.initial.push(block(0, 0, 0));
    let m = message(read_native(&write_native(&initial), "x"));
    assert!(m.contains("initial block size is 0"), "{m}");

    // Two skipped kinds out of order (a hand-edited or corrupt file) would read back merged.
    let mut two = t.clone();
    two.skipped.insert("zz".into(), 1);
    let mut bytes = write_native(&two);
    let at = |b: &[u8], pat: &[u8]| b.windows(pat.len()).position(|w| w == pat).unwrap();
    let (a, z) = (at(&bytes, b"snapshot entries"), at(&bytes, b"zz"));
    // Swap the two names' bytes for the same lengths: "zz" first, then "snapshot entries".
    let mut swapped = bytes[..a - 1].to_vec();
    swapped.extend_from_slice(&[2, b'z', b'z', 1, 16]);
    swapped.extend_from_slice(b"snapshot entries");
    swapped.push(3);
    swapped.extend_from_slice(&bytes[z + 3..]);
    bytes = swapped;
    let body = bytes.len() - 8;
    let sum = bytes[..body]
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    bytes[body..].copy_from_slice(&sum.to_le_bytes());
    let m = message(read_native(&bytes, "x"));
    assert!(m.contains("skipped kinds must increase"), "{m}");
}
