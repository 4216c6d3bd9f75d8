//! The `Allocator` entry points: pointers that are null, misaligned, interior, past the end,
//! freed, pending a free, of a size class never used; sizes at every edge (1 byte, just over the
//! device, just over the memory fraction, exactly and just over 1 EB, near overflow with
//! `roundup_power2_divisions`); streams never seen.

use vmm_alloc::backend::{Backend, CallKind, StreamId};
use vmm_alloc::config::ONE_EXA_BYTES;
use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{AllocError, Allocator, DevAddr, MemoryStats};

use crate::{allocators, CAPACITY, MB};

const S0: StreamId = StreamId::DEFAULT;

/// Runs `f`, which must fail and change nothing at all: statistics (backend call counts
/// included: a refused input reaches no driver) and snapshot.
fn refused<T: std::fmt::Debug>(
    a: &dyn Allocator,
    what: &str,
    f: impl FnOnce() -> Result<T, AllocError>,
) -> AllocError {
    let before: (MemoryStats, Snapshot) = (a.stats(), a.snapshot());
    let err = match f() {
        Ok(v) => panic!("{what}: accepted, gave {v:?}"),
        Err(e) => e,
    };
    assert_eq!(
        (a.stats(), a.snapshot()),
        before,
        "{what}: {err} changed the state"
    );
    err
}

fn state_of(s: &Snapshot, addr: DevAddr) -> Option<BlockState> {
    s.segments
        .iter()
        .flat_map(|g| &g.blocks)
        .find(|b| b.address == addr)
        .map(|b| b.state)
}

#[test]
fn bad_pointers_are_named_and_change_nothing() {
    for (name, backend, a) in allocators("") {
        let held = StreamId::sim(3);
        backend.hold_stream(held);
        let live = a.allocate(4096, S0).unwrap();
        let big = a.allocate(30 * MB, StreamId::sim(1)).unwrap();
        let freed = a.allocate(8192, S0).unwrap();
        let freed_ptr = freed.ptr();
        a.deallocate(freed).unwrap();
        let pending = a.allocate(3 * MB, S0).unwrap();
        let pending_ptr = pending.ptr();
        a.record_stream(pending_ptr, held).unwrap();
        a.deallocate(pending).unwrap();
        assert_eq!(
            state_of(&a.snapshot(), pending_ptr),
            Some(BlockState::ActivePendingFree),
            "{name}"
        );
        let p = live.ptr();
        let end_of_big = big.ptr().checked_add(big.size()).unwrap();
        let invalid = [
            ("null", DevAddr::new(0)),
            ("the last address", DevAddr::new(u64::MAX)),
            ("misaligned by 1", p.checked_add(1).unwrap()),
            ("misaligned by 256", p.checked_add(256).unwrap()),
            ("interior", p.checked_add(512).unwrap()),
            (
                "interior of a large block",
                big.ptr().checked_add(20 * MB).unwrap(),
            ),
            ("one past the end", end_of_big),
            ("foreign", DevAddr::new(0x1234_5600)),
        ];
        for (what, ptr) in invalid {
            let what = format!("{name}: free of {what} {ptr}");
            let e = refused(&*a, &what, || a.deallocate_ptr(ptr));
            // The end of a block can be the start of a free or pending one: a double free there.
            let ok = matches!(e, AllocError::InvalidPointer(q) if q == ptr)
                || (ptr == end_of_big && matches!(e, AllocError::DoubleFree(q) if q == ptr));
            assert!(ok, "{what}: {e:?}");
            assert!(e.to_string().contains(&ptr.to_string()), "{what}: {e}");
            let e = refused(&*a, &what, || a.record_stream(ptr, StreamId::sim(5)));
            assert!(
                matches!(e, AllocError::InvalidPointer(q) if q == ptr),
                "{what} (record_stream): {e:?}"
            );
        }
        // A free waiting for another stream's work, freed again: a double free, named.
        let e = refused(&*a, name, || a.deallocate_ptr(pending_ptr));
        assert!(
            matches!(e, AllocError::DoubleFree(q) if q == pending_ptr),
            "{name}: {e:?}"
        );
        assert!(e.to_string().contains("double free"), "{e}");
        // record_stream of a freed or pending pointer: the block is not the caller's any more.
        for ptr in [freed_ptr, pending_ptr] {
            let e = refused(&*a, name, || a.record_stream(ptr, StreamId::sim(7)));
            assert!(
                matches!(e, AllocError::InvalidPointer(q) if q == ptr),
                "{name}: {e:?}"
            );
            assert!(
                e.to_string().contains("not the start of a live allocation"),
                "{e}"
            );
        }
        backend.release_stream(held);
        a.deallocate(live).unwrap();
        a.deallocate(big).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.stats().reserved_bytes.all.current, 0, "{name}");
        drop(a);
        assert!(backend.live().is_empty(), "{name}: {}", backend.live());
    }
}

