//! The snapshot reader on small synthetic snapshots: ids and frees, the start state, reserved
//! bytes, release runs, devices and the allocator configuration.

use vmm_alloc::config::parse_alloc_conf;
use vmm_replay::pickle::Value;
use vmm_replay::snapshot::{analyse_snapshot, read_snapshot, ReleaseRuns};
use vmm_replay::{Event, InitialBlock, StartState};

use crate::writer::{dict, dumps, i, list, s};

const MB: i64 = 1 << 20;

fn frames(name: &str) -> Value {
    list(vec![dict(vec![
        ("filename", s("/x/model.py")),
        ("line", i(7)),
        ("name", s(name)),
    ])])
}

pub(crate) fn e(action: &str, addr: i64, size: i64) -> Value {
    dict(vec![
        ("action", s(action)),
        ("addr", i(addr)),
        ("size", i(size)),
        ("stream", i(0)),
    ])
}

fn ef(action: &str, addr: i64, size: i64, f: &Value) -> Value {
    let Value::Dict(p) = e(action, addr, size) else {
        unreachable!()
    };
    let mut p = p.to_vec();
    p.push((s("frames"), f.clone()));
    Value::Dict(p.into())
}

pub(crate) fn block(addr: i64, size: i64, requested: i64, state: &str) -> Value {
    dict(vec![
        ("address", i(addr)),
        ("size", i(size)),
        ("requested_size", i(requested)),
        ("state", s(state)),
    ])
}

pub(crate) fn segment(device: i64, addr: i64, total: i64, blocks: Vec<Value>) -> Value {
    dict(vec![
        ("device", i(device)),
        ("address", i(addr)),
        ("total_size", i(total)),
        ("stream", i(0)),
        ("blocks", list(blocks)),
    ])
}

pub(crate) fn snapshot(
    segments: Vec<Value>,
    traces: Vec<Vec<Value>>,
    settings: Option<Value>,
) -> Vec<u8> {
    let mut top = vec![
        ("segments", list(segments)),
        (
            "device_traces",
            list(traces.into_iter().map(list).collect()),
        ),
    ];
    if let Some(st) = settings {
        top.push(("allocator_settings", st));
    }
    dumps(&dict(top))
}

#[test]
fn empty_start_ids_and_peaks() {
    let seg = 20 * MB;
    let bytes = snapshot(
        vec![segment(
            0,
            0x1000_0000,
            seg,
            vec![block(0x1000_0000, seg, 0, "inactive")],
        )],
        vec![vec![
            e("segment_alloc", 0x1000_0000, seg),
            e("alloc", 0x1000_0000, 1000),
            e("alloc", 0x1000_0400, 3000),
            e("free_requested", 0x1000_0000, 1000),
            e("free_completed", 0x1000_0000, 1000),
            e("free_requested", 0x1000_0400, 3000),
            e("free_completed", 0x1000_0400, 3000),
        ]],
        None,
    );
    let t = read_snapshot(&bytes, "toy").unwrap();
    assert_eq!(t.len(), 1);
    let t = &t[0];
    assert_eq!(t.name, "toy");
    assert_eq!(t.start, StartState::Empty);
    assert!(t.initial.is_empty());
    assert_eq!(
        t.events,
        vec![
            Event::Alloc {
                id: 0,
                size: 1000,
                stream: 0
            },
            Event::Alloc {
                id: 1,
                size: 3000,
                stream: 0
            },
            Event::Free { id: 0 },
            Event::Free { id: 1 },
        ]
    );
    assert_eq!(t.peak_live_bytes(), 4000);
    let r = t.recorded.unwrap();
    assert_eq!(
        (r.peak_reserved_bytes, r.segment_allocs, r.segment_frees),
        (seg as u64, 1, 0)
    );
    assert_eq!(t.alloc_conf, None, "no allocator_settings recorded");
}

/// A 2 MiB segment at `x` whose first KiB is live (a request of `requested` bytes) and the rest
/// free.
fn one_live_kib(x: i64, requested: i64) -> Value {
    segment(
        0,
        x,
        2 * MB,
        vec![
            block(x, 1024, requested, "active_allocated"),
            block(x + 1024, 2 * MB - 1024, 0, "inactive"),
        ],
    )
}

