//! Property tests: random operation sequences against `ExpandableAllocator`, checked after every
//! step against a plain model of what must hold (DESIGN.md's invariants). On Host, every live
//! allocation carries a pattern derived from its id, checked after every step.
//!
//! `PROPTEST_CASES=10000 cargo test --release --test all expandable_model` runs them harder.

use proptest::prelude::*;
use vmm_alloc::backend::{Backend, HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::config::Config;
use vmm_alloc::{Allocation, Allocator, ExpandableAllocator, MemoryStats, StreamId};

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, stream: u64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u64 },
    Hold { stream: u64 },
    Release { stream: u64 },
    EmptyCache,
}

fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..=(1 << 20),
        3 => (1usize << 20)..(10 << 20),
        2 => (10usize << 20)..(48 << 20),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size_strategy(), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => (0u64..3).prop_map(|stream| Op::Hold { stream }),
        1 => (0u64..3).prop_map(|stream| Op::Release { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

fn config_strategy() -> impl Strategy<Value = Config> {
    prop_oneof![
        Just(Config::default()),
        Just(Config::pytorch_expandable()),
        Just(Config {
            large_page: 2 << 20,
            ..Config::default()
        }),
        Just(Config {
            handle_cache_limit: 64 << 20,
            ..Config::default()
        }),
    ]
}

/// What the model knows about one live allocation.
struct Live {
    alloc: Allocation,
    id: u64,
    /// Streams it was recorded on (other than its own).
    uses: Vec<u64>,
}

/// Memory freed with uses on streams that were held at the time: must not be handed out until
/// every one of those streams is released.
struct Blocked {
    start: u64,
    end: u64,
    /// (stream, its generation when the block was freed): done once the generation moves on.
    waiting_on: Vec<(u64, u64)>,
}

trait Harness: Backend + Clone + 'static {
    fn hold(&self, s: StreamId);
    fn unhold(&self, s: StreamId);
    fn bytes(&self) -> bool;
    fn generation(&self, s: StreamId) -> u64;
}
impl Harness for SimBackend {
    fn hold(&self, s: StreamId) {
        self.hold_stream(s)
    }
    fn unhold(&self, s: StreamId) {
        self.release_stream(s)
    }
    fn bytes(&self) -> bool {
        false
    }
    fn generation(&self, s: StreamId) -> u64 {
        self.stream_generation(s)
    }
}
impl Harness for HostBackend {
    fn hold(&self, s: StreamId) {
        self.hold_stream(s)
    }
    fn unhold(&self, s: StreamId) {
        self.release_stream(s)
    }
    fn bytes(&self) -> bool {
        true
    }
    fn generation(&self, s: StreamId) -> u64 {
        self.stream_generation(s)
    }
}

fn stamp(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

/// Bytes of each allocation that carry its pattern: the first and last 64 (all if smaller).
/// Bytes of each allocation that carry its pattern: 64 bytes at its start and in every 2 MiB page
/// it touches (so a page remapped under a live allocation is caught), and its last 64 bytes.
fn stamped_spans(a: &Allocation) -> Vec<(u64, usize)> {
    let len = a.requested();
    let n = len.min(64);
    let page = 2u64 << 20;
    let start = a.ptr().get();
    let mut spans = vec![(0, n)];
    let mut next_page = (start / page + 1) * page;
    while next_page + 64 <= start + len as u64 {
        spans.push((next_page - start, 64));
        next_page += page;
    }
    if len > 128 {
        spans.push(((len - 64) as u64, 64));
    }
    spans.sort_unstable();
    spans.dedup_by(|b, a| b.0 < a.0 + a.1 as u64);
    spans
}

fn run<B: Harness>(backend: B, config: Config, ops: &[Op]) -> Result<MemoryStats, TestCaseError> {
    let alloc = ExpandableAllocator::new(backend.clone(), config)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut live: Vec<Live> = Vec::new();
    let mut blocked: Vec<Blocked> = Vec::new();
    let mut held: Vec<u64> = Vec::new();
    let mut next_id = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc { size, stream } => match alloc.allocate(*size, StreamId::sim(*stream)) {
                Ok(a) => {
                    let (s, e) = (a.ptr().get(), a.ptr().get() + a.size() as u64);
                    // The allocation may itself have synchronized a stream (memory pressure).
                    for b in blocked.iter().filter(|b| {
                        b.waiting_on
                            .iter()
                            .all(|&(s, g)| backend.generation(StreamId::sim(s)) == g)
                    }) {
                        prop_assert!(
                            e <= b.start || s >= b.end,
                            "step {step}: {:?} reused memory still in use by held streams {:?}",
                            a.ptr(),
                            b.waiting_on
                        );
                    }
                    if backend.bytes() {
                        for (off, n) in stamped_spans(&a) {
                            let at = a.ptr().checked_add(off as usize).unwrap();
                            backend
                                .write(at, &stamp(next_id + off, n))
                                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        }
                    }
                    live.push(Live {
                        alloc: a,
                        id: next_id,
                        uses: Vec::new(),
                    });
                    next_id += 1 << 20;
                }
                Err(e) => prop_assert!(
                    e.is_out_of_memory(),
                    "step {step}: allocate failed without OOM: {e}"
                ),
            },
            Op::Free { pick } => {
                if live.is_empty() {
                    continue;
                }
                let l = live.swap_remove(pick % live.len());
                let waiting: Vec<(u64, u64)> = l
                    .uses
                    .iter()
                    .filter(|s| held.contains(s))
                    .map(|&s| (s, backend.generation(StreamId::sim(s))))
                    .collect();
                let (start, end) = (
                    l.alloc.ptr().get(),
                    l.alloc.ptr().get() + l.alloc.size() as u64,
                );
                alloc
                    .deallocate(l.alloc)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                if !waiting.is_empty() {
                    blocked.push(Blocked {
                        start,
                        end,
                        waiting_on: waiting,
                    });
                }
            }
            Op::RecordStream { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let i = pick % live.len();
                alloc
                    .record_stream(live[i].alloc.ptr(), StreamId::sim(*stream))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if StreamId::sim(*stream) != live[i].alloc.stream() {
                    live[i].uses.push(*stream);
                }
            }
            Op::Hold { stream } => {
                backend.hold(StreamId::sim(*stream));
                if !held.contains(stream) {
                    held.push(*stream);
                }
            }
            Op::Release { stream } => {
                backend.unhold(StreamId::sim(*stream));
                held.retain(|s| s != stream);
            }
            Op::EmptyCache => alloc
                .empty_cache()
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
        }
        // A stream whose events were all completed (released, or synchronized by the allocator
        // under memory pressure or in empty_cache) no longer blocks the memory it used.
        for b in &mut blocked {
            b.waiting_on
                .retain(|&(s, g)| backend.generation(StreamId::sim(s)) == g);
        }
        blocked.retain(|b| !b.waiting_on.is_empty());
        check_step(&alloc, &backend, &live, step)?;
    }
    let reached = alloc.stats();
    // Teardown: free everything, empty the cache, drop: the backend holds nothing.
    for l in live.drain(..) {
        alloc
            .deallocate(l.alloc)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    alloc
        .empty_cache()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let stats = alloc.stats();
    prop_assert_eq!(stats.reserved_bytes.all.current, 0);
    prop_assert_eq!(stats.allocated_bytes.all.current, 0);
    drop(alloc);
    prop_assert!(
        backend.live().is_empty(),
        "leaked after teardown: {}",
        backend.live()
    );
    Ok(reached)
}

fn check_step<B: Harness>(
    alloc: &ExpandableAllocator<B>,
    backend: &B,
    live: &[Live],
    step: usize,
) -> Result<(), TestCaseError> {
    alloc
        .check_invariants()
        .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
    let stats = alloc.stats();
    let sum: u64 = live.iter().map(|l| l.alloc.size() as u64).sum();
    prop_assert_eq!(
        stats.allocated_bytes.all.current,
        sum,
        "step {}: allocated_bytes",
        step
    );
    prop_assert_eq!(
        stats.allocation.all.current,
        live.len() as u64,
        "step {}: allocation count",
        step
    );
    prop_assert_eq!(
        stats.reserved_bytes.all.current,
        backend.live().mapped_bytes as u64,
        "step {}: reserved != mapped",
        step
    );
    prop_assert!(stats.allocated_bytes.all.current <= stats.reserved_bytes.all.current);
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|l| {
            (
                l.alloc.ptr().get(),
                l.alloc.ptr().get() + l.alloc.size() as u64,
            )
        })
        .collect();
    spans.sort_unstable();
    prop_assert!(
        spans.windows(2).all(|w| w[0].1 <= w[1].0),
        "step {step}: live allocations overlap"
    );
    for l in live {
        prop_assert!(l.alloc.ptr().get() % 512 == 0 && l.alloc.size() >= l.alloc.requested());
        if backend.bytes() {
            for (off, n) in stamped_spans(&l.alloc) {
                let mut out = vec![0u8; n];
                let at = l.alloc.ptr().checked_add(off as usize).unwrap();
                backend
                    .read(at, &mut out)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: read: {e}")))?;
                prop_assert!(
                    out == stamp(l.id + off, n),
                    "step {step}: data of allocation {} changed",
                    l.id
                );
            }
        }
    }
    Ok(())
}

