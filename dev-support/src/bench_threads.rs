//! The threads measurement shared by `threads.rs` (Sim) and `gpu.rs` (Cuda): 1 and 2 threads,
//! each on its own stream, running allocate/free loops against one shared allocator. Reported as
//! operations per second, one operation being one `allocate` or one `deallocate`. The total work
//! is the same for 1 and 2 threads (`PAIRS` pairs per iteration, split between the threads), so
//! the two groups' times compare directly.
//!
//! Each thread keeps a ring of `RING` live blocks and, per step, frees the oldest and allocates
//! the next size of `SIZES` (small and large pools both), so the free-range index holds more
//! than one block; in the same-size workload it allocates the size it just freed instead, and in
//! the varied one the next of 48 sizes (512 B to 8.5 MiB), so a size comes back only 48 steps
//! after it was last asked for: what a per-stream cache of freed blocks cannot serve. Every
//! allocator ([`contenders`]: expandable, the default, whose per-stream front cache engages
//! once threads contend; `-front-cache` with it always on; `-single-lock` with it off;
//! pytorch-expandable, classic) runs in the same process, and so does `expandable-unshared`: one
//! allocator per thread, nothing shared, the most any locking scheme could reach on the machine.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use vmm_alloc::backend::Backend;
use vmm_alloc::config::{AllocConf, ExpandableConfig, FrontCacheMode};
use vmm_alloc::{Allocation, Allocator, ClassicAllocator, ExpandableAllocator, StreamId};

use crate::bench_extra::Json;

const SIZES: [usize; 6] = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 20 << 20];
const RING: usize = 8;
/// Allocate/free pairs per iteration, all threads together: enough that spawning the threads is
/// noise.
const PAIRS: usize = 4_000;

/// What each step of a thread's loop allocates after freeing the oldest block of its ring.
#[derive(Clone, Copy, Debug)]
pub enum Shapes {
    /// The next of `SIZES`: each size freed four allocations before it is asked for again.
    Ring,
    /// The size just freed (fixed shapes: a tensor freed and the next of its shape allocated).
    SameSize,
    /// The next of the varied sizes: none asked for again within 48 steps.
    Varied,
}

impl Shapes {
    /// The three workloads, in the order the benches run them.
    pub const ALL: [Shapes; 3] = [Shapes::Ring, Shapes::SameSize, Shapes::Varied];

    /// The workload's name in the Sim bench's groups (`threads/2`, `threads-varied/1`).
    pub fn sim_group(self) -> &'static str {
        match self {
            Shapes::Ring => "threads",
            Shapes::SameSize => "threads-same-size",
            Shapes::Varied => "threads-varied",
        }
    }

    /// The workload's short name (the GPU bench's groups and side output).
    pub fn short(self) -> &'static str {
        match self {
            Shapes::Ring => "ring",
            Shapes::SameSize => "same_size",
            Shapes::Varied => "varied",
        }
    }
}

/// The varied sizes: 48 of them, from 512 B up by 23 % a step, rounded to 512 B.
fn varied(i: usize) -> usize {
    let k = (i % 48) as i32;
    ((512.0 * 1.23f64.powi(k)) as usize).div_ceil(512) * 512
}

/// Makes one allocator (a fresh one per call).
pub type Make = Arc<dyn Fn() -> Arc<dyn Allocator> + Send + Sync>;

/// One allocator measured: its name, how to make it, and whether each thread gets its own.
#[derive(Clone)]
pub struct Contender {
    /// The name in the benchmark ids.
    pub name: &'static str,
    /// Makes a fresh allocator.
    pub make: Make,
    /// Each thread gets an allocator of its own (`expandable-unshared`), made before the start.
    pub unshared: bool,
}

/// The allocators every threads bench compares, each on a backend from `backend` (called once
/// per allocator made).
pub fn contenders<B: Backend + 'static>(
    backend: impl Fn() -> B + Send + Sync + 'static,
) -> Vec<Contender> {
    let backend = Arc::new(backend);
    let expandable = |front: Option<FrontCacheMode>| -> Make {
        let backend = Arc::clone(&backend);
        Arc::new(move || {
            let mut config = ExpandableConfig::default();
            if let Some(mode) = front {
                config.front_cache = mode;
            }
            Arc::new(ExpandableAllocator::new(backend(), config).expect("expandable"))
        })
    };
    let pytorch: Make = {
        let backend = Arc::clone(&backend);
        Arc::new(move || {
            let config = ExpandableConfig::pytorch_expandable();
            Arc::new(ExpandableAllocator::new(backend(), config).expect("pytorch-expandable"))
        })
    };
    let classic: Make = {
        let backend = Arc::clone(&backend);
        Arc::new(move || {
            Arc::new(ClassicAllocator::new(backend(), AllocConf::default()).expect("classic"))
        })
    };
    let one = |name, make, unshared| Contender {
        name,
        make,
        unshared,
    };
    vec![
        one("expandable", expandable(None), false),
        one(
            "expandable-single-lock",
            expandable(Some(FrontCacheMode::Off)),
            false,
        ),
        one(
            "expandable-front-cache",
            expandable(Some(FrontCacheMode::Always)),
            false,
        ),
        one("expandable-unshared", expandable(None), true),
        one("pytorch-expandable", pytorch, false),
        one("classic", classic, false),
    ]
}

