//! `--check-classic` on generated snapshots of programs whose recordings a replay of the entries
//! in order gets wrong (Note [Recorded mallocs] in `src/classic/recorded.rs`), and of programs
//! run with each setting `vmm-replay advise` sweeps. Each trace is what PyTorch's
//! `DeviceCachingAllocator` records for the program described above it, derived by hand from its
//! source (reference `pytorch-allocator.md` §1.3–1.10, §4.2): `free` records `free_requested`
//! and, when no other stream used the block, `free_completed` at once; a block used on another
//! stream (`record_stream`) completes later, in `process_events` at the start of a `malloc` or in
//! `synchronize_and_free_events` inside `release_cached_blocks`; a failed `cudaMalloc` records
//! nothing; `release_block` records `segment_free`; `alloc_block` records `segment_alloc` just
//! before the `alloc` of the same call. The expected segment sizes come from §1.4–1.7 worked
//! out in the comments, not from the crate.
//!
//! Where every block and segment is allocated inside the trace, the dump's `segments` list is
//! left empty: the state at the start is empty whatever the dump holds.

use vmm_replay::faithfulness::{check_classic, ClassicCheck};
use vmm_replay::pickle::Value;
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::snapshot::analyse_snapshot;

use crate::writer::{dict, dumps, i, list, s};

pub(crate) const MIB: i64 = 1 << 20;
pub(crate) const GIB: i64 = 1 << 30;
pub(crate) const BASE: i64 = 0x7f00_0000_0000;

/// One trace entry.
pub(crate) fn e(action: &str, addr: i64, size: i64, stream: i64) -> Value {
    dict(vec![
        ("action", s(action)),
        ("addr", i(addr)),
        ("size", i(size)),
        ("stream", i(stream)),
    ])
}

/// A whole free of a block no other stream used: both entries at once.
pub(crate) fn free(addr: i64, size: i64, stream: i64) -> [Value; 2] {
    [
        e("free_requested", addr, size, stream),
        e("free_completed", addr, size, stream),
    ]
}

/// `allocator_settings` as PyTorch 2.4+ records them: the settings string and the fields.
pub(crate) fn settings(conf: &str, max_split: i64, gc: f64, divisions: i64) -> Value {
    let roundup = (0..16)
        .map(|k| (1i64 << k).to_string())
        .map(|k| (Value::Str(k.into()), i(divisions)))
        .collect::<Vec<_>>();
    dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s(conf)),
        ("max_split_size", i(max_split)),
        ("garbage_collection_threshold", Value::Float(gc)),
        ("expandable_segments", Value::Bool(false)),
        ("roundup_power2_divisions", Value::Dict(roundup.into())),
    ])
}

pub(crate) fn defaults() -> Value {
    settings("", -1, 0.0, 0)
}

/// Checks the snapshot of `entries` recorded under `recorded_settings` on an 80 GiB GPU.
fn check(entries: Vec<Value>, recorded_settings: Value) -> ClassicCheck {
    check_with_dump(vec![], entries, recorded_settings)
}

/// [`check`] with the dump's `segments` list.
fn check_with_dump(
    segments: Vec<Value>,
    entries: Vec<Value>,
    recorded_settings: Value,
) -> ClassicCheck {
    let bytes = dumps(&dict(vec![
        ("segments", list(segments)),
        ("device_traces", list(vec![list(entries)])),
        ("allocator_settings", recorded_settings),
    ]));
    let devices = analyse_snapshot(&bytes, "generated").unwrap();
    check_classic(&devices[0], 80 << 30).unwrap()
}

fn assert_exact(c: &ClassicCheck, segments: &[(u64, i64)], peak: i64) {
    let want: Vec<(u64, u64)> = segments.iter().map(|&(n, b)| (n, b as u64)).collect();
    assert_eq!(c.recorded, want, "the generated trace records these");
    assert_eq!(c.replayed, want, "{}", c.describe());
    assert_eq!(c.replayed_peak_reserved, peak as u64);
    assert!(c.is_exact(), "{}", c.describe());
}