/// 64 cases in `cargo test` (CI's budget); `PROPTEST_CASES` overrides it. (A literal `cases:` in
/// the config would silently shadow the environment variable.)
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Sim, with capacities from tight (OOM, remap-defrag, handle reuse) to roomy.
    #[test]
    fn expandable_matches_model_on_sim(
        config in config_strategy(),
        capacity_mb in prop_oneof![Just(64usize), Just(128), Just(512), Just(4096)],
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        let sim = SimBackend::with_config(SimConfig { capacity: capacity_mb << 20, ..SimConfig::default() }).unwrap();
        run(sim, config, &ops)?;
    }

    /// Host: the same sequences with real bytes, every live allocation's pattern checked each step.
    #[test]
    fn expandable_keeps_data_on_host(
        config in config_strategy(),
        capacity_mb in prop_oneof![Just(64usize), Just(256)],
        ops in proptest::collection::vec(op_strategy(), 1..80),
    ) {
        let host = HostBackend::with_config(HostConfig { capacity: capacity_mb << 20, ..HostConfig::default() }).unwrap();
        run(host, config, &ops)?;
    }
}

/// The generated sequences must reach the states worth testing: growth, OOM under a small
/// capacity, remap-defrag, handle reuse, the free-everything retry and several streams. Runs 300
/// cases from a fixed seed and adds up what they reached.
#[test]
fn sequences_reach_the_interesting_states() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (
        config_strategy(),
        prop_oneof![Just(64usize), Just(128)],
        proptest::collection::vec(op_strategy(), 60..120),
    );
    let (mut ooms, mut remapped, mut reuses, mut retries, mut maps, mut segments) =
        (0, 0, 0, 0, 0, 0);
    for _ in 0..300 {
        let (config, capacity_mb, ops) = strategy.new_tree(&mut runner).unwrap().current();
        let sim = SimBackend::with_config(SimConfig {
            capacity: capacity_mb << 20,
            ..SimConfig::default()
        })
        .unwrap();
        let s = run(sim, config, &ops).unwrap();
        ooms += s.num_ooms;
        remapped += s.remapped_bytes;
        reuses += s.handle_reuses;
        retries += s.num_alloc_retries;
        maps += s.num_device_alloc;
        segments = segments.max(s.segment.all.peak);
    }
    assert!(maps > 1000, "growth: {maps} pages mapped");
    assert!(ooms > 10, "OOM reached {ooms} times");
    assert!(remapped > 0, "remap-defrag never ran");
    assert!(reuses > 0, "the handle cache never served a page");
    assert!(retries > 0, "the free-everything retry never ran");
    assert!(
        segments >= 3,
        "at most {segments} segments at once: streams and pools not mixed"
    );
}
