//! Valid inputs to mutate, built in code with the crate's own writers (snapshot dumps of replays,
//! native traces, RMM logs written here), plus the small recorded PyTorch snapshots of
//! `../shared/traces` when that folder is there (read at run time, never copied), and the
//! crafted inputs of the issue 21 audit, which the readers refuse or count.

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;

use vmm_replay::dump::pickle_writer::dumps;
use vmm_replay::native::write_native;
use vmm_replay::pickle::Value;
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::snapshot::read_snapshot;
use vmm_replay::{workloads, Event, Trace};

/// Recorded snapshots larger than this are left out: a mutated input is read whole many times a
/// second, and the small ones have every kind of entry the large ones have.
const MAX_SHARED: u64 = 400 << 10;

/// Valid inputs per reader.
pub struct Corpus {
    /// PyTorch snapshot pickles (and plain pickled values).
    pub pickles: Vec<Vec<u8>>,
    /// Native traces.
    pub native: Vec<Vec<u8>>,
    /// RMM CSV logs.
    pub csv: Vec<Vec<u8>>,
    /// How many pickles came from `../shared/traces`.
    pub shared: usize,
    /// The `../shared/traces` folders that could not be read (absent in a bare clone): their
    /// recorded snapshots are not in the corpus, which the campaign says in its summary.
    pub shared_missing: Vec<PathBuf>,
}

/// Small workloads of every shape the replay tool has.
fn traces() -> Vec<Trace> {
    let mut out = vec![
        workloads::rmm_random(1, 8 << 20, 80),
        workloads::rmm_random(2, 64 << 20, 200),
    ];
    for name in [
        "transformer-training",
        "varying-batch",
        "inference-kv-cache",
    ] {
        if let Some(mut t) = workloads::by_name(name, 3, 0, 0) {
            // The first few hundred events have every kind of op; whole workloads are large.
            t.events.truncate(300);
            out.push(t);
        }
    }
    out
}

/// A replay's history as a snapshot pickle, as `vmm-replay --dump-snapshot` writes it.
fn dump(trace: &Trace, policy: Policy) -> Option<Vec<u8>> {
    let opts = ReplayOptions {
        record_history: true,
        capacity: 1 << 30,
        ..ReplayOptions::default()
    };
    let outcome = replay(trace, policy, &opts).ok()?;
    outcome.history?.to_pickle().ok()
}

/// Pickled values of every type the reader builds, nested, as generic pickle inputs.
fn values() -> Vec<Vec<u8>> {
    let s = |x: &str| Value::Str(x.into());
    let list = |v: Vec<Value>| Value::List(Rc::from(v));
    let dict = |v: Vec<(Value, Value)>| Value::Dict(Rc::from(v));
    let nested = (0..40).fold(Value::None, |inner, i| {
        list(vec![Value::Int(i), inner, Value::Bool(i % 2 == 0)])
    });
    let mixed = dict(vec![
        (s("segments"), list(vec![])),
        (s("device_traces"), list(vec![list(vec![])])),
        (s("float"), Value::Float(-1.5e300)),
        (s("big"), Value::Int(i64::MIN)),
        (
            s("tuple"),
            Value::Tuple(Rc::from(vec![s("é"), Value::None])),
        ),
    ]);
    [nested, mixed]
        .iter()
        .filter_map(|v| dumps(v).ok())
        .collect()
}