#[test]
fn warm_start_initial_blocks() {
    // Live at dump and never allocated: X (requested 1000). Freed but never allocated: Y (100).
    // A is allocated and freed. (A is freed again once was skipped and counted; a double free is
    // now refused, `snapshot_claims`.)
    let (x, y, a) = (0x2000_0000, 0x2000_1000, 0x2000_2000);
    let bytes = snapshot(
        vec![one_live_kib(x, 1000)],
        vec![vec![
            e("free_requested", y, 100),
            e("free_completed", y, 100),
            e("alloc", a, 10),
            e("free_completed", a, 10),
        ]],
        None,
    );
    let t = &read_snapshot(&bytes, "warm").unwrap()[0];
    assert_eq!(t.start, StartState::Warm);
    assert_eq!(
        t.initial,
        vec![
            InitialBlock {
                id: 0,
                size: 1000,
                stream: 0
            },
            InitialBlock {
                id: 1,
                size: 100,
                stream: 0
            },
        ]
    );
    assert_eq!(
        t.events,
        vec![
            Event::Free { id: 1 },
            Event::Alloc {
                id: 2,
                size: 10,
                stream: 0
            },
            Event::Free { id: 2 },
        ]
    );
    assert_eq!(t.skipped_frees, 0);
    assert_eq!(t.peak_live_bytes(), 1100);
    // Nothing happened to segments: reserved = the dump's 2 MiB all along.
    assert_eq!(t.recorded.unwrap().peak_reserved_bytes, 2 * MB as u64);
}

/// A `free_completed` whose size is missing (fuzzing found one: a mutated key) at an address
/// the trace never allocated frees nothing: it is a skipped free, not a block of 0 bytes live
/// at the start, which no allocator can place and the native format refuses on reading back.
#[test]
fn a_free_of_no_size_at_an_unknown_address_is_skipped() {
    let (a, b) = (0x1000, 0x10ff);
    let no_size = dict(vec![
        ("action", s("free_completed")),
        ("addr", i(b)),
        ("stream", i(0)),
    ]);
    let bytes = snapshot(
        vec![],
        vec![vec![
            e("alloc", a, 512),
            no_size,
            e("free_completed", a, 512),
        ]],
        None,
    );
    let t = &read_snapshot(&bytes, "no-size").unwrap()[0];
    assert!(t.initial.is_empty(), "{:?}", t.initial);
    assert_eq!(t.skipped_frees, 1);
    assert_eq!(t.peak_live_bytes(), 512);
    let back = vmm_replay::native::read_native(&vmm_replay::native::write_native(t), "back")
        .expect("the trace written reads back");
    assert_eq!(back.events, t.events);
}

/// A block live at the dump whose requested size says 0 (fuzzing found one, mutated from a
/// recorded snapshot) holds its block's bytes: the start state has it at its block size, never
/// as a request of 0 bytes, which no allocator can place and the native format refuses.
#[test]
fn a_live_block_that_requested_nothing_holds_its_block() {
    let x = 0x3000_0000;
    let bytes = snapshot(
        vec![one_live_kib(x, 0)],
        vec![vec![
            e("alloc", x + 4096, 10),
            e("free_completed", x + 4096, 10),
        ]],
        None,
    );
    let t = &read_snapshot(&bytes, "requested-nothing").unwrap()[0];
    assert_eq!(
        t.initial,
        vec![InitialBlock {
            id: 0,
            size: 1024,
            stream: 0
        }]
    );
    let back = vmm_replay::native::read_native(&vmm_replay::native::write_native(t), "back")
        .expect("the trace written reads back");
    assert_eq!(back.initial, t.initial);
}

