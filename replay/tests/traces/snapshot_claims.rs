//! Snapshots that are not what they claim (issue 21, item 3): each is refused with a message
//! naming the entry and what was expected, or, where the input is understood and skipped on
//! purpose, read with the skipped entries counted in `Trace::skipped`.

use vmm_replay::pickle::Value;
use vmm_replay::snapshot::read_snapshot;

use crate::snapshot_synthetic::{block, e, segment, snapshot};
use crate::writer::{dict, dumps, i, list, s};

/// The reader's message for `bytes`, which it must refuse.
fn refusal(bytes: &[u8]) -> String {
    match read_snapshot(bytes, "claims") {
        Ok(t) => panic!("expected a refusal, read {t:?}"),
        Err(e) => {
            assert_eq!(e.file, "claims");
            e.message
        }
    }
}

fn assert_says(message: &str, parts: &[&str]) {
    for p in parts {
        assert!(message.contains(p), "{p:?} not in: {message}");
    }
}

/// A pickle whose memo makes it a tree of `16^levels` leaves in a few hundred bytes: level 0 is
/// `[0]`, each level a list of 16 memo references to the level below.
fn memo_bomb(levels: u8) -> Vec<u8> {
    let mut p = b"\x80\x04]\x94K\x00a".to_vec();
    for k in 1..=levels {
        // The level below stays in the memo only.
        p.extend_from_slice(b"0(");
        for _ in 0..16 {
            p.extend_from_slice(&[b'h', k - 1]);
        }
        p.extend_from_slice(b"l\x94");
    }
    p.push(b'.');
    p
}

/// Regression: `[1, 2, 3]` was read as a bare list of segments with none on it, an empty
/// snapshot that replayed with exit 0.
#[test]
fn a_bare_list_of_non_segments_is_refused() {
    let m = refusal(&dumps(&list(vec![i(1), i(2), i(3)])));
    assert_says(
        &m,
        &[
            "item 0 of the top-level list",
            "is a int",
            "expected a segment",
        ],
    );
    // The same inside a snapshot dict.
    let m = refusal(&dumps(&dict(vec![("segments", list(vec![s("x")]))])));
    assert_says(&m, &["item 0 of \"segments\" is a str"]);
}

/// Regression: a memo bomb of 16^30 leaves was read as an empty snapshot. It is refused without
/// being expanded (the reader shares memoized values), wherever it sits.
#[test]
fn a_memo_bomb_is_refused_without_expanding_it() {
    let bomb = memo_bomb(30);
    assert!(bomb.len() < 1200, "{} bytes", bomb.len());
    let m = refusal(&bomb);
    assert_says(&m, &["item 0 of the top-level list is a list"]);
    // As the trace entries of a device: entry 0 is a list, not an entry.
    // No memo key before the bomb's own: they number from 0.
    let mut in_traces = b"\x80\x04}\x8c\x0ddevice_traces".to_vec();
    in_traces.extend_from_slice(&bomb[2..bomb.len() - 1]);
    in_traces.extend_from_slice(b"s.");
    let m = refusal(&in_traces);
    assert_says(&m, &["device 0: entry 0 is a list", "expected a dict"]);
}

/// Regression: an unknown action was skipped silently.
#[test]
fn an_unknown_action_is_refused_naming_it_and_the_known_ones() {
    let bytes = snapshot(
        vec![],
        vec![vec![e("alloc", 0x1000, 512), e("reticulate", 0x1000, 512)]],
        None,
    );
    let m = refusal(&bytes);
    assert_says(
        &m,
        &[
            "device 0: entry 1: unknown action \"reticulate\"",
            "alloc, free_requested, free_completed, segment_alloc",
            "snapshot, user_defined, annotate",
        ],
    );
}

