//! A growth that fails at any step leaves nothing behind (pytorch#188008 terminates there): a
//! fault at every reserve, create, map and set-access call, generic or out-of-memory, into a new
//! segment, into an existing one, with handles taken from the handle cache, and when the
//! rollback's own unmap fails.

use vmm_alloc::backend::{Backend, CallKind, LiveResources, SimBackend};
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::snapshot::Snapshot;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, StreamId};

use crate::expandable_regressions::sim;

const MB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// Where a growth of 10 MiB (five 2 MiB pages) starts from.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// No segment: the growth reserves one.
    Fresh,
    /// A segment with a live 1 MiB + 512 B block and the free rest of its page: the growth
    /// extends that free range into the hole after it.
    Existing,
    /// As `Existing`, and three 2 MiB handles in the handle cache: the growth maps them before
    /// creating two more.
    Cached,
}

struct Setup {
    backend: SimBackend,
    alloc: ExpandableAllocator<SimBackend>,
    kept: Vec<Allocation>,
}

fn setup(start: Start) -> Setup {
    let backend = sim(1 << 30);
    let config = ExpandableConfig {
        large_page: 2 * MB,
        handle_cache_limit: 6 * MB,
        ..ExpandableConfig::default()
    };
    let alloc = ExpandableAllocator::new(backend.clone(), config).unwrap();
    let mut kept = Vec::new();
    if !matches!(start, Start::Fresh) {
        kept.push(alloc.allocate(MB + 512, S0).unwrap());
    }
    if let Start::Cached = start {
        let other = alloc.allocate(6 * MB, StreamId::sim(1)).unwrap();
        alloc.deallocate(other).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().handles_cached, 3);
    }
    Setup {
        backend,
        alloc,
        kept,
    }
}

/// Everything a rolled-back growth must leave as it was.
#[derive(PartialEq, Debug)]
struct Held {
    device: LiveResources,
    snapshot: Snapshot,
    reserved: u64,
    segments: u64,
    handles_cached: u64,
    cache_bytes: u64,
}

fn held(s: &Setup) -> Held {
    let stats = s.alloc.stats();
    Held {
        device: s.backend.live(),
        snapshot: s.alloc.snapshot(),
        reserved: stats.reserved_bytes.all.current,
        segments: stats.segment.all.current,
        handles_cached: stats.handles_cached,
        cache_bytes: stats.handle_cache_bytes,
    }
}

/// The device holds exactly what the allocator accounts for: no mapping, handle or reservation
/// left over by a growth.
fn no_debris(s: &Setup, what: &str) {
    s.alloc.check_invariants().unwrap();
    let (live, stats) = (s.backend.live(), s.alloc.stats());
    // Each chunk is one mapping: mapped by a device alloc, unmapped by a device free.
    let mappings = (stats.num_device_alloc - stats.num_device_free) as usize;
    assert_eq!(
        live.mapped_bytes as u64, stats.reserved_bytes.all.current,
        "{what}"
    );
    assert_eq!(live.mappings, mappings, "{what}: mappings");
    assert_eq!(
        live.handles as u64,
        mappings as u64 + stats.handles_cached,
        "{what}: handles"
    );
    assert_eq!(
        live.reservations as u64, stats.segment.all.current,
        "{what}: reservations"
    );
}

/// Fails the n-th call of each growth step (and, for out-of-memory, every later one so the
/// retry fails too), for every n, from every start.
#[test]
fn a_fault_at_every_growth_step_is_rolled_back() {
    let steps = [
        (CallKind::Reserve, 2),
        (CallKind::Create, 5),
        (CallKind::Map, 5),
        (CallKind::SetAccess, 2),
    ];
    let mut fired = [0u32; 2];
    for start in [Start::Fresh, Start::Existing, Start::Cached] {
        for (kind, max_n) in steps {
            for n in 1..=max_n {
                for (e, (error, trigger)) in [
                    (FaultError::Injected, Trigger::Nth(n)),
                    (FaultError::OutOfMemory, Trigger::From(n)),
                ]
                .into_iter()
                .enumerate()
                {
                    let s = setup(start);
                    let before = held(&s);
                    let what = format!("{start:?}, {kind:?} #{n} {error:?}");
                    s.backend
                        .set_faults(FaultPlan::new().fail(kind, trigger, error));
                    let result = s.alloc.allocate(10 * MB, S0);
                    if s.backend.clear_faults() == 0 {
                        // This start makes fewer calls of this kind: nothing was injected.
                        s.alloc.deallocate(result.unwrap()).unwrap();
                        continue;
                    }
                    fired[e] += 1;
                    match (error, result) {
                        (FaultError::Injected, Err(err)) => {
                            assert!(!err.is_out_of_memory(), "{what}: {err}");
                            assert_eq!(held(&s), before, "{what}: not rolled back exactly");
                        }
                        // Out of memory: the cache may be released and free pages unmapped to
                        // retry, so only "no debris" holds.
                        (FaultError::OutOfMemory, Err(err)) => {
                            assert!(err.is_out_of_memory(), "{what}: {err}")
                        }
                        (_, Ok(a)) => panic!("{what}: succeeded at {:?}", a.ptr()),
                    }
                    no_debris(&s, &what);
                    // Usable afterwards, and everything goes back.
                    let ok = s.alloc.allocate(10 * MB, S0).unwrap();
                    s.alloc.deallocate(ok).unwrap();
                    let Setup {
                        backend,
                        alloc,
                        kept,
                    } = s;
                    for k in kept {
                        alloc.deallocate(k).unwrap();
                    }
                    drop(alloc);
                    assert!(backend.live().is_empty(), "{what}: {}", backend.live());
                }
            }
        }
    }
    assert!(fired.iter().all(|&f| f >= 20), "faults injected: {fired:?}");
}