/// `max_split_size_mb:64`; a 100 MiB tensor A and a 30 MiB tensor B are freed and cached; a
/// 70 MiB request C finds no block (A is oversize, 100 ≥ 70 + 20 MiB of slack, §1.6 step 5; B is
/// too small), and the full GPU refuses `cudaMalloc(70 MiB)`. `release_available_cached_blocks`
/// (§1.9) looks up max(70, 64) = 70 MiB: A is the one block that large, it alone is freed, and
/// the retried `cudaMalloc` succeeds. B stays cached and serves D (30 MiB). Replaying the
/// `segment_free` run as `empty_cache()` frees B too, and D needs a fourth segment.
#[test]
fn max_split_retry_frees_only_the_oversize_block() {
    let (a, b, c) = (BASE, BASE + GIB, BASE + 2 * GIB);
    let mut t = vec![
        e("segment_alloc", a, 100 * MIB, 0),
        e("alloc", a, 100 * MIB, 0),
        e("segment_alloc", b, 30 * MIB, 0),
        e("alloc", b, 30 * MIB, 0),
    ];
    t.extend(free(a, 100 * MIB, 0));
    t.extend(free(b, 30 * MIB, 0));
    t.extend([
        e("segment_free", a, 100 * MIB, 0),
        e("segment_alloc", c, 70 * MIB, 0),
        e("alloc", c, 70 * MIB, 0),
        e("alloc", b, 30 * MIB, 0),
    ]);
    let c = check(t, settings("max_split_size_mb:64", 64 * MIB, 0.0, 0));
    // A + B = 130 MiB before A's release; then 30 + 70.
    assert_exact(
        &c,
        &[(0, 100 * MIB), (1, 30 * MIB), (2, 70 * MIB)],
        130 * MIB,
    );
}

/// Two streams. X (8 MiB) and W (11 MiB) share a 20 MiB segment on stream 0 (W takes the last
/// 12 MiB whole: 1 MiB left is not more than kSmallSize, §1.7); Y (40 MiB) has its own segment on
/// stream 5. Y is freed; X, used on stream 7 (`record_stream`), is freed but stays pending
/// (`free_requested` only). Z (8 MiB, stream 0): `process_events` finds X's event not done, the
/// search finds nothing on stream 0, the full GPU refuses the `cudaMalloc`;
/// `release_cached_blocks` first synchronizes (X completes: `free_completed`), then frees every
/// free whole segment (Y's; X's segment still holds W), and the retry allocates a new segment:
/// PyTorch does not search again. Replaying X's completion before Z's search hands X to Z.
#[test]
fn a_pending_free_completed_by_the_retry_does_not_serve_the_request() {
    let (seg1, y, seg3) = (BASE, BASE + GIB, BASE + 2 * GIB);
    let mut t = vec![
        e("segment_alloc", seg1, 20 * MIB, 0),
        e("alloc", seg1, 8 * MIB, 0),
        e("alloc", seg1 + 8 * MIB, 11 * MIB, 0),
        e("segment_alloc", y, 40 * MIB, 5),
        e("alloc", y, 40 * MIB, 5),
    ];
    t.extend(free(y, 40 * MIB, 5));
    t.extend([
        e("free_requested", seg1, 8 * MIB, 0),
        // Z's malloc.
        e("free_completed", seg1, 8 * MIB, 0),
        e("segment_free", y, 40 * MIB, 5),
        e("segment_alloc", seg3, 20 * MIB, 0),
        e("alloc", seg3, 8 * MIB, 0),
    ]);
    let c = check(t, defaults());
    // 20 + 40 MiB before Y's segment goes; then 20 + 20.
    assert_exact(&c, &[(0, 20 * MIB), (2, 40 * MIB), (3, 20 * MIB)], 60 * MIB);
}

/// The same pending X without anything to release: the GPU is full, `release_cached_blocks`
/// synchronizes (X completes) and frees nothing (X's segment holds W), and the retry allocates.
/// The trace shows X's `free_completed` right before Z's `segment_alloc`, exactly as a completion
/// in `process_events` followed by a failed search would: either way the search failed without
/// X, which is what the replay reproduces.
#[test]
fn a_pending_free_completed_inside_the_call_that_made_a_segment() {
    let (seg1, seg2) = (BASE, BASE + GIB);
    let t = vec![
        e("segment_alloc", seg1, 20 * MIB, 0),
        e("alloc", seg1, 8 * MIB, 0),
        e("alloc", seg1 + 8 * MIB, 11 * MIB, 0),
        e("free_requested", seg1, 8 * MIB, 0),
        e("free_completed", seg1, 8 * MIB, 0),
        e("segment_alloc", seg2, 20 * MIB, 0),
        e("alloc", seg2, 8 * MIB, 0),
    ];
    let c = check(t, defaults());
    assert_exact(&c, &[(0, 20 * MIB), (2, 20 * MIB)], 40 * MIB);
}

