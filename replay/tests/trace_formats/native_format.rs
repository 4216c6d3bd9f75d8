//! The native format: round trips, compactness, and bounded, panic-free reading.

use super::*;
use crate::renumbering::same_up_to_renumbering;

/// A trace using every feature of the format, with dense ids.
fn hand_made() -> Trace {
    Trace {
        name: "hand-made \u{1f680}".into(),
        initial: vec![block(0, 1 << 30, 0), block(1, 512, u64::MAX)],
        events: vec![
            alloc(2, 4096, 0),
            alloc(3, 4096, 0x7f8a38001020),
            alloc(4, u64::MAX, 0x7f8a38001020),
            free(0),
            Event::EmptyCache,
            // A recorded OOM: the request the traced allocator failed.
            Event::FailedAlloc {
                size: 3 << 30,
                stream: 0x7f8a38001020,
            },
            alloc(5, 1, 0),
            alloc(6, 4096, 5),
            free(3),
            alloc(7, 1 << 62, 0x7f8a38001020),
            free(7),
            free(8), // foreign: no block or allocation holds it
            free(9),
            free(8),
            free(2),
            Event::EmptyCache,
            Event::FailedAlloc {
                size: 512,
                stream: 0,
            },
        ],
        start: StartState::Warm,
        skipped_frees: 17,
        recorded: Some(Recorded {
            peak_reserved_bytes: 80 << 30,
            segment_allocs: 3,
            segment_frees: u64::MAX,
        }),
        alloc_conf: Some("expandable_segments:True,max_split_size_mb:128".into()),
        skipped: [
            ("snapshot entries".to_string(), 9),
            ("zero-byte allocations".into(), 0),
        ]
        .into(),
    }
}

fn minimal(name: &str) -> Trace {
    Trace {
        name: name.into(),
        initial: vec![],
        events: vec![],
        start: StartState::Empty,
        skipped_frees: 0,
        recorded: None,
        alloc_conf: None,
        skipped: Default::default(),
    }
}

#[test]
fn native_round_trips_hand_made_traces_exactly() {
    let mut near = minimal("");
    near.start = StartState::NearEmpty;
    near.recorded = Some(Recorded::default());
    let mut conf_only = minimal("c");
    conf_only.alloc_conf = Some(String::new());
    for t in [hand_made(), minimal("empty"), near, conf_only] {
        let bytes = write_native(&t);
        assert!(bytes.starts_with(vmm_replay::native::MAGIC));
        assert_eq!(read_native(&bytes, "x").unwrap(), t);
    }
}

#[test]
fn native_renumbers_sparse_ids_and_is_idempotent() {
    let mut t = hand_made();
    t.initial[0].id = 1000;
    t.initial[1].id = 7;
    t.events = vec![
        alloc(u64::MAX, 10, 0),
        free(42), // freed before it is allocated: foreign
        alloc(42, 20, 0),
        free(7),
        alloc(3, 10, 1),
        free(u64::MAX),
        free(999),       // foreign
        alloc(7, 30, 1), // reuses an id freed above
        free(7),
        free(42),
        free(1000),
        free(999),
    ];
    let once = read_native(&write_native(&t), "x").unwrap();
    same_up_to_renumbering(&t, &once);
    let ids: Vec<u64> = once.initial.iter().map(|b| b.id).collect();
    assert_eq!(ids, [0, 1]);
    assert_eq!(once.events[0], alloc(2, 10, 0));
    assert_eq!(
        once.events[1],
        free(6),
        "first foreign id is 2 initial + 4 allocs"
    );
    let bytes = write_native(&once);
    assert_eq!(bytes, write_native(&t));
    assert_eq!(read_native(&bytes, "x").unwrap(), once);
}

