//! Common cases, part 1: the argument rules of reserve, create, map, unmap and release.
//! Every backend accepts and rejects exactly these calls.

use vmm_alloc::backend::{Backend, Capabilities, StreamId};
use vmm_alloc::SimBackend;
use vmm_alloc::{BackendErrorKind as E, DevAddr, VaRange};

use crate::support::{addr, foreign_handle, rw, Case, Subject, TestResult};

pub fn cases<B: Subject>() -> Vec<Case<B>> {
    cases![
        fresh_backend_is_empty_and_consistent,
        reserve_returns_aligned_disjoint_ranges,
        reserve_and_create_reject_bad_length,
        map_unmap_set_access_reject_bad_length,
        map_rejects_misaligned_address,
        map_rejects_misaligned_offset,
        map_rejects_outside_reservation,
        map_rejects_overlap,
        map_rejects_past_handle_end,
        map_only_whole_handles,
        unknown_handle_rejected,
        foreign_handle_rejected_even_when_number_collides,
        foreign_event_rejected_even_when_number_collides,
        release_twice_rejected,
        release_while_mapped_keeps_memory,
        unmap_never_mapped_rejected,
        unmap_twice_rejected,
        unmap_partial_mapping_rejected,
        unmap_covers_adjacent_mappings,
        range_overflow_rejected_without_panic,
    ]
}

fn fresh_backend_is_empty_and_consistent<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    ensure!(
        g.is_power_of_two(),
        "granularity {g:#x} is not a power of two"
    );
    ensure!(
        b.device() < b.device_count(),
        "own device {} is not below device_count {}",
        b.device(),
        b.device_count()
    );
    ensure!(
        b.live().is_empty(),
        "a new backend already holds {}",
        b.live()
    );
    ensure_eq!(b.calls().total(), 0, "calls counted on a new backend");
    let expected = match b.name() {
        "sim" => Capabilities::FAULT_INJECTION | Capabilities::HELD_EVENTS,
        "host" => Capabilities::BYTES | Capabilities::FAULT_INJECTION | Capabilities::HELD_EVENTS,
        "cuda" => Capabilities::BYTES | Capabilities::GPU,
        other => return Err(format!("unexpected backend name {other:?}").into()),
    };
    ensure_eq!(
        b.capabilities(),
        expected,
        "capabilities of the {} backend",
        b.name()
    );
    Ok(())
}

fn reserve_returns_aligned_disjoint_ranges<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let sizes = [g, 3 * g, 2 * g, g, 5 * g];
    let mut ranges: Vec<VaRange> = Vec::new();
    for len in sizes {
        let r = ok!(b.reserve(len));
        ensure_eq!(r.len, len, "length of the range reserve({len:#x}) returned");
        ensure!(
            r.start.is_aligned(g),
            "reservation {r} is not aligned to the granularity {g:#x}"
        );
        ensure!(r.end().is_some(), "reservation {r} wraps the address space");
        for other in &ranges {
            let disjoint = r.end() <= Some(other.start) || other.end() <= Some(r.start);
            ensure!(
                disjoint,
                "reservation {r} overlaps the earlier reservation {other}"
            );
        }
        ranges.push(r);
    }
    let live = b.live();
    ensure_eq!(live.reservations, sizes.len(), "live reservations");
    ensure_eq!(
        live.reserved_va_bytes,
        sizes.iter().sum::<usize>(),
        "live reserved_va_bytes"
    );
    ensure_eq!(
        (live.mappings, live.handles, live.physical_bytes),
        (0, 0, 0),
        "mappings, handles, physical bytes after reserving only"
    );
    // Every granule of every range is usable: map a handle at the first and the last one.
    let h = ok!(b.create(g));
    for r in &ranges {
        let last = addr(*r, r.len - g);
        ok!(b.map(r.start, g, h, 0));
        if last != r.start {
            ok!(b.map(last, g, h, 0));
            ok!(b.unmap(last, g));
        }
        ok!(b.unmap(r.start, g));
    }
    ok!(b.release(h));
    for r in ranges {
        ok!(b.free_reservation(r));
    }
    ensure!(
        b.live().is_empty(),
        "after freeing every reservation: {}",
        b.live()
    );
    Ok(())
}