/// The collector's program (the test below says what PyTorch did): a small 1 KiB tensor in its
/// own segment, freed; A and B (6 GiB each) allocated and freed; the collector releases A and B
/// only, C (7 GiB) gets a new segment, and the next 1 KiB tensor reuses the small segment.
/// Addresses: small at `BASE`, A at +1 GiB, B at +8 GiB, C at +16 GiB.
pub(crate) fn collector_run() -> Vec<Value> {
    let (small, a, b, c) = (BASE, BASE + GIB, BASE + 8 * GIB, BASE + 16 * GIB);
    let mut t = vec![
        e("segment_alloc", small, 2 * MIB, 0),
        e("alloc", small, 1024, 0),
    ];
    t.extend(free(small, 1024, 0));
    t.extend([
        e("segment_alloc", a, 6 * GIB, 0),
        e("alloc", a, 6 * GIB, 0),
        e("segment_alloc", b, 6 * GIB, 0),
        e("alloc", b, 6 * GIB, 0),
    ]);
    t.extend(free(a, 6 * GIB, 0));
    t.extend(free(b, 6 * GIB, 0));
    t.extend([
        e("segment_free", a, 6 * GIB, 0),
        e("segment_free", b, 6 * GIB, 0),
        e("segment_alloc", c, 7 * GIB, 0),
        e("alloc", c, 7 * GIB, 0),
        e("alloc", small, 1024, 0),
    ]);
    t
}

/// `garbage_collection_threshold:0.5` with `per_process_memory_fraction:0.25` on an 80 GiB GPU:
/// allowed 20 GiB, the collector acts above 10 GiB (§1.9). A 1 KiB tensor's 2 MiB small segment
/// is cached; A and B (6 GiB each) are freed after two large-pool searches (each
/// `get_free_block` ticks the large pool's clock: both freed at 2). C (7 GiB): the search ticks
/// to 3 and fails; 12 GiB + 2 MiB > 10 GiB, so the collector frees every unsplit large block
/// at least as old as the average (A, B: age 1, average 1) — not the small segment — and
/// `cudaMalloc(7 GiB)` fits in the allowance. The next 1 KiB tensor reuses the small segment;
/// replaying the run as `empty_cache()` frees it and needs a new one.
#[test]
fn garbage_collection_frees_old_large_blocks_only() {
    let t = collector_run();
    let conf = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.25";
    let c = check(t, settings(conf, -1, 0.5, 0));
    assert_exact(
        &c,
        &[(0, 2 * MIB), (1, 6 * GIB), (2, 6 * GIB), (3, 7 * GIB)],
        12 * GIB + 2 * MIB,
    );
}

/// `roundup_power2_divisions` 4 everywhere, recorded only in the settings' fields (the string
/// is empty, as after `_set_allocator_settings`). 40 MiB + 1 B: 4 divisions, above 512 × 4, so
/// §1.4 rounds to the next quarter of [32, 64) MiB: 48 MiB, a 48 MiB segment (by default:
/// 40 MiB + 512 B, a 42 MiB segment). Freed, it serves 47 MiB (also 48 MiB rounded) with no
/// new segment; by default 47 MiB would need one.
#[test]
fn roundup_power2_divisions_round_to_quarters() {
    let a = BASE;
    let mut t = vec![
        e("segment_alloc", a, 48 * MIB, 0),
        e("alloc", a, 40 * MIB + 1, 0),
    ];
    t.extend(free(a, 40 * MIB + 1, 0));
    t.push(e("alloc", a, 47 * MIB, 0));
    let c = check(t, settings("", -1, 0.0, 4));
    assert_exact(&c, &[(0, 48 * MIB)], 48 * MIB);
}

/// `max_split_size` 64 MiB recorded in the fields only. A cached 100 MiB oversize block serves
/// an 85 MiB request whole (oversize requests may round up by less than 20 MiB, §1.6, and
/// oversize blocks are never split, §1.7) but not a 70 MiB one (100 ≥ 70 + 20): that one gets
/// its own 70 MiB segment. By default the 85 MiB request would split the block and the 70 MiB
/// one would reuse it.
#[test]
fn max_split_oversize_blocks_serve_within_20_mib() {
    let (a, b) = (BASE, BASE + GIB);
    let mut t = vec![
        e("segment_alloc", a, 100 * MIB, 0),
        e("alloc", a, 100 * MIB, 0),
    ];
    t.extend(free(a, 100 * MIB, 0));
    t.push(e("alloc", a, 85 * MIB, 0));
    t.extend(free(a, 85 * MIB, 0));
    t.extend([
        e("segment_alloc", b, 70 * MIB, 0),
        e("alloc", b, 70 * MIB, 0),
    ]);
    let c = check(t, settings("", 64 * MIB, 0.0, 0));
    assert_exact(&c, &[(0, 100 * MIB), (2, 70 * MIB)], 170 * MIB);
}