/// Handles a failed growth took from the cache go back to the cache, not to the device.
#[test]
fn cached_handles_return_to_the_cache_on_rollback() {
    let s = setup(Start::Cached);
    let releases = s.backend.calls().calls(CallKind::Release);
    // The fifth map fails: three cached handles and one created are mapped by then.
    s.backend.set_faults(FaultPlan::new().fail(
        CallKind::Map,
        Trigger::Nth(5),
        FaultError::Injected,
    ));
    s.alloc.allocate(10 * MB, S0).unwrap_err();
    s.backend.clear_faults();
    let stats = s.alloc.stats();
    assert_eq!(
        (stats.handles_cached, stats.handle_cache_bytes),
        (3, 6 * MB as u64)
    );
    assert_eq!(
        s.backend.calls().calls(CallKind::Release) - releases,
        2,
        "only the two handles the growth created are released"
    );
    no_debris(&s, "cached");
}

/// When the rollback's unmap fails too, nothing is left inconsistent: the chunks that stay
/// mapped are kept aside (never handed out, never mapped over, their handles neither cached nor
/// released) and given back by the next `empty_cache`.
#[test]
fn a_failed_unmap_during_rollback_leaves_a_consistent_state() {
    for (unmap_trigger, stuck) in [(Trigger::Nth(1), false), (Trigger::From(1), true)] {
        let s = setup(Start::Cached);
        let before = held(&s);
        s.backend.set_faults(
            FaultPlan::new()
                .fail(CallKind::Map, Trigger::Nth(4), FaultError::Injected)
                .fail(CallKind::Unmap, unmap_trigger, FaultError::Injected),
        );
        s.alloc.allocate(10 * MB, S0).unwrap_err();
        s.backend.clear_faults();
        s.alloc.check_invariants().unwrap();
        let what = format!("unmap fails {unmap_trigger:?}");
        if !stuck {
            // The run's unmap failed once; chunk by chunk it succeeded.
            assert_eq!(held(&s), before, "{what}");
            assert_eq!(s.alloc.stats().stuck_bytes, 0, "{what}");
            continue;
        }
        // Three chunks (the cached handles) stay mapped, outside every count.
        let live = s.backend.live();
        assert_eq!(
            live.mapped_bytes - before.device.mapped_bytes,
            6 * MB,
            "{what}"
        );
        assert_eq!(
            live.handles, before.device.handles,
            "{what}: no handle released"
        );
        let stats = s.alloc.stats();
        assert_eq!(stats.reserved_bytes.all.current, before.reserved, "{what}");
        assert_eq!(
            stats.handles_cached, 0,
            "{what}: mapped handles are not cached"
        );
        assert_eq!(
            stats.stuck_bytes,
            6 * MB as u64,
            "{what}: the stuck chunks are reported"
        );
        // Growth maps around them.
        let a = s.alloc.allocate(10 * MB, S0).unwrap();
        s.alloc.check_invariants().unwrap();
        s.alloc.deallocate(a).unwrap();
        for k in s.kept {
            s.alloc.deallocate(k).unwrap();
        }
        s.alloc.empty_cache().unwrap();
        let stats = s.alloc.stats();
        assert_eq!(stats.reserved_bytes.all.current, 0);
        assert_eq!(
            stats.stuck_bytes, 0,
            "{what}: empty_cache unmapped the stuck chunks"
        );
        // The cache keeps 6 MiB; everything else, the stuck chunks included, is given back.
        assert_eq!(s.backend.live().mapped_bytes, 0, "{what}");
        assert_eq!(
            s.backend.live().handles as u64,
            stats.handles_cached,
            "{what}"
        );
        assert_eq!(s.backend.live().reservations, 0, "{what}");
    }
}