/// One thread's loop: `pairs` times, free the oldest of the ring and allocate the next size.
fn churn(
    a: &dyn Allocator,
    stream: StreamId,
    ring: &mut Vec<Allocation>,
    pairs: usize,
    shapes: Shapes,
) {
    for i in 0..pairs {
        let old = ring.remove(0);
        let size = match shapes {
            Shapes::SameSize => old.requested(),
            Shapes::Ring => SIZES[i % SIZES.len()],
            Shapes::Varied => varied(i),
        };
        a.deallocate(old).expect("deallocate");
        ring.push(black_box(a.allocate(size, stream).expect("allocate")));
    }
}

/// Runs `iters * PAIRS / threads` pairs on each of the first `threads` of `streams` at once (each
/// on a fresh allocator of `who`, warmed before the start, when it is unshared; else on `a`) and
/// returns the time from the common start to the last thread's end (thread start-up is outside
/// it).
fn run(
    a: &Arc<dyn Allocator>,
    who: &Contender,
    shapes: Shapes,
    streams: &[StreamId],
    iters: u64,
) -> Duration {
    let threads = streams.len();
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = streams
        .iter()
        .map(|&stream| {
            let a = if who.unshared {
                (who.make)()
            } else {
                Arc::clone(a)
            };
            let unshared = who.unshared;
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let mut ring: Vec<Allocation> = (0..RING)
                    .map(|i| {
                        a.allocate(SIZES[i % SIZES.len()], stream)
                            .expect("allocate")
                    })
                    .collect();
                if unshared {
                    churn(&*a, stream, &mut ring, PAIRS, shapes);
                }
                start.wait();
                churn(
                    &*a,
                    stream,
                    &mut ring,
                    iters as usize * PAIRS / threads,
                    shapes,
                );
                for b in ring {
                    a.deallocate(b).expect("deallocate");
                }
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    for h in handles {
        h.join().expect("thread");
    }
    t.elapsed()
}

/// Measures every contender on `shapes` with 1 thread (on `streams[0]`) and with 2 (on both), one
/// criterion group per thread count named by `group(threads)`, set up by `setup`.
pub fn measure(
    c: &mut Criterion,
    shapes: Shapes,
    contenders: &[Contender],
    streams: [StreamId; 2],
    group: impl Fn(usize) -> String,
    setup: impl Fn(&mut BenchmarkGroup<'_, WallTime>),
) {
    for threads in [1, 2] {
        let mut g = c.benchmark_group(group(threads));
        setup(&mut g);
        g.throughput(Throughput::Elements((PAIRS * 2) as u64));
        for who in contenders {
            let a = (who.make)();
            let streams = &streams[..threads];
            // Map every segment once, so the timed loops run on cached memory.
            run(&a, who, shapes, streams, 1);
            g.bench_function(BenchmarkId::from_parameter(who.name), |b| {
                b.iter_custom(|iters| run(&a, who, shapes, streams, iters))
            });
        }
        g.finish();
    }
}

/// Two threads' throughput over one thread's, per contender on `shapes` (one row each): each count timed
/// `rounds` times (alternating, 25 iterations of `PAIRS` pairs each, after one untimed
/// iteration), the medians compared. A side output beside criterion's figures, for a report
/// that wants the ratio the target names (2 threads ≥ 1.5 × one) without reading criterion's
/// files.
pub fn scaling(
    shapes: Shapes,
    contenders: &[Contender],
    streams: [StreamId; 2],
    rounds: usize,
) -> Vec<Json> {
    let rows = contenders.iter().map(|who| {
        let a = (who.make)();
        let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        for threads in [1, 2] {
            run(&a, who, shapes, &streams[..threads], 1);
        }
        for _ in 0..rounds.max(1) {
            for threads in [1, 2] {
                times[threads - 1].push(run(&a, who, shapes, &streams[..threads], 25));
            }
        }
        let ops = (25 * PAIRS * 2) as f64;
        let [one, two] = times.map(|mut t| {
            t.sort();
            ops / t[t.len() / 2].as_secs_f64()
        });
        Json::obj([
            ("workload", shapes.short().into()),
            ("allocator", who.name.into()),
            ("ops_per_second_1_thread", one.into()),
            ("ops_per_second_2_threads", two.into()),
            ("two_over_one", (two / one).into()),
        ])
    });
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_alloc::SimBackend;

    /// The side output the GPU report reads: a row per allocator, with both throughputs measured
    /// and their ratio, on real runs of the loop (one round).
    #[test]
    fn scaling_reports_each_allocator_at_one_and_two_threads() {
        let contenders = contenders(SimBackend::new);
        let streams = [StreamId::sim(1), StreamId::sim(2)];
        let rows = scaling(Shapes::Varied, &contenders, streams, 1);
        assert_eq!(rows.len(), contenders.len());
        for (row, who) in rows.iter().zip(&contenders) {
            let Json::Obj(fields) = row else {
                panic!("{}: a row is an object", who.name);
            };
            let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v);
            assert!(
                matches!(get("allocator"), Some(Json::Str(n)) if n == who.name),
                "{}: the row names another allocator",
                who.name
            );
            let num = |k: &str| match get(k) {
                Some(Json::Num(x)) => *x,
                _ => panic!("{}: no number {k}", who.name),
            };
            let (one, two) = (
                num("ops_per_second_1_thread"),
                num("ops_per_second_2_threads"),
            );
            assert!(one > 0.0 && two > 0.0, "{}: {one} / {two}", who.name);
            assert!((num("two_over_one") - two / one).abs() < 1e-9 * (two / one));
        }
    }
}