#[test]
fn native_round_trips_workloads_compactly() {
    for t in workloads::builtin() {
        let bytes = write_native(&t);
        let per_event = bytes.len() as f64 / t.events.len() as f64;
        println!(
            "{}: {} events, {} bytes, {per_event:.2} B/event",
            t.name,
            t.events.len(),
            bytes.len()
        );
        assert_eq!(read_native(&bytes, "x").unwrap(), t);
        let limit = if t.name.starts_with("rmm-random") {
            3.0
        } else {
            1.6
        };
        assert!(per_event <= limit, "{}: {per_event:.2} B/event", t.name);
    }
}

#[test]
fn native_file_variants() {
    let path = temp_path("trace.vmmtrace");
    let t = hand_made();
    write_native_file(&path, &t).unwrap();
    assert_eq!(read_native_file(&path).unwrap(), t);
    std::fs::write(&path, b"VMMTRACE").unwrap();
    let e = read_native_file(&path).unwrap_err();
    assert_eq!(e.file, path.display().to_string());
    std::fs::remove_file(&path).unwrap();
    assert!(message(read_native_file(&path)).contains("cannot read"));
    let dir = std::env::temp_dir();
    assert!(message(write_native_file(&dir, &t)).contains("cannot write"));
}

fn native_err(bytes: &[u8]) -> TraceError {
    match read_native(bytes, "n") {
        Ok(t) => panic!("expected an error, read {t:?}"),
        Err(e) => e,
    }
}

