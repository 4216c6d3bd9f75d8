//! Replays dumped as PyTorch memory snapshots: read back by our reader (and by
//! `shared/tools/trace_summary.py` in `tests/shared_traces`), written with only
//! the opcodes pytorch.org/memory_viz's unpickler knows, and self-consistent (the trace undone
//! from the dumped segments starts from nothing).

use std::collections::HashMap;
use std::rc::Rc;

use vmm_replay::dump::pickle_writer::{dumps, PickleWriteError, PROTOCOL};
use vmm_replay::dump::{Action, SnapshotDump};
use vmm_replay::pickle::{parse, Value};
use vmm_replay::replay::{replay, Policy, ReplayOptions, ReplayOutcome};
use vmm_replay::snapshot::read_snapshot;
use vmm_replay::{workloads, Event, StartState, Trace};

use crate::pressure::{pressure, tight_capacity};
use crate::writer::{dict, i, list, s};

const MB: u64 = 1 << 20;

fn recording(capacity: usize) -> ReplayOptions {
    ReplayOptions {
        capacity,
        record_history: true,
        ..ReplayOptions::default()
    }
}

/// The allocations and frees of `events`, with ids replaced by allocation ordinals; frees of ids
/// that are not live are left out, as the replay skips them, and so are `empty_cache()` calls
/// (the reader infers those from unmaps, which it cannot always tell from an allocation's retry).
fn allocs_and_frees(events: &[Event]) -> Vec<(bool, u64, u64)> {
    let mut ordinal: HashMap<u64, u64> = HashMap::new();
    let mut out = Vec::new();
    let mut next = 0;
    for e in events {
        match *e {
            Event::Alloc { id, size, stream } => {
                ordinal.insert(id, next);
                out.push((true, size, stream));
                next += 1;
            }
            Event::Free { id } => {
                if let Some(n) = ordinal.remove(&id) {
                    out.push((false, n, 0));
                }
            }
            Event::EmptyCache | Event::FailedAlloc { .. } => {}
        }
    }
    out
}

/// Replays `t` recording history, checks the dump reads back as the same trace from an empty
/// start, and returns the outcome and the pickle.
fn round_trip(t: &Trace, policy: Policy, capacity: usize) -> (ReplayOutcome, Vec<u8>) {
    let what = format!("{} / {}", t.name, policy.name());
    let outcome = replay(t, policy, &recording(capacity)).unwrap();
    let dump = outcome.history.as_ref().expect("history was recorded");
    let bytes = dump.to_pickle().unwrap();
    let back = read_snapshot(&bytes, "dump").unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(back.len(), 1, "{what}: one device");
    let b = &back[0];
    assert_eq!(b.start, StartState::Empty, "{what}: start state");
    assert!(b.initial.is_empty() && b.skipped_frees == 0, "{what}");
    if outcome.ooms == 0 {
        assert_eq!(
            allocs_and_frees(&b.events),
            allocs_and_frees(&t.events),
            "{what}: the same allocations and frees, in order"
        );
    }
    let allocs = |e: &[Event]| {
        e.iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count()
    };
    let ooms = dump
        .entries
        .iter()
        .filter(|e| e.action == Action::Oom)
        .count();
    assert_eq!(ooms as u64, outcome.ooms, "{what}: one oom entry per OOM");
    assert_eq!(allocs(&b.events) + ooms, allocs(&t.events), "{what}");
    assert_eq!(
        b.peak_live_bytes(),
        outcome.peak_live_bytes,
        "{what}: peak live"
    );
    let recorded = b
        .recorded
        .expect("segments and segment events are recorded");
    assert_eq!(
        recorded.peak_reserved_bytes, dump.peak_mapped_bytes,
        "{what}: peak reserved read back = peak mapped during the replay"
    );
    let count = |a: Action| dump.entries.iter().filter(|e| e.action == a).count() as u64;
    assert_eq!(recorded.segment_allocs, count(Action::SegmentMap), "{what}");
    assert_eq!(
        recorded.segment_frees,
        count(Action::SegmentUnmap),
        "{what}"
    );
    if policy == Policy::PytorchExpandable {
        // It caches no handles: what it holds is what it maps.
        assert_eq!(
            outcome.peak_reserved_bytes, dump.peak_mapped_bytes,
            "{what}"
        );
    }
    assert!(
        b.alloc_conf
            .as_deref()
            .is_some_and(|c| c.contains("expandable_segments:True")),
        "{what}: {:?}",
        b.alloc_conf
    );
    check_segments(&parse(&bytes).unwrap(), dump, &what);
    (outcome, bytes)
}