/// The inputs of the outside audit (issue 21, item 3), which the readers once took for what they
/// are not, as seeds: pickles (`[1, 2, 3]`, a memo bomb of 16^30 leaves, entries with an unknown
/// action, an empty request, a double free, and the actions skipped on purpose), and RMM logs (a
/// header alone, a double free, zero-byte allocations and `allocate failure` lines).
fn audit_inputs() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let s = |x: &str| Value::Str(x.into());
    let list = |v: Vec<Value>| Value::List(Rc::from(v));
    let entry = |action: &str, addr: i64, size: i64| {
        Value::Dict(Rc::from(vec![
            (s("action"), s(action)),
            (s("addr"), Value::Int(addr)),
            (s("size"), Value::Int(size)),
            (s("stream"), Value::Int(0)),
        ]))
    };
    let snapshot = |entries: Vec<Value>| {
        Value::Dict(Rc::from(vec![
            (s("segments"), list(vec![])),
            (s("device_traces"), list(vec![list(entries)])),
        ]))
    };
    let mut bomb = b"\x80\x04]\x94K\x00a".to_vec();
    for k in 1..=30u8 {
        // The level below stays in the memo only.
        bomb.extend_from_slice(b"0(");
        for _ in 0..16 {
            bomb.extend_from_slice(&[b'h', k - 1]);
        }
        bomb.extend_from_slice(b"l\x94");
    }
    bomb.push(b'.');
    let values = [
        list(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
        snapshot(vec![
            entry("alloc", 4096, 512),
            entry("reticulate", 4096, 512),
        ]),
        snapshot(vec![entry("alloc", 4096, 512), entry("alloc", 8192, 0)]),
        snapshot(vec![
            entry("alloc", 4096, 512),
            entry("free_completed", 4096, 512),
            entry("free_completed", 4096, 512),
        ]),
        snapshot(vec![
            entry("alloc", 4096, 512),
            entry("snapshot", 0, 512),
            entry("user_defined", 0, 0),
            entry("free_completed", 4096, 512),
        ]),
    ];
    let mut pickles: Vec<Vec<u8>> = values.iter().filter_map(|v| dumps(v).ok()).collect();
    pickles.push(bomb);
    let h = "Thread,Time,Action,Pointer,Size,Stream\n";
    let csv = [
        h.to_string(),
        format!("{h}1,t,allocate,0x10,8,0\n1,t,free,0x10,8,0\n1,t,free,0x10,8,0\n"),
        format!(
            "{h}1,t,allocate,0x10,0,0\n1,t,allocate failure,0x0,1099511627776,0\n\
             1,t,allocate,0x20,8,0\n1,t,free,0x10,0,0\n1,t,free,0x20,8,0\n"
        ),
    ];
    (pickles, csv.map(String::into_bytes).to_vec())
}

/// An RMM log of `trace`, as `logging_resource_adaptor` writes it: one line per allocate and
/// free, pointers made up per allocation.
fn rmm_csv(trace: &Trace) -> Vec<u8> {
    let mut out = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let mut blocks: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    for (i, e) in trace.events.iter().enumerate() {
        let line = match *e {
            Event::Alloc { id, size, stream } => {
                let ptr = 0x7f00_0000_0000 + id * 0x40_0000;
                blocks.insert(id, (ptr, size, stream));
                Some(("allocate", ptr, size, stream))
            }
            Event::Free { id } => blocks
                .remove(&id)
                .map(|(ptr, size, stream)| ("free", ptr, size, stream)),
            // The RMM reader ignores `allocate failure` lines: nothing to write.
            Event::EmptyCache | Event::FailedAlloc { .. } => None,
        };
        if let Some((action, ptr, size, stream)) = line {
            out.push_str(&format!(
                "140573312345856,08:54:51:{:06},{action},{ptr:#x},{size},{stream:#x}\n",
                i % 1_000_000
            ));
        }
    }
    out.into_bytes()
}

/// The recorded snapshots of `../shared/traces/pytorch` (and its `state-only/`) small enough,
/// and the folders that could not be read.
fn shared_pickles() -> (Vec<Vec<u8>>, Vec<PathBuf>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/pytorch");
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for dir in [root.clone(), root.join("state-only")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            missing.push(dir);
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let small = std::fs::metadata(&p).is_ok_and(|m| m.is_file() && m.len() <= MAX_SHARED);
            if small && p.extension().is_some_and(|e| e == "pickle") {
                if let Ok(bytes) = std::fs::read(&p) {
                    out.push(bytes);
                }
            }
        }
    }
    (out, missing)
}

impl Corpus {
    /// Builds every input (a second or so).
    pub fn build() -> Self {
        let traces = traces();
        let mut pickles: Vec<Vec<u8>> = traces
            .iter()
            .flat_map(|t| {
                [
                    dump(t, Policy::Expandable),
                    dump(t, Policy::PytorchExpandable),
                ]
            })
            .flatten()
            .collect();
        pickles.extend(values());
        let (audit_pickles, audit_csv) = audit_inputs();
        pickles.extend(audit_pickles);
        let (shared, shared_missing) = shared_pickles();
        let from_shared: Vec<Trace> = shared
            .iter()
            .filter_map(|b| read_snapshot(b, "shared").ok())
            .flatten()
            .collect();
        let n_shared = shared.len();
        pickles.extend(shared);
        let all: Vec<&Trace> = traces.iter().chain(&from_shared).collect();
        let mut csv: Vec<Vec<u8>> = all.iter().map(|t| rmm_csv(t)).collect();
        csv.extend(audit_csv);
        Corpus {
            native: all.iter().map(|t| write_native(t)).collect(),
            csv,
            pickles,
            shared: n_shared,
            shared_missing,
        }
    }
}
