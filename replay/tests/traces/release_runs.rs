//! The ordinary replay (`vmm-replay TRACE`) reads runs of `segment_free` as PyTorch made them
//! (Note [Release runs] in `src/snapshot/mod.rs`): generated snapshots, each what PyTorch's
//! `DeviceCachingAllocator` records for the program described above it (the conventions of
//! `recorded_mallocs.rs`), replayed through the classic allocator under the recorded settings.
//! The expected cudaMalloc counts and peaks are worked out by hand in the comments from
//! `pytorch-allocator.md` §1.3–1.11, not from the crate; `--check-classic` must agree too.

use vmm_alloc::backend::CallKind;
use vmm_replay::faithfulness::check_classic;
use vmm_replay::pickle::Value;
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::snapshot::{analyse_snapshot, DeviceTrace, ReleaseRuns};

use crate::recorded_mallocs::{collector_run, defaults, e, free, settings, BASE, GIB, MIB};
use crate::writer::{dict, dumps, list};

fn analyse(entries: Vec<Value>, recorded_settings: Value) -> DeviceTrace {
    let bytes = dumps(&dict(vec![
        ("segments", list(vec![])),
        ("device_traces", list(vec![list(entries)])),
        ("allocator_settings", recorded_settings),
    ]));
    analyse_snapshot(&bytes, "generated").unwrap().remove(0)
}

fn runs(empty_cache: u64, alloc_retry: u64, partial: u64) -> ReleaseRuns {
    ReleaseRuns {
        empty_cache,
        alloc_retry,
        partial,
        before_oom: 0,
    }
}

/// The ordinary replay of the classic allocator on a `capacity`-byte device: its successful
/// cudaMallocs and peak reserved bytes. `--check-classic` (on an 80 GiB device) must reproduce
/// the recording as well.
fn ordinary_classic(d: &DeviceTrace, capacity: i64) -> (u64, u64) {
    let check = check_classic(d, 80 << 30).unwrap();
    assert!(check.is_exact(), "{}", check.describe());
    let opts = ReplayOptions {
        capacity: capacity as usize,
        ..ReplayOptions::default()
    };
    let out = replay(&d.trace, Policy::Classic, &opts).unwrap();
    assert_eq!(out.ooms, 0);
    let mallocs = out.calls.calls(CallKind::Create) - out.calls.failures(CallKind::Create);
    (mallocs, out.peak_reserved_bytes)
}

fn recorded(d: &DeviceTrace) -> (u64, u64) {
    let r = d.trace.recorded.unwrap();
    (r.segment_allocs, r.peak_reserved_bytes)
}

/// No frames. L (1 KiB) lives in a 2 MiB small segment throughout. A (100 MiB) and B (60 MiB)
/// get their own segments (162 MiB reserved, the most ever) and are freed; `empty_cache()`
/// releases both (B first: the large pool in size order, §1.9), and X (1 KiB) then comes from
/// L's segment. E (20 MiB) gets a segment and is freed; `empty_cache()` releases it, and F
/// (20 MiB) needs a new one. That last run is followed by a `segment_alloc` and an `alloc` in
/// it, which the address rule alone takes for a retry; but a retry follows a failed
/// `cudaMalloc`, and 22 + 20 MiB fit on a device that held 162 MiB: it was `empty_cache()`.
/// PyTorch made 5 cudaMallocs (L, A, B, E, F), peak 162 MiB. Read as a retry, the replay
/// keeps E's segment and serves F from it: 4.
#[test]
fn an_empty_cache_without_frames_before_a_new_segment() {
    let (l, a, b, ee, f) = (
        BASE,
        BASE + GIB,
        BASE + 2 * GIB,
        BASE + 3 * GIB,
        BASE + 4 * GIB,
    );
    let mut t = vec![
        e("segment_alloc", l, 2 * MIB, 0),
        e("alloc", l, 1024, 0),
        e("segment_alloc", a, 100 * MIB, 0),
        e("alloc", a, 100 * MIB, 0),
        e("segment_alloc", b, 60 * MIB, 0),
        e("alloc", b, 60 * MIB, 0),
    ];
    t.extend(free(a, 100 * MIB, 0));
    t.extend(free(b, 60 * MIB, 0));
    t.extend([
        e("segment_free", b, 60 * MIB, 0),
        e("segment_free", a, 100 * MIB, 0),
        e("alloc", l + 1024, 1024, 0),
    ]);
    t.extend(free(l + 1024, 1024, 0));
    t.extend([
        e("segment_alloc", ee, 20 * MIB, 0),
        e("alloc", ee, 20 * MIB, 0),
    ]);
    t.extend(free(ee, 20 * MIB, 0));
    t.extend([
        e("segment_free", ee, 20 * MIB, 0),
        e("segment_alloc", f, 20 * MIB, 0),
        e("alloc", f, 20 * MIB, 0),
    ]);
    let d = analyse(t, defaults());
    assert_eq!(d.release_runs, runs(2, 0, 0));
    assert_eq!(recorded(&d), (5, 162 * MIB as u64));
    assert_eq!(ordinary_classic(&d, 80 * GIB), (5, 162 * MIB as u64));
}

