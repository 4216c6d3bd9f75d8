//! `vmm-replay --check-classic`: our classic allocator against the one that recorded a snapshot.

use std::rc::Rc;

use vmm_replay::dump::pickle_writer::dumps;
use vmm_replay::pickle::Value;

use super::*;

fn dict(pairs: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::Str(k.into()), v))
            .collect::<Rc<[_]>>(),
    )
}

fn list(items: Vec<Value>) -> Value {
    Value::List(items.into())
}

fn int(i: u64) -> Value {
    Value::Int(i as i64)
}

/// A snapshot whose allocator made one `segment_alloc` of `segment` bytes for a 3 MiB tensor
/// that is still live at the dump.
fn snapshot(segment: u64) -> Vec<u8> {
    let base = 0x7f00_0000_0000u64;
    let entry = |action: &str, size: u64| {
        dict(vec![
            ("action", Value::Str(action.into())),
            ("addr", int(base)),
            ("size", int(size)),
            ("stream", int(0)),
        ])
    };
    let block = |addr: u64, size: u64, requested: u64, state: &str| {
        dict(vec![
            ("address", int(addr)),
            ("size", int(size)),
            ("requested_size", int(requested)),
            ("state", Value::Str(state.into())),
        ])
    };
    let tensor = 3 * MIB;
    let seg = dict(vec![
        ("device", int(0)),
        ("address", int(base)),
        ("total_size", int(segment)),
        ("stream", int(0)),
        ("segment_type", Value::Str("large".into())),
        (
            "blocks",
            list(vec![
                block(base, tensor, tensor, "active_allocated"),
                block(base + tensor, segment - tensor, 0, "inactive"),
            ]),
        ),
    ]);
    let root = dict(vec![
        ("segments", list(vec![seg])),
        (
            "device_traces",
            list(vec![list(vec![
                entry("segment_alloc", segment),
                entry("alloc", tensor),
            ])]),
        ),
    ]);
    dumps(&root).unwrap()
}

#[test]
fn a_faithful_replay_exits_zero_and_a_divergent_one_exits_one() {
    // PyTorch puts a 3 MiB tensor in a 20 MiB segment: so does the port.
    let same = file("check", "same.pickle", &snapshot(20 * MIB));
    let o = vmm_replay(&["--check-classic", same.to_str().unwrap()]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("1 of 1 traces reproduced exactly"),
        "{}",
        stdout(&o)
    );
    // A recording that claims a 4 MiB segment for it is not what the port does.
    let other = file("check", "other.pickle", &snapshot(4 * MIB));
    let o = vmm_replay(&["--check-classic", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(
        out.contains("segment 0: recorded 4194304 B for allocation 0, replayed 20971520 B"),
        "{out}"
    );
    assert!(out.contains("0 of 1 traces reproduced exactly"), "{out}");
}

#[test]
fn check_classic_needs_snapshots() {
    let o = vmm_replay(&["--check-classic"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("needs PyTorch memory snapshots"),
        "{}",
        stderr(&o)
    );
    let log = file("check-csv", "small.csv", &small_log());
    let o = vmm_replay(&["--check-classic", log.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("needs a PyTorch memory snapshot"),
        "{}",
        stderr(&o)
    );
}

/// A snapshot recorded with history off (segments, no trace entries) has no `cudaMalloc` to
/// compare: `--check-classic` says so and fails, rather than "0 of 0 reproduced" and success.
#[test]
fn check_classic_with_nothing_to_check_is_an_error() {
    let base = 0x7f00_0000_0000u64;
    let seg = dict(vec![
        ("device", int(0)),
        ("address", int(base)),
        ("total_size", int(20 * MIB)),
        ("stream", int(0)),
        ("segment_type", Value::Str("large".into())),
        (
            "blocks",
            list(vec![dict(vec![
                ("address", int(base)),
                ("size", int(20 * MIB)),
                ("requested_size", int(20 * MIB)),
                ("state", Value::Str("active_allocated".into())),
            ])]),
        ),
    ]);
    let root = dict(vec![
        ("segments", list(vec![seg])),
        ("device_traces", list(vec![list(vec![])])),
    ]);
    let state_only = file("check-empty", "state.pickle", &dumps(&root).unwrap());
    let o = vmm_replay(&["--check-classic", state_only.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("nothing to check"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(!stdout(&o).contains("0 of 0"), "{}", stdout(&o));
}