#[test]
fn release_runs_are_classified() {
    let (f_call, f_empty) = (frames("forward"), frames("empty_cache"));
    let seg = 20 * MB;
    let base = 0x3000_0000;
    // The segments released were reserved before recording began, each holding a block freed
    // just before its release (a block live at the start), except the first.
    let trace = vec![
        // 1: empty_cache() before anything (frames differ from the next alloc).
        ef("segment_free", base + 10 * seg, seg, &f_empty),
        ef("segment_alloc", base, seg, &f_call),
        ef("alloc", base, 1000, &f_call),
        // 2: release-and-retry: same frames as the alloc that follows.
        e("free_completed", base + 11 * seg, 1000),
        e("free_completed", base + 12 * seg, 1000),
        ef("segment_free", base + 11 * seg, seg, &f_call),
        ef("segment_free", base + 12 * seg, seg, &f_call),
        ef("segment_alloc", base + seg, seg, &f_call),
        ef("alloc", base + seg, 5000, &f_call),
        // 3: a failed retry: oom follows.
        e("free_completed", base + 13 * seg, 1000),
        ef("segment_free", base + 13 * seg, seg, &f_call),
        dict(vec![
            ("action", s("oom")),
            ("device_free", i(0)),
            ("size", i(seg)),
        ]),
        // 4: no frames, the alloc lands in the new segment, but 5 + 1 segments fit under the 7
        // held at the start: no cudaMalloc had failed, so empty_cache().
        e("free_completed", base + 14 * seg, 1000),
        e("segment_free", base + 14 * seg, seg),
        e("segment_alloc", base + 2 * seg, seg),
        e("alloc", base + 2 * seg, 7000),
        // 5: no frames, the alloc is elsewhere: empty_cache().
        e("free_completed", base + 15 * seg, 1000),
        e("segment_free", base + 15 * seg, seg),
        e("segment_alloc", base + 3 * seg, seg),
        e("alloc", base + 512, 8),
        // (A block in the new segment, which empty_cache() would release if it were free.)
        e("alloc", base + 3 * seg, 9),
        // 6: a run at the very end.
        e("free_completed", base + 16 * seg, 1000),
        e("segment_free", base + 16 * seg, seg),
    ];
    let segs: Vec<Value> = (0..4)
        .map(|k| segment(0, base + k * seg, seg, vec![]))
        .collect();
    let d = analyse_snapshot(&snapshot(segs, vec![trace], None), "runs").unwrap();
    let d = &d[0];
    assert_eq!(
        d.release_runs,
        ReleaseRuns {
            empty_cache: 4,
            alloc_retry: 1,
            partial: 0,
            before_oom: 1
        }
    );
    let t = &d.trace;
    let kinds: Vec<&str> = t
        .events
        .iter()
        .map(|e| match e {
            Event::Alloc { .. } => "A",
            Event::Free { .. } => "F",
            Event::EmptyCache => "E",
            Event::FailedAlloc { .. } => "O",
        })
        .collect();
    // The failed retry's request is replayed too (O), after the run it released.
    assert_eq!(kinds.concat(), "EAFFAFOFEAFEAAFE");
    let r = t.recorded.unwrap();
    assert_eq!((r.segment_allocs, r.segment_frees), (4, 7));
    // Reserved at dump 80 MiB; net change -3 segments, so 140 MiB at start; the peak from the
    // first alloc on is the 140 MiB held then (the first release came before it).
    assert_eq!(r.peak_reserved_bytes, (7 * seg) as u64);
    // Segments released that the trace never reserved: recording started late.
    assert_eq!(t.start, StartState::Warm);
}

#[test]
fn expandable_map_unmap_and_devices() {
    let page = 2 * MB;
    let base = 0x7000_0000_0000;
    let dev0 = vec![
        e("segment_map", base, 3 * page),
        e("alloc", base, 5 * MB),
        e("segment_unmap", base + 2 * page, page),
        e("free_completed", base, 5 * MB),
        e("segment_unmap", base, 2 * page),
    ];
    let dev1 = vec![
        e("alloc", 0x10, 4),
        e("segment_unmap", base + 64 * page, page),
    ];
    let bytes = snapshot(
        vec![segment(1, base, page, vec![])],
        vec![dev0, dev1],
        Some(dict(vec![
            ("PYTORCH_CUDA_ALLOC_CONF", s("")),
            ("expandable_segments", Value::Bool(true)),
            ("max_split_size", i(-1)),
            ("garbage_collection_threshold", Value::Float(0.0)),
        ])),
    );
    let t = read_snapshot(&bytes, "two").unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].name.as_str(), t[1].name.as_str()), ("two#0", "two#1"));
    // Device 0 has no segments at dump: reserved starts at 0 - net(0) = 0, peaks at 3 pages.
    assert_eq!(t[0].start, StartState::Empty);
    assert_eq!(t[0].recorded.unwrap().peak_reserved_bytes, 3 * page as u64);
    assert_eq!(
        t[0].events
            .iter()
            .filter(|e| **e == Event::EmptyCache)
            .count(),
        2
    );
    // Device 1 unmaps pages it never mapped in the trace: warm.
    assert_eq!(t[1].start, StartState::Warm);
    assert_eq!(t[1].recorded.unwrap().peak_reserved_bytes, 2 * page as u64);
    for tr in &t {
        let conf = tr.alloc_conf.as_deref().unwrap();
        assert_eq!(conf, "expandable_segments:True");
        assert!(parse_alloc_conf(conf).unwrap().expandable_segments);
    }
}