/// The dumped segments: sorted, each one mapped run tiled by its blocks, sizes that add up, and
/// in all as many bytes as the allocator has mapped at the end.
fn check_segments(v: &Value, dump: &SnapshotDump, what: &str) {
    let num = |d: &Value, k: &str| d.get(k).and_then(Value::as_u64).unwrap();
    let segments = v.get("segments").and_then(Value::as_seq).unwrap();
    let mut total = 0;
    let mut last_end = 0;
    for seg in segments {
        let (address, size) = (num(seg, "address"), num(seg, "total_size"));
        assert!(address >= last_end, "{what}: segments sorted and disjoint");
        last_end = address + size;
        assert_eq!(seg.get("is_expandable"), Some(&Value::Bool(true)));
        let mut at = address;
        let (mut allocated, mut active, mut requested) = (0, 0, 0);
        for b in seg.get("blocks").and_then(Value::as_seq).unwrap() {
            assert_eq!(num(b, "address"), at, "{what}: blocks tile the segment");
            at += num(b, "size");
            match b.get("state").and_then(Value::as_str).unwrap() {
                "active_allocated" => {
                    allocated += num(b, "size");
                    active += num(b, "size");
                    requested += num(b, "requested_size");
                }
                "active_pending_free" => {
                    active += num(b, "size");
                    requested += num(b, "requested_size");
                }
                state => assert_eq!(state, "inactive"),
            }
        }
        assert_eq!(at, last_end, "{what}: blocks fill the segment");
        assert_eq!(num(seg, "allocated_size"), allocated, "{what}");
        assert_eq!(num(seg, "active_size"), active, "{what}");
        assert_eq!(num(seg, "requested_size"), requested, "{what}");
        total += size;
    }
    let mapped: usize = dump
        .final_state
        .segments
        .iter()
        .map(|s| s.mapped_size)
        .sum();
    assert_eq!(
        total, mapped as u64,
        "{what}: the dump draws every mapped byte"
    );
}

#[test]
fn replays_under_pressure_round_trip_through_the_reader() {
    let t = pressure();
    let cap = tight_capacity(&t);
    for policy in Policy::EXPANDABLE {
        let (outcome, _) = round_trip(&t, policy, cap);
        assert_eq!(outcome.ooms, 0, "{}", policy.name());
        let dump = outcome.history.unwrap();
        let unmaps = dump
            .entries
            .iter()
            .filter(|e| e.action == Action::SegmentUnmap);
        // Unmaps both in the middle (pressure) and at the end (empty_cache).
        let last = dump.entries.last().map(|e| e.time_us);
        assert!(
            unmaps.clone().any(|e| Some(e.time_us) != last) && unmaps.count() > 1,
            "{}: the test must exercise unmaps under pressure",
            policy.name()
        );
        assert!(
            dump.entries
                .windows(2)
                .all(|w| w[0].time_us <= w[1].time_us),
            "time_us is monotonic"
        );
    }
}

#[test]
fn builtin_workload_round_trips_through_the_reader() {
    let t = workloads::transformer_training(1);
    for policy in Policy::EXPANDABLE {
        round_trip(&t, policy, 80 << 30);
    }
}

#[test]
fn without_record_history_nothing_is_kept() {
    let o = replay(&pressure(), Policy::Expandable, &ReplayOptions::default()).unwrap();
    assert!(o.history.is_none());
}

#[test]
fn ooms_are_recorded_and_still_round_trip() {
    let mut t = pressure();
    t.name = "pressure-48MiB".into();
    for policy in Policy::EXPANDABLE {
        let (outcome, bytes) = round_trip(&t, policy, 48 << 20);
        assert!(outcome.ooms > 0, "{}: 48 MiB is too small", policy.name());
        let root = parse(&bytes).unwrap();
        let traces = root.get("device_traces").and_then(Value::as_seq).unwrap();
        let entries = traces[0].as_seq().unwrap();
        let ooms: Vec<&Value> = entries
            .iter()
            .filter(|e| e.get("action").and_then(Value::as_str) == Some("oom"))
            .collect();
        assert_eq!(ooms.len() as u64, outcome.ooms);
        for e in ooms {
            // PyTorch's layout: device_free instead of addr, and the rounded size.
            assert!(e.get("addr").is_none());
            let free = e.get("device_free").and_then(Value::as_u64).unwrap();
            assert!(free <= 48 * MB);
            let size = e.get("size").and_then(Value::as_u64).unwrap();
            assert!(
                size % 512 == 0 && [20 * MB, 60 * MB + 512].contains(&size),
                "{size}"
            );
        }
    }
}