/// A dump-time segment of the large pool on stream 0.
fn segment(addr: i64, total: i64, blocks: Vec<(i64, i64, &str)>) -> Value {
    let blocks = blocks
        .into_iter()
        .scan(addr, |at, (size, requested, state)| {
            let b = dict(vec![
                ("address", i(*at)),
                ("size", i(size)),
                ("requested_size", i(requested)),
                ("state", s(state)),
            ]);
            *at += size;
            Some(b)
        })
        .collect();
    dict(vec![
        ("device", i(0)),
        ("address", i(addr)),
        ("total_size", i(total)),
        ("stream", i(0)),
        ("segment_type", s("large")),
        ("blocks", list(blocks)),
    ])
}

/// A warm recording with `max_split_size` 64 MiB: before it began, an 85 MiB tensor A was
/// served whole from a cached 100 MiB oversize segment (within 20 MiB, never split, §1.6–1.7).
/// The trace allocates C (10 MiB: no free block, a new 10 MiB segment) and frees A; the dump
/// shows A's segment free. The start state must give A its whole segment: rebuilt as
/// round_size(85 MiB) = 85 MiB, it would leave a free 15 MiB tail that serves C.
#[test]
fn a_warm_oversize_block_is_its_whole_segment() {
    let (a, c) = (BASE, BASE + GIB);
    let dump = vec![
        segment(a, 100 * MIB, vec![(100 * MIB, 0, "inactive")]),
        segment(c, 10 * MIB, vec![(10 * MIB, 10 * MIB, "active_allocated")]),
    ];
    let mut t = vec![
        e("segment_alloc", c, 10 * MIB, 0),
        e("alloc", c, 10 * MIB, 0),
    ];
    t.extend(free(a, 85 * MIB, 0));
    let c = check_with_dump(dump, t, settings("max_split_size_mb:64", 64 * MIB, 0.0, 0));
    // 100 MiB reserved at the start, 110 MiB from C on.
    assert_exact(&c, &[(0, 10 * MIB)], 110 * MIB);
}

/// `expandable_segments:True` (§2.3): a 30 MiB request creates the stream's segment and maps
/// the 20 MiB pages covering it (2 pages, 40 MiB), keeping the 10 MiB left as a free block; a
/// 15 MiB request finds no free block that large, so PyTorch extends that free block by mapping
/// the next page (20 MiB: 10 + 20 = 30 MiB, split into 15 + 15). The recording shows two
/// `segment_map`s, 40 and 20 MiB; the pytorch-expandable replay holds the same 60 MiB at its peak
/// (classic would take a 30 MiB segment and, for 15 MiB ≥ 10 MiB, one rounded to 2 MiB: 16 MiB,
/// 46 MiB in all, §1.5).
#[test]
fn expandable_segments_map_20_mib_pages_at_the_lowest_free_address() {
    let a = BASE;
    let t = vec![
        e("segment_map", a, 40 * MIB, 0),
        e("alloc", a, 30 * MIB, 0),
        e("segment_map", a + 40 * MIB, 20 * MIB, 0),
        e("alloc", a + 30 * MIB, 15 * MIB, 0),
    ];
    let bytes = dumps(&dict(vec![
        ("segments", list(vec![])),
        ("device_traces", list(vec![list(t)])),
        (
            "allocator_settings",
            settings("expandable_segments:True", -1, 0.0, 0),
        ),
    ]));
    let trace = &analyse_snapshot(&bytes, "expandable").unwrap()[0].trace;
    assert_eq!(trace.recorded.unwrap().peak_reserved_bytes, 60 * MIB as u64);
    let opts = ReplayOptions::default();
    let ours = replay(trace, Policy::PytorchExpandable, &opts).unwrap();
    assert_eq!(ours.peak_reserved_bytes, 60 * MIB as u64);
    let classic = replay(trace, Policy::Classic, &opts).unwrap();
    assert_eq!(classic.peak_reserved_bytes, 46 * MIB as u64);
}
