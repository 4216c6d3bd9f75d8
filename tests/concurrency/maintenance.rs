//! The threads that are not workers: one calls `empty_cache`, `stats`, `snapshot` and the
//! invariant checks while the workers run; one plays the device, holding streams' work pending
//! and completing it, so frees wait on events and the allocator's event paths run concurrently.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Duration;

use vmm_alloc::MemoryStats;

use crate::checks::{check_snapshot, check_stats};
use crate::rng::Rng;
use crate::world::{PanicFlag, World};
use vmm_alloc::testkit::EmulatedBackend;

/// Runs until the workers stop. `invariants` is the allocator's own full check (or nothing).
pub fn maintenance<B: EmulatedBackend>(
    w: &World<'_, B>,
    mut rng: Rng,
    capacity: usize,
    invariants: &(dyn Fn() -> Result<(), String> + Sync),
) {
    let _flag = PanicFlag(w);
    while !w.stopping() {
        let r = rng.below(100);
        if r < 20 {
            // Only gives memory back: nothing it does may fail.
            if let Err(e) = w.alloc.empty_cache() {
                panic!("{}: empty_cache: {e}", w.name);
            }
            w.n.empty_caches.fetch_add(1, Relaxed);
        } else if r < 55 {
            let s: MemoryStats = w.alloc.stats();
            w.n.stats_calls.fetch_add(1, Relaxed);
            if let Err(e) = check_stats(&s, capacity) {
                panic!("{}: stats: {e}\n{s:#?}", w.name);
            }
        } else if r < 75 {
            if let Err(e) = invariants() {
                panic!("{}: invariants: {e}", w.name);
            }
            w.n.checks.fetch_add(1, Relaxed);
        } else if r < 95 {
            let snap = w.alloc.snapshot();
            w.n.snapshots.fetch_add(1, Relaxed);
            if let Err(e) = check_snapshot(&snap) {
                panic!("{}: snapshot: {e}", w.name);
            }
        } else {
            w.alloc.reset_peak_stats();
            w.n.stats_calls.fetch_add(1, Relaxed);
        }
        std::thread::sleep(Duration::from_micros(rng.below(400)));
    }
}

/// Holds and completes streams' work at random until every worker has finished, then completes
/// everything.
pub fn device<B: EmulatedBackend>(w: &World<'_, B>, mut rng: Rng) {
    let _flag = PanicFlag(w);
    while w.workers_left.load(SeqCst) > 0 && !w.failed.load(SeqCst) {
        let s = w.streams[rng.below(w.streams.len() as u64) as usize];
        let hold = !w.is_held(s);
        // Holds are short and releases come at once, so pending work never piles up for long.
        if !hold || rng.chance(500) {
            w.set_held(s, hold);
        }
        std::thread::sleep(Duration::from_micros(rng.below(600)));
    }
    for &s in &w.streams {
        w.set_held(s, false);
    }
}

/// Stops the run at the deadline, or earlier when a thread failed.
pub fn clock<B: EmulatedBackend>(w: &World<'_, B>, seconds: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds);
    while std::time::Instant::now() < deadline && !w.stopping() {
        std::thread::sleep(Duration::from_millis(5));
    }
    w.stop.store(true, SeqCst);
}