fn reserve_and_create_reject_bad_length<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    // Something live, so "changed nothing" is checked against a non-empty state.
    let va = ok!(b.reserve(g));
    let h = ok!(b.create(g));
    for len in [0, 1, g / 2, g + 1, 3 * g - g / 2] {
        rejects!(b, Reserve, b.reserve(len),
            E::BadLength { len: l, granularity } if *l == len && *granularity == g);
        rejects!(b, Create, b.create(len),
            E::BadLength { len: l, granularity } if *l == len && *granularity == g);
    }
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn map_unmap_set_access_reject_bad_length<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(2 * g));
    for len in [0, g / 2, g + g / 2] {
        rejects!(b, Map, b.map(va.start, len, h, 0),
            E::BadLength { len: l, .. } if *l == len);
    }
    ok!(b.map(va.start, 2 * g, h, 0));
    for len in [0, g / 2, 2 * g - 1] {
        rejects!(b, Unmap, b.unmap(va.start, len), E::BadLength { len: l, .. } if *l == len);
        rejects!(b, SetAccess, b.set_access(va.start, len, &rw(b)),
            E::BadLength { len: l, .. } if *l == len);
    }
    ok!(b.unmap(va.start, 2 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn map_rejects_misaligned_address<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(g));
    for off in [1, g / 2, g + 512] {
        let at = addr(va, off);
        rejects!(b, Map, b.map(at, g, h, 0),
            E::Misaligned { what: "address", value, granularity }
                if *value == at.get() && *granularity == g);
    }
    ok!(b.map(addr(va, g), g, h, 0));
    let inside = addr(va, g + g / 2);
    rejects!(b, Unmap, b.unmap(inside, g),
        E::Misaligned { what: "address", value, .. } if *value == inside.get());
    rejects!(b, SetAccess, b.set_access(inside, g, &rw(b)),
        E::Misaligned { what: "address", value, .. } if *value == inside.get());
    ok!(b.unmap(addr(va, g), g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn map_rejects_misaligned_offset<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(2 * g));
    for offset in [1, g / 2, g + g / 2] {
        rejects!(b, Map, b.map(va.start, g, h, offset),
            E::Misaligned { what: "offset", value, granularity }
                if *value == offset as u64 && *granularity == g);
    }
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn map_rejects_outside_reservation<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(2 * g));
    let end = addr(va, 2 * g);
    // Just past the end, straddling the end, and an address no reservation is near.
    for (at, len) in [(end, g), (addr(va, g), 2 * g), (DevAddr::new(g as u64), g)] {
        rejects!(b, Map, b.map(at, len, h, 0),
            E::NotReserved { addr: a, len: l } if *a == at && *l == len);
    }
    // A reservation that was freed is no longer mappable.
    let gone = ok!(b.reserve(g));
    ok!(b.free_reservation(gone));
    rejects!(b, Map, b.map(gone.start, g, h, 0), E::NotReserved { .. });
    // The whole range itself is fine.
    ok!(b.map(va.start, 2 * g, h, 0));
    ok!(b.unmap(va.start, 2 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn map_rejects_overlap<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    // CUDA maps only whole handles: one handle per length tried.
    let handles = [ok!(b.create(g)), ok!(b.create(2 * g)), ok!(b.create(4 * g))];
    let handle_of = |len: usize| handles[(len / g).trailing_zeros() as usize];
    let existing = addr(va, g);
    ok!(b.map(existing, 2 * g, handle_of(2 * g), 0)); // [g, 3g)
                                                      // Same range, overlapping its head, its tail, enclosing it, inside it.
    for (off, len) in [
        (g, 2 * g),
        (0, 2 * g),
        (2 * g, 2 * g),
        (0, 4 * g),
        (2 * g, g),
    ] {
        let at = addr(va, off);
        rejects!(b, Map, b.map(at, len, handle_of(len), 0),
            E::AlreadyMapped { addr: a, len: l, existing: e }
                if *a == at && *l == len && *e == existing);
    }
    // Directly adjacent on both sides is not an overlap, and one handle may be mapped at several
    // addresses.
    let h2 = ok!(b.create(g));
    ok!(b.map(va.start, g, h2, 0));
    ok!(b.map(addr(va, 3 * g), g, h2, 0));
    ensure_eq!(b.live().mappings, 3, "mappings after two adjacent maps");
    ok!(b.unmap(va.start, 4 * g));
    for h in handles {
        ok!(b.release(h));
    }
    ok!(b.release(h2));
    ok!(b.free_reservation(va));
    Ok(())
}

fn map_rejects_past_handle_end<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(2 * g));
    let huge = usize::MAX & !(g - 1); // aligned, and offset + len overflows
    for (offset, len) in [(2 * g, g), (g, 2 * g), (0, 3 * g), (huge, g)] {
        rejects!(b, Map, b.map(va.start, len, h, offset),
            E::PastHandleEnd { offset: o, len: l, handle_size }
                if *o == offset && *l == len && *handle_size == 2 * g);
    }
    ok!(b.map(va.start, 2 * g, h, 0)); // the whole handle is fine
    ok!(b.unmap(va.start, 2 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

/// CUDA maps only whole handles: `cuMemMap` with a non-zero offset or a length shorter than the
/// handle returns `CUDA_ERROR_NOT_SUPPORTED` on an H100 (driver 580, CUDA 13; GPU.md), so every
/// backend refuses it with `PartialHandle`, maps nothing, and maps the whole handle afterwards.
fn map_only_whole_handles<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(2 * g));
    for (offset, len) in [(g, g), (0, g)] {
        let err = rejects!(b, Map, b.map(va.start, len, h, offset),
            E::PartialHandle { offset: o, len: l, handle_size }
                if *o == offset && *l == len && *handle_size == 2 * g);
        ensure!(
            !err.is_caller_bug(),
            "a partial map is refused by CUDA itself, not a bug-check kind: {err}"
        );
    }
    ensure_eq!(b.live().mappings, 0, "mappings after refused partial maps");
    ok!(b.map(va.start, 2 * g, h, 0));
    ok!(b.map(addr(va, 2 * g), 2 * g, h, 0)); // the whole handle again, elsewhere
    let live = b.live();
    ensure_eq!(
        (live.mappings, live.mapped_bytes, live.physical_bytes),
        (2, 4 * g, 2 * g),
        "(mappings, mapped bytes, physical bytes) with one handle mapped twice"
    );
    ok!(b.set_access(va.start, 4 * g, &rw(b)));
    ok!(b.unmap(va.start, 4 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn unknown_handle_rejected<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(g));
    let mine = ok!(b.create(g));
    let foreign = foreign_handle(b)?;
    rejects!(b, Map, b.map(va.start, g, foreign, 0), E::UnknownHandle(x) if *x == foreign);
    rejects!(b, Release, b.release(foreign), E::UnknownHandle(x) if *x == foreign);
    ok!(b.release(mine));
    ok!(b.free_reservation(va));
    Ok(())
}

/// `PhysHandle` promises that a foreign handle is an error. Backends number handles from 1, so
/// another backend's first handle carries the same number as this one's: using it here must still
/// be refused, not act on this backend's own handle.
fn foreign_handle_rejected_even_when_number_collides<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let other = SimBackend::new();
    let va = ok!(b.reserve(g));
    let mine = ok!(b.create(g));
    let theirs = ok!(other.create(other.granularity()));
    rejects!(b, Map, b.map(va.start, g, theirs, 0), E::UnknownHandle(_));
    rejects!(b, Release, b.release(theirs), E::UnknownHandle(_));
    ok!(b.release(mine));
    ok!(b.free_reservation(va));
    Ok(())
}

/// The same for events: another backend's first event is not this backend's first event.
fn foreign_event_rejected_even_when_number_collides<B: Subject>(b: &B) -> TestResult {
    let other = SimBackend::new();
    let mine = ok!(b.record_event(StreamId::DEFAULT));
    let theirs = ok!(other.record_event(StreamId::DEFAULT));
    rejects!(b, QueryEvent, b.query_event(theirs), E::UnknownEvent(_));
    rejects!(b, ReleaseEvent, b.release_event(theirs), E::UnknownEvent(_));
    ok!(b.release_event(mine));
    Ok(())
}

fn release_twice_rejected<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(g));
    let h = ok!(b.create(g));
    ok!(b.release(h));
    let err = rejects!(b, Release, b.release(h), E::HandleAlreadyReleased(x) if *x == h);
    ensure!(
        err.is_caller_bug(),
        "a double release must be reported as a caller bug: {err}"
    );
    rejects!(b, Map, b.map(va.start, g, h, 0), E::HandleAlreadyReleased(x) if *x == h);
    ok!(b.free_reservation(va));
    Ok(())
}