#[test]
fn alloc_conf_is_rebuilt_from_settings() {
    let roundup = |vals: [i64; 16]| {
        Value::Dict(
            vals.iter()
                .enumerate()
                .map(|(k, v)| (s(&(1u64 << k).to_string()), i(*v)))
                .collect(),
        )
    };
    let conf_of = |settings: Value| {
        let bytes = snapshot(vec![], vec![vec![e("alloc", 1, 1)]], Some(settings));
        read_snapshot(&bytes, "c").unwrap()[0].alloc_conf.clone()
    };
    let c = conf_of(dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s("")),
        ("expandable_segments", Value::Bool(false)),
        ("max_split_size", i(128 * MB)),
        ("garbage_collection_threshold", Value::Float(0.6)),
        ("roundup_power2_divisions", roundup([4; 16])),
        ("release_lock_on_cudamalloc", Value::Bool(true)),
        ("pinned_num_register_threads", i(1)),
    ]))
    .unwrap();
    assert_eq!(
        c,
        "expandable_segments:False,max_split_size_mb:128,garbage_collection_threshold:0.6,\
         roundup_power2_divisions:4,release_lock_on_cudamalloc:True"
    );
    let parsed = parse_alloc_conf(&c).unwrap();
    assert_eq!(parsed.max_split_size, Some(128 << 20));
    assert_eq!(parsed.roundup_power2_divisions, [4; 16]);

    let mut mixed = [0i64; 16];
    mixed[6] = 8;
    mixed[7] = 2;
    let c = conf_of(dict(vec![("roundup_power2_divisions", roundup(mixed))])).unwrap();
    let parsed = parse_alloc_conf(&c).unwrap().roundup_power2_divisions;
    assert_eq!(parsed.map(|d| d as i64), mixed);

    // The recorded string wins when it parses; an unparsable one falls back to the fields.
    let c = conf_of(dict(vec![
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            s("expandable_segments:True,max_split_size_mb:128"),
        ),
        ("expandable_segments", Value::Bool(true)),
    ]));
    assert_eq!(
        c.as_deref(),
        Some("expandable_segments:True,max_split_size_mb:128")
    );
    let c = conf_of(dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s("bogus_key:1")),
        ("expandable_segments", Value::Bool(true)),
        ("max_split_size", i(MB)), // below PyTorch's 20 MB minimum: dropped
    ]));
    assert_eq!(c.as_deref(), Some("expandable_segments:True"));
}

#[test]
fn malformed_snapshots_are_errors() {
    let not_snapshot = dumps(&dict(vec![("hello", i(1))]));
    let err = read_snapshot(&not_snapshot, "x").unwrap_err();
    assert!(
        err.to_string().contains("not a PyTorch memory snapshot"),
        "{err}"
    );
    let negative = snapshot(vec![], vec![vec![e("alloc", 1, -5)]], None);
    assert!(read_snapshot(&negative, "x")
        .unwrap_err()
        .to_string()
        .contains("size"));
    let overflow = snapshot(
        vec![],
        vec![vec![
            e("alloc", 1, i64::MAX),
            e("alloc", 2, i64::MAX),
            e("alloc", 3, i64::MAX),
        ]],
        None,
    );
    assert!(read_snapshot(&overflow, "x")
        .unwrap_err()
        .to_string()
        .contains("2^64"));
    let bad_traces = dumps(&dict(vec![("device_traces", i(3))]));
    assert!(read_snapshot(&bad_traces, "x").is_err());
    // A bare list of segments (torch 1.13) has no trace.
    assert!(read_snapshot(&dumps(&list(vec![])), "x")
        .unwrap()
        .is_empty());
    // A huge segment_map must not allocate per page.
    let huge = snapshot(
        vec![],
        vec![vec![
            e("alloc", 1, 1),
            e("segment_map", 0, i64::MAX),
            e("segment_unmap", 0, i64::MAX),
        ]],
        None,
    );
    let t = read_snapshot(&huge, "x").unwrap();
    assert_eq!(t[0].recorded.unwrap().peak_reserved_bytes, i64::MAX as u64);
}

#[test]
fn one_trace_named_by_many_devices_is_refused_quickly() {
    // device_traces = [L] * 200_000 where L holds 1000 entries: 2e8 entries to walk from a
    // 400 kB file. The reader must refuse (its work is bounded by the input size), fast.
    let entries: Vec<Value> = (0..1000).map(|k| e("alloc", k, 8)).collect();
    let l = dumps(&list(entries));
    let l = &l[2..l.len() - 1]; // without PROTO and STOP
    let mut p = b"\x80\x02}(X\x0d\x00\x00\x00device_traces](".to_vec();
    p.extend_from_slice(l);
    p.extend_from_slice(b"q\x00");
    for _ in 1..200_000 {
        p.extend_from_slice(b"h\x00");
    }
    p.extend_from_slice(b"eu.");
    let t = std::time::Instant::now();
    let err = read_snapshot(&p, "shared").unwrap_err();
    assert!(
        err.to_string().contains("refers to the same lists"),
        "{err}"
    );
    assert!(t.elapsed().as_secs() < 5);
}