/// `garbage_collection_threshold:0.5,per_process_memory_fraction:0.25`, no frames: the
/// program of `garbage_collection_frees_old_large_blocks_only` (in `recorded_mallocs.rs`), then
/// D (12 GiB). At C's malloc the collector frees A and B (6 GiB each) and leaves the free 2 MiB
/// small segment standing, which `empty_cache()` never does: the allocator's own release, no
/// event. C gets 7 GiB; the 1 KiB tensor reuses the small segment; D finds nothing, the
/// collector stays off (7 GiB + 2 MiB reserved is under its 10 GiB), and 19 GiB + 2 MiB fit in
/// the 20 GiB allowance: 5 cudaMallocs, peak 19 GiB + 2 MiB, the most ever. Since the 12 GiB and
/// 2 MiB reserved before the run plus 7 GiB fit under that peak, the reserved rule alone would
/// call the run `empty_cache()`, freeing the small segment: 6.
#[test]
fn a_collector_run_that_leaves_a_free_segment_standing() {
    let dd = BASE + 24 * GIB;
    let mut t = collector_run();
    t.extend([
        e("segment_alloc", dd, 12 * GIB, 0),
        e("alloc", dd, 12 * GIB, 0),
    ]);
    let conf = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.25";
    let d = analyse(t, settings(conf, -1, 0.5, 0));
    assert_eq!(d.release_runs, runs(0, 0, 1));
    let peak = (19 * GIB + 2 * MIB) as u64;
    assert_eq!(recorded(&d), (5, peak));
    assert_eq!(ordinary_classic(&d, 80 * GIB), (5, peak));
}

/// `max_split_size_mb:64` on a 130 MiB device, no frames: the program of
/// `max_split_retry_frees_only_the_oversize_block` (in `recorded_mallocs.rs`). A (100 MiB) and
/// B (30 MiB) are cached and fill the device; C (70 MiB) finds no block and `cudaMalloc` fails;
/// `release_available_cached_blocks` frees A alone (B stays standing) and the retry succeeds; B
/// serves D. PyTorch made 3 cudaMallocs, peak 130 MiB; the replayed allocator, on the same
/// device and settings, makes that release by itself.
#[test]
fn a_max_split_release_that_leaves_a_free_segment_standing() {
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
    let d = analyse(t, settings("max_split_size_mb:64", 64 * MIB, 0.0, 0));
    assert_eq!(d.release_runs, runs(0, 0, 1));
    assert_eq!(recorded(&d), (3, 130 * MIB as u64));
    assert_eq!(ordinary_classic(&d, 130 * MIB), (3, 130 * MIB as u64));
}

/// `max_split_size_mb:64`. A (100 MiB, oversize) is cached; X (40 MiB, its own segment) was
/// used on another stream and is freed but pending. C (70 MiB): the search fails, `cudaMalloc`
/// fails; `release_available_cached_blocks` frees A; `cudaMalloc` fails again (other memory on
/// the GPU); `release_cached_blocks` synchronizes (X completes) and frees X; the retry succeeds.
/// The trace: `segment_free` A, `free_completed` X, `segment_free` X, `segment_alloc` C. The
/// first run leaves no free segment standing, but it is not `empty_cache()`: nothing was
/// synchronized before it (X would have completed first), so it is the call's first release;
/// taken for `empty_cache()` it drops the whole cache in the ordinary replay. D (40 MiB) then
/// needs a new segment: 4 cudaMallocs, peak 140 MiB.
#[test]
fn a_max_split_release_before_the_synchronizing_retry() {
    let (a, x, c, dd) = (BASE, BASE + 2 * GIB, BASE + 3 * GIB, BASE + 4 * GIB);
    let mut t = vec![
        e("segment_alloc", a, 100 * MIB, 0),
        e("alloc", a, 100 * MIB, 0),
        e("segment_alloc", x, 40 * MIB, 0),
        e("alloc", x, 40 * MIB, 0),
    ];
    t.extend(free(a, 100 * MIB, 0));
    t.extend([
        e("free_requested", x, 40 * MIB, 0),
        // C's malloc.
        e("segment_free", a, 100 * MIB, 0),
        e("free_completed", x, 40 * MIB, 0),
        e("segment_free", x, 40 * MIB, 0),
        e("segment_alloc", c, 70 * MIB, 0),
        e("alloc", c, 70 * MIB, 0),
        e("segment_alloc", dd, 40 * MIB, 0),
        e("alloc", dd, 40 * MIB, 0),
    ]);
    let d = analyse(t, settings("max_split_size_mb:64", 64 * MIB, 0.0, 0));
    assert_eq!(d.release_runs, runs(0, 1, 1));
    assert_eq!(recorded(&d), (4, 140 * MIB as u64));
    let check = check_classic(&d, 80 << 30).unwrap();
    assert!(check.is_exact(), "{}", check.describe());
}