fn release_while_mapped_keeps_memory<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let exact = !b.capabilities().contains(Capabilities::GPU);
    let bytes = b.capabilities().contains(Capabilities::BYTES);
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    ok!(b.map(addr(va, g), g, h, 0));
    ok!(b.set_access(va.start, 2 * g, &rw(b)));
    let data = crate::support::pattern(256, 7);
    if bytes {
        ok!(b.write(addr(va, g + 100), &data));
    }
    let before = ok!(b.mem_info());
    ok!(b.release(h));
    let live = b.live();
    ensure_eq!(
        (live.handles, live.mappings, live.physical_bytes),
        (0, 2, g),
        "(handles, mappings, physical bytes) after releasing a mapped handle"
    );
    if exact {
        ensure_eq!(
            ok!(b.mem_info()),
            before,
            "mem_info after releasing a still-mapped handle"
        );
    }
    rejects!(b, Release, b.release(h), E::HandleAlreadyReleased(_));
    if bytes {
        crate::support::expect_bytes(b, addr(va, g + 100), &data, "after release, still mapped")?;
    }
    ok!(b.unmap(va.start, g));
    ensure_eq!(
        b.live().physical_bytes,
        g,
        "physical bytes while one mapping is left"
    );
    ok!(b.unmap(addr(va, g), g));
    ensure_eq!(
        b.live().physical_bytes,
        0,
        "physical bytes after the last unmap"
    );
    if exact {
        let after = ok!(b.mem_info());
        ensure_eq!(
            after.free,
            after.total,
            "mem_info free after the last unmap"
        );
    }
    ok!(b.free_reservation(va));
    Ok(())
}