/// The opcodes memory_viz's unpickler accepts and this writer may use, with the length of their
/// fixed argument, or `None` for a 1- or 4-byte length followed by that many bytes.
fn allowed(op: u8) -> Option<(&'static str, usize, Option<usize>)> {
    Some(match op {
        0x80 => ("PROTO", 1, None),
        b'(' => ("MARK", 0, None),
        b'}' => ("EMPTY_DICT", 0, None),
        b's' => ("SETITEM", 0, None),
        b'u' => ("SETITEMS", 0, None),
        b']' => ("EMPTY_LIST", 0, None),
        b'a' => ("APPEND", 0, None),
        b'e' => ("APPENDS", 0, None),
        b')' => ("EMPTY_TUPLE", 0, None),
        b't' => ("TUPLE", 0, None),
        0x85..=0x87 => ("TUPLE1-3", 0, None),
        b'J' => ("BININT", 4, None),
        b'K' => ("BININT1", 1, None),
        b'M' => ("BININT2", 2, None),
        0x8a => ("LONG1", 0, Some(1)),
        b'G' => ("BINFLOAT", 8, None),
        b'N' => ("NONE", 0, None),
        0x88 => ("NEWTRUE", 0, None),
        0x89 => ("NEWFALSE", 0, None),
        0x8c => ("SHORT_BINUNICODE", 0, Some(1)),
        b'X' => ("BINUNICODE", 0, Some(4)),
        b'.' => ("STOP", 0, None),
        _ => return None,
    })
}

/// Walks the opcode stream: every opcode allowed, the protocol at most 4, `STOP` last.
fn check_opcodes(bytes: &[u8]) {
    assert_eq!(bytes.first(), Some(&0x80), "starts with PROTO");
    let protocol = bytes[1];
    assert!(
        (2..=4).contains(&protocol),
        "protocol {protocol}: memory_viz reads 2 to 4"
    );
    let mut pos = 0;
    loop {
        let op = bytes[pos];
        let (name, fixed, len_width) =
            allowed(op).unwrap_or_else(|| panic!("opcode 0x{op:02x} at byte {pos} is not allowed"));
        pos += 1 + fixed;
        if let Some(w) = len_width {
            let mut len = [0u8; 8];
            len[..w].copy_from_slice(&bytes[pos..pos + w]);
            pos += w + u64::from_le_bytes(len) as usize;
        }
        if name == "STOP" {
            assert_eq!(pos, bytes.len(), "STOP is the last byte");
            return;
        }
    }
}

#[test]
fn dumps_use_only_opcodes_memory_viz_knows() {
    let (_, bytes) = round_trip(&pressure(), Policy::PytorchExpandable, 80 << 30);
    assert_eq!(bytes[1], PROTOCOL);
    check_opcodes(&bytes); // checks the protocol byte is 2 to 4, too
                           // Every kind of value the writer knows, containers past one batch of 1000 items included.
    let many: Vec<Value> = (0..2500).map(|n| i(n * 1_000_003)).collect();
    let pairs: Vec<(Value, Value)> = (0..1500).map(|n| (s(&n.to_string()), i(n))).collect();
    let v = dict(vec![
        (
            "ints",
            list(vec![
                i(0),
                i(255),
                i(256),
                i(65535),
                i(65536),
                i(-1),
                i(i32::MIN.into()),
                i(i32::MAX as i64 + 1),
                i(i64::MIN),
                i(i64::MAX),
            ]),
        ),
        (
            "big",
            Value::BigInt(Rc::from(
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00][..],
            )),
        ),
        (
            "scalars",
            list(vec![
                Value::None,
                Value::Bool(true),
                Value::Bool(false),
                Value::Float(-2.5),
            ]),
        ),
        (
            "tuples",
            list(
                (0..6)
                    .map(|n| Value::Tuple((0..n).map(i).collect()))
                    .collect(),
            ),
        ),
        (
            "strings",
            list(vec![
                s(""),
                s("ü"),
                s(&"x".repeat(255)),
                s(&"y".repeat(256)),
            ]),
        ),
        ("many", list(many)),
        ("dict", Value::Dict(pairs.into())),
    ]);
    let bytes = dumps(&v).unwrap();
    check_opcodes(&bytes);
    assert_eq!(
        parse(&bytes).unwrap(),
        v,
        "the reader reads the writer's bytes back"
    );
    assert_eq!(dumps(&v).unwrap(), bytes, "deterministic");
}

#[test]
fn writer_refuses_what_memory_viz_cannot_read() {
    let bytes = Value::Bytes(Rc::from(&b"\x00"[..]));
    assert_eq!(dumps(&list(vec![bytes])), Err(PickleWriteError::Bytes));
    let huge = Value::BigInt(Rc::from(vec![1u8; 256]));
    assert_eq!(dumps(&huge), Err(PickleWriteError::IntTooLong { len: 256 }));
    // Deep nesting is written without recursion (and read back within the reader's limit).
    let mut deep = list(vec![]);
    for _ in 0..900 {
        deep = list(vec![deep]);
    }
    assert_eq!(parse(&dumps(&deep).unwrap()).unwrap(), deep);
}