/// Sizes a caller computes wrongly: each gives the right error, no panic (rounding overflow
/// included), and leaves the live state as it was.
#[test]
fn sizes_at_every_edge() {
    // roundup_power2_divisions makes rounding do arithmetic near the top of the range.
    for conf in ["", "roundup_power2_divisions:[>:8]", "max_split_size_mb:40"] {
        for (name, backend, a) in allocators(conf) {
            let what = |s: &str| format!("{name} [{conf}]: {s}");
            let one = a.allocate(1, S0).unwrap();
            assert_eq!(
                (one.size(), one.requested()),
                (512, 1),
                "{}",
                what("1 byte")
            );
            for size in [ONE_EXA_BYTES + 1, usize::MAX, usize::MAX - 511, 1 << 63] {
                let e = refused(&*a, &what(&format!("{size} bytes")), || {
                    a.allocate(size, S0)
                });
                assert!(
                    matches!(e, AllocError::TooLarge { size: s } if s == size),
                    "{e:?}"
                );
                assert!(e.to_string().contains("more than 1EB"), "{e}");
            }
            // Up to 1 EB is a real request, too large for the device: out of memory, its size
            // in the message, and nothing reserved by the attempt.
            for size in [ONE_EXA_BYTES, ONE_EXA_BYTES - 1, CAPACITY + 1, CAPACITY * 2] {
                let before = (a.stats(), a.snapshot());
                let e = a.allocate(size, S0).unwrap_err();
                assert!(e.is_out_of_memory(), "{}: {e:?}", what(&size.to_string()));
                assert!(
                    e.to_string()
                        .starts_with("CUDA out of memory. Tried to allocate"),
                    "{e}"
                );
                let after = (a.stats(), a.snapshot());
                assert_eq!(after.1, before.1, "{}", what("snapshot after OOM"));
                assert_eq!(after.0.reserved_bytes, before.0.reserved_bytes);
                assert_eq!(
                    after.0.num_ooms,
                    before.0.num_ooms + 1,
                    "{}",
                    what("num_ooms")
                );
            }
            a.deallocate(one).unwrap();
            a.empty_cache().unwrap();
            drop(a);
            assert!(backend.live().is_empty(), "{}", what("leak"));
        }
    }
}

#[test]
fn just_over_the_memory_fraction_is_oom_naming_the_limit() {
    for (name, backend, a) in allocators("per_process_memory_fraction:0.5") {
        // 100 MiB fit the 128 MiB allowed; 30 MiB more (a 30 MiB segment, or two 20 MiB
        // pages) do not.
        let most = a.allocate(100 * MB, S0).unwrap();
        let before = a.snapshot();
        let e = a.allocate(30 * MB, S0).unwrap_err();
        assert!(e.is_out_of_memory(), "{name}: {e:?}");
        assert!(
            e.to_string().contains("This process is allowed 128.00 MiB"),
            "{name}: {e}"
        );
        assert_eq!(a.snapshot(), before, "{name}");
        // The device itself has room: only the fraction said no.
        assert!(backend.mem_info().unwrap().free > CAPACITY / 3, "{name}");
        a.deallocate(most).unwrap();
    }
}

/// Streams the allocator never saw: allocating on them works (each is its own stream), and
/// `record_stream` with them records one event per distinct stream other than the block's own.
#[test]
fn streams_never_seen() {
    for (name, backend, a) in allocators("") {
        let odd = [StreamId::sim(u64::MAX), StreamId::sim(0xdead_beef)];
        let blocks: Vec<_> = odd
            .iter()
            .map(|&s| a.allocate(3 * MB, s).unwrap())
            .collect();
        assert_ne!(blocks[0].ptr(), blocks[1].ptr(), "{name}");
        let b = a.allocate(MB, S0).unwrap();
        for _ in 0..3 {
            for s in odd.into_iter().chain([S0]) {
                a.record_stream(b.ptr(), s).unwrap();
            }
        }
        let events = backend.calls().calls(CallKind::RecordEvent);
        a.deallocate(b).unwrap();
        assert_eq!(
            backend.calls().calls(CallKind::RecordEvent) - events,
            2,
            "{name}: one event per other stream, however often it was recorded"
        );
        for x in blocks {
            a.deallocate(x).unwrap();
        }
        a.empty_cache().unwrap();
        drop(a);
        assert!(backend.live().is_empty(), "{name}: {}", backend.live());
    }
}