/// CUDA returns success for an unmap of a range that holds no mapping; every backend rejects it,
/// and says `NotMapped` when nothing in the range was ever mapped (in its current reservation).
fn unmap_never_mapped_rejected<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(g));
    let h2 = ok!(b.create(2 * g));
    ok!(b.map(addr(va, g), g, h, 0));
    // A map that was refused maps nothing, so it does not make its range "mapped once" either.
    rejects!(
        b,
        Map,
        b.map(va.start, 2 * g, h2, 0),
        E::AlreadyMapped { .. }
    );
    ok!(b.release(h2));
    for (at, len) in [
        (va.start, g),
        (addr(va, 2 * g), 2 * g),
        (DevAddr::new(g as u64), g),
    ] {
        let err = rejects!(b, Unmap, b.unmap(at, len),
            E::NotMapped { addr: a, len: l } if *a == at && *l == len);
        ensure!(
            err.is_caller_bug(),
            "unmapping a never-mapped range is a caller bug: {err}"
        );
    }
    ok!(b.unmap(addr(va, g), g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    // Freeing the reservation forgets what was mapped in it: that range holds nothing now, and
    // if it is reserved again, nothing will have been mapped there.
    rejects!(b, Unmap, b.unmap(addr(va, g), g),
        E::NotMapped { addr: a, .. } if *a == addr(va, g));
    Ok(())
}

/// A second unmap of the same range is `DoubleUnmap`, distinct from `NotMapped`: the range was
/// mapped, and unmapped already.
fn unmap_twice_rejected<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h = ok!(b.create(2 * g));
    ok!(b.map(va.start, 2 * g, h, 0));
    ok!(b.unmap(va.start, 2 * g));
    let err = rejects!(b, Unmap, b.unmap(va.start, 2 * g),
        E::DoubleUnmap { addr: a, len: l } if *a == va.start && *l == 2 * g);
    ensure!(err.is_caller_bug(), "a double unmap is a caller bug: {err}");
    ensure!(
        !err.is_out_of_memory(),
        "a double unmap is not out of memory: {err}"
    );
    // Either half of it, and a range that reaches past it into never-mapped space.
    for (off, len) in [(0, g), (g, g), (g, 3 * g)] {
        let at = addr(va, off);
        rejects!(b, Unmap, b.unmap(at, len),
            E::DoubleUnmap { addr: a, len: l } if *a == at && *l == len);
    }
    // The never-mapped rest of the reservation is still `NotMapped`.
    rejects!(
        b,
        Unmap,
        b.unmap(addr(va, 2 * g), 2 * g),
        E::NotMapped { .. }
    );
    // Mapped again, the range unmaps normally, once; also once the handle is gone entirely.
    ok!(b.map(va.start, 2 * g, h, 0));
    ok!(b.release(h));
    ok!(b.unmap(va.start, 2 * g));
    rejects!(b, Unmap, b.unmap(va.start, 2 * g), E::DoubleUnmap { .. });
    ok!(b.free_reservation(va));
    Ok(())
}