#[test]
fn native_truncated_at_every_length_is_an_error_naming_the_offset() {
    let bytes = write_native(&hand_made());
    for len in 0..bytes.len() {
        let e = native_err(&bytes[..len]);
        assert_eq!(e.file, "n");
        if len >= 8 {
            assert!(e.message.starts_with("offset "), "{len}: {e}");
            assert!(e.message.contains("truncated"), "{len}: {e}");
        }
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(message(read_native(&longer, "n")).contains("1 bytes after the end"));
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Replaces the checksum, so corrupt bodies reach the decoder.
fn reseal(bytes: &mut [u8]) {
    let n = bytes.len() - 8;
    let sum = fnv1a(&bytes[..n]);
    bytes[n..].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn native_bit_flips_never_panic() {
    let mut t = hand_made();
    t.events.extend(
        workloads::rmm_random(3, 1 << 20, 300)
            .events
            .iter()
            .map(|e| match *e {
                Event::Alloc { id, size, stream } => alloc(id + 100, size, stream),
                Event::Free { id } => free(id + 100),
                Event::EmptyCache => Event::EmptyCache,
                e @ Event::FailedAlloc { .. } => e,
            }),
    );
    let bytes = write_native(&t);
    same_up_to_renumbering(&t, &read_native(&bytes, "n").unwrap());
    for bit in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        // The checksum catches every single flip ...
        assert!(read_native(&b, "n").is_err(), "bit {bit}");
        // ... and the decoder survives whatever it lets through.
        if b.len() >= 8 {
            reseal(&mut b);
            let _ = read_native(&b, "n");
        }
    }
}

/// A header up to the initial count, for hand-crafted bodies.
fn header(version: u8) -> Vec<u8> {
    let mut b = b"VMMTRACE".to_vec();
    b.extend([version, 1, b'n', 0, 0, 0]);
    b
}

fn sealed(mut body: Vec<u8>) -> Vec<u8> {
    body.extend([0; 8]);
    reseal(&mut body);
    body
}

#[test]
fn native_rejects_bad_headers_and_claims() {
    assert!(native_err(b"").message.contains("the file is empty"));
    assert!(native_err(b"VMMTRAC").message.contains("magic"));
    assert!(native_err(b"PK\x03\x04....").message.contains("magic"));
    let e = native_err(&sealed(header(2)));
    assert!(e.message.contains("unsupported version 2"), "{e}");

    let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f];
    let claims = |prefix: &[u8], tail: &[u8]| {
        let mut b = header(1);
        b.extend(prefix);
        b.extend(tail);
        native_err(&sealed(b)).message
    };
    // Initial blocks, events, allocations: each more than the rest could hold.
    assert!(claims(&[], &huge).contains("initial blocks"));
    assert!(claims(&[0], &huge).contains("claims"));
    assert!(claims(&[0, 2], &[3, 0]).contains("3 allocations among 2 events"));
    // Name length.
    let mut b = b"VMMTRACE\x01".to_vec();
    b.extend(huge);
    assert!(native_err(&sealed(b)).message.contains("bytes of name"));
    // A varint longer than 128 bits.
    let mut b = header(1);
    b.extend([0x80; 20]);
    assert!(native_err(&sealed(b)).message.contains("overflows"));
    // Ops that point nowhere.
    let ops = |ops: &[u8], events: u8, allocs: u8| {
        let mut b = header(1);
        b.extend([0, events, allocs]);
        b.extend(ops);
        native_err(&sealed(b)).message
    };
    assert!(ops(&[0], 1, 1).contains("size index 0 of 0"));
    assert!(ops(&[1], 1, 0).contains("frees 0 back, only 0 allocated"));
    assert!(ops(&[(3 + 1) << 2 | 3], 1, 1).contains("stream index 1 of 1"));
    assert!(ops(&[4 << 2 | 2, 4 << 2 | 2], 2, 1).contains("more than 1 allocations"));
    assert!(ops(&[4 << 2 | 2], 1, 0).contains("more than 0 allocations"));
    assert!(ops(&[3], 1, 1).contains("0 allocations, but the header claims 1"));
    // A foreign free whose index runs into the checksum.
    assert!(ops(&[1 << 2 | 3], 1, 0).starts_with("offset "));
    let e = ops(&[9 << 2 | 3], 1, 0);
    assert!(e.contains("stream index 6"), "{e}");
    // Unknown start state and flags.
    let mut b = b"VMMTRACE\x01\x00\x05".to_vec();
    b.extend([0; 12]);
    assert!(message(read_native(&sealed(b), "n")).contains("unknown start state 5"));
    let mut b = b"VMMTRACE\x01\x00\x00\x00\x10".to_vec();
    b.extend([0; 12]);
    assert!(native_err(&sealed(b)).message.contains("unknown flags"));
    // Failed requests (flag bit 2) out of order, or past the events.
    let mut b = b"VMMTRACE\x01\x00\x00\x00\x04\x02\x01\x05\x00\x01\x05\x00".to_vec();
    b.extend([0; 12]);
    let e = native_err(&sealed(b)).message;
    assert!(e.contains("failed request positions must increase"), "{e}");
    // One failed request at position 3 of a trace with no other events.
    let b = b"VMMTRACE\x01\x00\x00\x00\x04\x01\x03\x05\x00\x00\x00\x00".to_vec();
    let e = native_err(&sealed(b)).message;
    assert!(e.contains("past the 1 events"), "{e}");
    // A bad checksum on an otherwise good file.
    let mut good = write_native(&hand_made());
    let n = good.len();
    good[n - 1] ^= 0x80;
    assert!(native_err(&good).message.contains("checksum"));
}

/// Foreign frees must number their ids in order of first appearance, as the writer does: a file
/// whose first foreign free says index 5 read as a trace that `write_native` renumbered, so
/// reading it back gave another trace (found by `fuzz/`, campaign `readers`).
#[test]
fn native_refuses_foreign_indexes_out_of_order() {
    // After the header: no initial blocks, 2 events, 1 allocation: an allocation of a new size,
    // 4 bytes (tag 2), then a foreign free (tag 3, payload 1) of index `j`.
    let file = |j: u8| {
        let mut body = header(1);
        body.extend([0, 2, 1, 4 << 2 | 2, 1 << 2 | 3, j]);
        sealed(body)
    };
    let first = read_native(&file(0), "x").unwrap();
    assert_eq!(first.events[1], free(1));
    assert_eq!(read_native(&write_native(&first), "x").unwrap(), first);
    let err = message(read_native(&file(5), "x"));
    assert!(err.contains("foreign"), "{err}");
}