#[test]
fn entries_without_a_readable_action_are_refused() {
    let no_action = dict(vec![("addr", i(0x1000)), ("size", i(512))]);
    let m = refusal(&snapshot(vec![], vec![vec![no_action]], None));
    assert_says(&m, &["device 0: entry 0 has no \"action\""]);
    let int_action = dict(vec![("action", i(3)), ("addr", i(0x1000))]);
    let m = refusal(&snapshot(vec![], vec![vec![int_action]], None));
    assert_says(&m, &["entry 0: \"action\" is a int, expected a string"]);
    let m = refusal(&snapshot(
        vec![],
        vec![vec![e("alloc", 0x1000, 512), i(7)]],
        None,
    ));
    assert_says(&m, &["device 0: entry 1 is a int, expected a dict"]);
    let no_addr = dict(vec![("action", s("free_completed")), ("size", i(512))]);
    let m = refusal(&snapshot(vec![], vec![vec![no_addr]], None));
    assert_says(&m, &["entry 0: free_completed without an integer \"addr\""]);
}

/// Regression: an alloc of 0 bytes was read, and its replay failed naming the trace only.
#[test]
fn an_empty_request_is_refused_naming_the_entry() {
    let bytes = snapshot(
        vec![],
        vec![vec![], vec![e("alloc", 0x1000, 512), e("alloc", 0x2000, 0)]],
        None,
    );
    let m = refusal(&bytes);
    assert_says(&m, &["device 1: entry 1: alloc of 0 bytes"]);
}

#[test]
fn a_double_free_is_refused_naming_both_entries() {
    let bytes = snapshot(
        vec![],
        vec![vec![
            e("alloc", 0x1000, 512),
            e("free_completed", 0x1000, 512),
            e("free_completed", 0x1000, 512),
        ]],
        None,
    );
    let m = refusal(&bytes);
    assert_says(
        &m,
        &["entry 2: free_completed of address 0x1000 that entry 1"],
    );
    // A free of a block live before recording began, once, is not one: that block is live at
    // the start.
    let bytes = snapshot(vec![], vec![vec![e("free_completed", 0x1000, 512)]], None);
    let t = &read_snapshot(&bytes, "t").unwrap()[0];
    assert_eq!(
        (t.initial.len(), t.events.len(), t.skipped_frees),
        (1, 1, 0)
    );
}

#[test]
fn blocks_that_are_not_blocks_are_refused() {
    let seg = |blocks| segment(0, 0x1000_0000, 2 << 20, blocks);
    let m = refusal(&snapshot(vec![seg(vec![i(1)])], vec![], None));
    assert_says(&m, &["segment 0: block 0 is a int, expected a dict"]);
    let m = refusal(&snapshot(
        vec![seg(vec![block(0x1000_0000, 2 << 20, 0, "sleeping")])],
        vec![],
        None,
    ));
    assert_says(&m, &["block 0 has state \"sleeping\"", "active_allocated"]);
}

/// `snapshot` and annotation entries carry no allocation: skipped, and counted per kind.
#[test]
fn actions_skipped_on_purpose_are_counted() {
    let annotation = dict(vec![("action", s("user_defined")), ("stream", i(0))]);
    let bytes = snapshot(
        vec![],
        vec![vec![
            e("alloc", 0x1000, 512),
            e("snapshot", 0, 512),
            annotation,
            e("snapshot", 0, 0),
            e("free_completed", 0x1000, 512),
        ]],
        None,
    );
    let t = &read_snapshot(&bytes, "t").unwrap()[0];
    assert_eq!(t.events.len(), 2);
    let skipped: Vec<(&str, u64)> = t.skipped.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        skipped,
        [("snapshot entries", 2), ("user_defined entries", 1)]
    );
}

#[test]
fn an_empty_file_says_it_is_empty() {
    let m = refusal(b"");
    assert_says(&m, &["empty", "expected a pickle"]);
    assert!(matches!(
        vmm_replay::pickle::parse(b"\x80\x04N."),
        Ok(Value::None)
    ));
}