fn unmap_partial_mapping_rejected<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(5 * g));
    let h = ok!(b.create(2 * g));
    let h1 = ok!(b.create(g));
    ok!(b.map(va.start, 2 * g, h, 0)); // [0, 2g)
    ok!(b.map(addr(va, 3 * g), g, h1, 0)); // [3g, 4g), a gap before it
                                           // Half of a mapping, either half; a mapping plus unmapped space; two mappings and the gap.
    for (off, len) in [
        (0, g),
        (g, g),
        (0, 3 * g),
        (g, 2 * g),
        (0, 4 * g),
        (2 * g, 3 * g),
    ] {
        let at = addr(va, off);
        let err = rejects!(b, Unmap, b.unmap(at, len),
            E::PartialMapping { addr: a, len: l } if *a == at && *l == len);
        ensure!(
            !err.is_caller_bug(),
            "PartialMapping is not a bug-check kind: {err}"
        );
    }
    ok!(b.unmap(va.start, 2 * g));
    ok!(b.unmap(addr(va, 3 * g), g));
    ok!(b.release(h));
    ok!(b.release(h1));
    ok!(b.free_reservation(va));
    Ok(())
}

fn unmap_covers_adjacent_mappings<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(4 * g));
    let h1 = ok!(b.create(g));
    let h2 = ok!(b.create(g));
    ok!(b.map(va.start, g, h1, 0));
    ok!(b.map(addr(va, g), g, h2, 0));
    ok!(b.map(addr(va, 2 * g), g, h1, 0)); // h1 again: one handle, two of the three mappings
    ok!(b.set_access(va.start, 3 * g, &rw(b)));
    let before = b.calls();
    ok!(b.unmap(va.start, 3 * g));
    let cost = b.calls().since(&before);
    ensure_eq!(
        cost.total(),
        1,
        "calls made by one unmap of three mappings ({cost})"
    );
    let live = b.live();
    ensure_eq!(
        (live.mappings, live.mapped_bytes),
        (0, 0),
        "mappings left after the unmap"
    );
    rejects!(b, Unmap, b.unmap(va.start, 3 * g), E::DoubleUnmap { .. });
    ok!(b.release(h1));
    ok!(b.release(h2));
    ok!(b.free_reservation(va));
    Ok(())
}

fn range_overflow_rejected_without_panic<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let top = DevAddr::new(u64::MAX - (g as u64 - 1)); // aligned, the last granule
    let h = ok!(b.create(2 * g));
    rejects!(b, Map, b.map(top, 2 * g, h, 0),
        E::RangeOverflow { addr: a, len } if *a == top && *len == 2 * g);
    // Ending exactly at 2^64 cannot be inside a reservation either.
    rejects!(
        b,
        Map,
        b.map(top, g, h, 0),
        E::RangeOverflow { .. } | E::NotReserved { .. }
    );
    rejects!(b, Unmap, b.unmap(top, 2 * g), E::RangeOverflow { .. });
    rejects!(
        b,
        SetAccess,
        b.set_access(top, 2 * g, &rw(b)),
        E::RangeOverflow { .. }
    );
    rejects!(
        b,
        FreeReservation,
        b.free_reservation(VaRange {
            start: top,
            len: 2 * g
        }),
        E::UnknownReservation { .. } | E::RangeOverflow { .. }
    );
    // A huge length from a real reservation.
    let va = ok!(b.reserve(g));
    let huge = usize::MAX & !(g - 1);
    rejects!(b, Map, b.map(va.start, huge, h, 0), E::RangeOverflow { .. });
    if b.capabilities().contains(Capabilities::BYTES) {
        let near = DevAddr::new(u64::MAX - 3);
        rejects!(b, Write, b.write(near, &[1u8; 8]), E::RangeOverflow { .. });
        rejects!(
            b,
            Read,
            b.read(near, &mut [0u8; 8]),
            E::RangeOverflow { .. }
        );
    }
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}
