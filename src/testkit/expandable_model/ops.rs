//! The operations of the state machine and the loop that applies them to the allocator and to the
//! model, checking everything after each step.

use crate::backend::{Backend, PhysHandle};
use crate::config::ExpandableConfig;
use crate::{AllocError, Allocator, DevAddr, ExpandableAllocator, MemoryStats, StreamId};
use proptest::prelude::*;

use super::reference::{no_overlap, Live, Model};
use crate::testkit::pytorch_rounding::round_size;
use crate::testkit::{EmulatedBackend, Observed};

const STREAMS: u64 = 3;

/// An input the allocator must refuse without changing anything.
#[derive(Clone, Copy, Debug)]
pub enum Bad {
    /// `deallocate_ptr` of an address no allocation ever had.
    Foreign,
    /// `deallocate_ptr` of an address inside a live allocation.
    Interior,
    /// The address of the allocation freed last, freed again.
    DoubleFree,
    /// `allocate(0)`.
    ZeroSize,
    /// `allocate(usize::MAX)`.
    HugeSize,
    /// `record_stream` on a foreign address.
    RecordForeign,
}

/// One step. Picks are small and taken modulo the live count, so they shrink to 0.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `allocate(size)` on a stream; it must succeed or fail with out-of-memory.
    Alloc {
        /// Requested bytes.
        size: usize,
        /// Stream number (0, 1 or 2).
        stream: u64,
    },
    /// `deallocate_ptr` of a live allocation.
    Free {
        /// Which allocation, modulo the live count.
        pick: usize,
    },
    /// A training step's pattern: a live allocation freed and its size asked again at once on
    /// its stream (a freed rescue serves it again, Note [Rescue revived]).
    Again {
        /// Which allocation, modulo the live count.
        pick: usize,
    },
    /// `record_stream` of a live allocation.
    RecordStream {
        /// Which allocation, modulo the live count.
        pick: usize,
        /// Stream number (0, 1 or 2).
        stream: u64,
    },
    /// Holds a stream: events recorded on it stay pending (its work keeps running).
    Hold {
        /// Stream number (0, 1 or 2).
        stream: u64,
    },
    /// Releases a held stream: its work completes.
    Release {
        /// Stream number (0, 1 or 2).
        stream: u64,
    },
    /// `empty_cache`.
    EmptyCache,
    /// Another user of the device takes `mb` MiB (capacity pressure mid-sequence).
    Squeeze {
        /// MiB taken.
        mb: usize,
    },
    /// ... and gives its latest handle back.
    Unsqueeze,
    /// An input the allocator must refuse, changing nothing.
    Invalid {
        /// Which one.
        bad: Bad,
        /// The allocation it concerns ([`Bad::Interior`]), modulo the live count.
        pick: usize,
    },
}

fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..=(1 << 20),
        3 => (1usize << 20)..(10 << 20),
        2 => (10usize << 20)..(48 << 20),
        // A size that recurs, as a training step's do: a freed block's exact length asked again
        // (Note [Last free], Note [Rescue revived]).
        2 => Just(14usize << 20),
    ]
}

/// Random operations, weighted towards allocating and freeing, with sizes from 1 byte to 48 MiB
/// across both pools.
pub fn op_strategy() -> impl Strategy<Value = Op> {
    let bad = prop_oneof![
        Just(Bad::Foreign),
        Just(Bad::Interior),
        Just(Bad::DoubleFree),
        Just(Bad::ZeroSize),
        Just(Bad::HugeSize),
        Just(Bad::RecordForeign),
    ];
    prop_oneof![
        10 => (size_strategy(), 0..STREAMS).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => (0usize..64).prop_map(|pick| Op::Free { pick }),
        2 => (0usize..64).prop_map(|pick| Op::Again { pick }),
        2 => (0usize..64, 0..STREAMS).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => (0..STREAMS).prop_map(|stream| Op::Hold { stream }),
        1 => (0..STREAMS).prop_map(|stream| Op::Release { stream }),
        1 => Just(Op::EmptyCache),
        1 => (1usize..40).prop_map(|mb| Op::Squeeze { mb }),
        1 => Just(Op::Unsqueeze),
        1 => (bad, 0usize..64).prop_map(|(bad, pick)| Op::Invalid { bad, pick }),
    ]
}

/// Configurations: ours, PyTorch's expandable segments, small pages, a small handle cache, most
/// growths under pressure (with and without remapping other streams' pages), fine pages past
/// half the device, pages that shrink with the streams, and power-of-two rounding.
pub fn config_strategy() -> impl Strategy<Value = ExpandableConfig> {
    prop_oneof![
        Just(ExpandableConfig::default()),
        Just(ExpandableConfig::pytorch_expandable()),
        Just(ExpandableConfig {
            large_page: 2 << 20,
            ..ExpandableConfig::default()
        }),
        Just(ExpandableConfig {
            handle_cache_limit: 64 << 20,
            ..ExpandableConfig::default()
        }),
        // The alias rescue after OOMs too (Note [Alias rescue]): sequences go on after their
        // OOMs, which pause it by default.
        Just(ExpandableConfig {
            rescue_after_oom: true,
            ..ExpandableConfig::default()
        }),
        // Most growths under pressure (Note [Headroom]): remap before create, exact tails.
        Just(ExpandableConfig {
            headroom_fraction: 0.75,
            ..ExpandableConfig::default()
        }),
        // Several streams under pressure giving every free page back rather than synchronizing
        // another stream to remap its pages (Note [Give back before foreign sync]).
        Just(ExpandableConfig {
            give_back_before_foreign_sync: true,
            headroom_fraction: 0.75,
            ..ExpandableConfig::default()
        }),
        // 2 MiB large pages once past half the device (Note [Fine pages]).
        Just(ExpandableConfig {
            fine_pages_above: 0.5,
            ..ExpandableConfig::default()
        }),
        // Large pages that shrink to 2-6 MiB as streams take large-pool memory (Note [Stream
        // pages]; the default's floor keeps them at 8 MiB on these small devices).
        Just(ExpandableConfig {
            stream_page_share: 0.05,
            stream_page_floor: 2 << 20,
            rescue_after_oom: true,
            ..ExpandableConfig::default()
        }),
        // The per-stream front cache (Note [Front cache], Note [Front allowance]): frees through
        // `deallocate` stashed and taken back without the lock, stashes kept across the core's
        // allocations.
        Just(ExpandableConfig {
            front_cache: crate::config::FrontCacheMode::Always,
            rescue_after_oom: true,
            ..ExpandableConfig::default()
        }),
        // The settings `vmm-replay advise` may recommend or a user may turn on, each with
        // growths under pressure: every free page of a synchronized stream drained (Note [Drain
        // after sync]); free pages remapped before anything is created (Note [Free holes]); the
        // block just freed taken back at any fill (Note [Last free]).
        Just(ExpandableConfig {
            drain_after_sync: true,
            headroom_fraction: 0.75,
            ..ExpandableConfig::default()
        }),
        Just(ExpandableConfig {
            remap_before_create: true,
            ..ExpandableConfig::default()
        }),
        Just(ExpandableConfig {
            reuse_last_free_above: 0.0,
            ..ExpandableConfig::default()
        }),
        // Other streams' pages a served last resort unmapped released at the call's end, not
        // kept for the growths that would create them (Note [Kept pages]).
        Just(ExpandableConfig {
            keep_after_retry: false,
            ..ExpandableConfig::default()
        }),
        // Power-of-two rounding in the intervals the sizes reach (below 2 MiB: 2 steps, 2-4 MiB:
        // 4, 4-8 MiB: 8), so the blocks' sizes are checked against PyTorch's rule there too.
        Just(ExpandableConfig {
            roundup_power2_divisions: [2, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..ExpandableConfig::default()
        }),
    ]
}

/// The pattern byte at offset `off` of allocation `id`.
fn pattern(id: u64, off: usize) -> u8 {
    (id.wrapping_mul(0x9E37_79B9)
        .wrapping_add(off as u64 * 7)
        .wrapping_add((off >> 12) as u64 * 13)
        % 251) as u8
}

/// Granule of the data check: a chunk is always a whole number of 2 MiB granules (the Host
/// backend's granularity) starting at a granule boundary, so mapping, unmapping and remapping
/// act on whole granules.
const GRANULE: u64 = 2 << 20;
const SPAN: u64 = 64;

/// The spans of an allocation that carry its pattern: the first and last 64 bytes of the
/// allocation and, in every 2 MiB granule it covers, the first and last 64 bytes of its part of
/// the granule plus 64 bytes of one 4 KiB page of that part picked by the allocation's id (so
/// different allocations sample different pages). A chunk mapped wrongly, remapped or unmapped
/// under a live block changes a whole granule, so it shows at the granule's ends; a neighbour
/// written over shows at the allocation's ends. Stamping every 4 KiB page instead faulted in
/// every page of every allocation, which made 10,000 Host cases take over 10 minutes; this
/// touches at most 3 pages per granule.
fn spans(id: u64, ptr: u64, len: usize) -> Vec<(usize, usize)> {
    let (end, mut out) = (ptr + len as u64, Vec::new());
    let mut add = |from: u64, to: u64| {
        if from < to {
            out.push(((from - ptr) as usize, (to - from) as usize));
        }
    };
    let mut at = ptr;
    while at < end {
        let part_end = (at / GRANULE + 1).saturating_mul(GRANULE).min(end);
        let pages = (part_end - at).div_ceil(4096);
        let pick = at + (id.wrapping_mul(0x9E37_79B9).wrapping_add(at / GRANULE) % pages) * 4096;
        add(at, (at + SPAN).min(part_end));
        add(
            pick.max(at + SPAN),
            (pick + SPAN).min(part_end.saturating_sub(SPAN)),
        );
        add(part_end.saturating_sub(SPAN).max(at + SPAN), part_end);
        at = part_end;
    }
    out
}

fn spans_of(l: &Live) -> Vec<(usize, usize)> {
    spans(l.id, l.alloc.ptr().get(), l.alloc.requested())
}

fn stamp<B: Backend>(b: &B, l: &Live) -> Result<(), TestCaseError> {
    for (off, n) in spans_of(l) {
        let data: Vec<u8> = (off..off + n).map(|o| pattern(l.id, o)).collect();
        b.write(DevAddr::new(l.alloc.ptr().get() + off as u64), &data)
            .map_err(|e| TestCaseError::fail(format!("write: {e}")))?;
    }
    Ok(())
}

/// Checks the spans of `l` whose index is `phase` modulo `every` (1 = all of them), and always
/// the allocation's first and last span: each step checks a quarter, so every span is checked
/// within four steps, and all before each free.
fn verify<B: Backend>(b: &B, l: &Live, phase: usize, every: usize) -> Result<(), TestCaseError> {
    let all = spans_of(l);
    let last = all.len().saturating_sub(1);
    for (i, (off, n)) in all.into_iter().enumerate() {
        if i != 0 && i != last && i % every != phase % every {
            continue;
        }
        let mut out = vec![0u8; n];
        b.read(DevAddr::new(l.alloc.ptr().get() + off as u64), &mut out)
            .map_err(|e| TestCaseError::fail(format!("read: {e}")))?;
        let bad = out
            .iter()
            .enumerate()
            .find(|&(j, &x)| x != pattern(l.id, off + j));
        prop_assert!(
            bad.is_none(),
            "data of allocation {} changed at offset {}",
            l.id,
            off + bad.map_or(0, |x| x.0)
        );
    }
    Ok(())
}

/// What a sequence reached: a test can tell that its sequences reach the states worth testing
/// (the crate's `sequences_reach_the_interesting_states`).
#[derive(Debug)]
#[non_exhaustive]
pub struct Reached {
    /// The allocator's stats at the end.
    pub stats: MemoryStats,
    /// Frees left pending on a held stream.
    pub pending_held: u64,
    /// Allocations that could not reuse memory because a free on it was pending.
    pub blocked_reuse: u64,
    /// Times held memory was made safe to unmap by a synchronize.
    pub synced_before_unmap: u64,
    /// Out-of-memory answers while another user held memory ([`Op::Squeeze`]).
    pub squeezed_ooms: u64,
}

fn fail(step: usize, e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("step {step}: {e}"))
}

/// Runs `ops` on an [`ExpandableAllocator`] over `inner` with `config`, checking every step
/// against the model, then tears down (frees everything, empties the cache, drops the allocator)
/// and checks that the backend holds nothing. The first failed check is the error, naming the
/// step.
pub fn run<B: EmulatedBackend>(
    inner: B,
    config: ExpandableConfig,
    ops: &[Op],
) -> Result<Reached, TestCaseError> {
    let backend = Observed::new(inner);
    let bytes = backend
        .capabilities()
        .contains(crate::backend::Capabilities::BYTES);
    let divisions = config.roundup_power2_divisions;
    let alloc = ExpandableAllocator::new(backend.clone(), config).map_err(|e| fail(0, e))?;
    let mut model = Model::default();
    let mut held: Vec<StreamId> = Vec::new();
    let mut taken: Vec<PhysHandle> = Vec::new();
    let mut last_freed: Option<DevAddr> = None;
    let mut squeezed_ooms = 0;
    let gen = |s: StreamId| backend.stream_generation(s);
    // An `Again` runs as the free and the allocation it stands for, each checked as a step.
    let mut queue: Vec<Op> = Vec::new();
    for (step, &first) in ops.iter().enumerate() {
        queue.push(first);
        while let Some(op) = queue.pop() {
            match op {
                Op::Alloc { size, stream } => {
                    let stream = StreamId::sim(stream);
                    let gens: Vec<u64> = (0..STREAMS).map(|s| gen(StreamId::sim(s))).collect();
                    let retries = alloc.stats().num_alloc_retries;
                    let result = alloc.allocate(size, stream);
                    // The allocator looked at its events first, then (on the last-resort retry)
                    // waited for every stream its pending frees wait on.
                    model.process(|s| gens[s.raw() as usize]);
                    if alloc.stats().num_alloc_retries > retries {
                        model.process_all();
                    }
                    match result {
                        Ok(a) => {
                            prop_assert_eq!(
                                a.size(),
                                round_size(size, &divisions),
                                "step {}: a block of {} bytes is not PyTorch's round_size",
                                step,
                                size
                            );
                            let (s, e) = (a.ptr().get(), a.ptr().get() + a.size() as u64);
                            prop_assert!(
                                !model.overlaps_pending(s, e),
                                "step {step}: {:?} reuses memory still in use by another stream",
                                a.ptr()
                            );
                            model.note_blocked(stream, a.size());
                            let pool = Model::pool_holding(&a, &alloc.snapshot())
                                .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                            let l = Live {
                                alloc: a,
                                id: step as u64,
                                uses: Vec::new(),
                                pool,
                            };
                            if bytes {
                                stamp(&backend, &l)?;
                            }
                            model.live.push(l);
                            if last_freed == Some(DevAddr::new(s)) {
                                last_freed = None;
                            }
                        }
                        Err(e) => {
                            prop_assert!(e.is_out_of_memory(), "step {step}: {e}");
                            squeezed_ooms += !taken.is_empty() as u64;
                        }
                    }
                }
                Op::Free { pick } => {
                    if model.live.is_empty() {
                        continue;
                    }
                    let l = model.live.swap_remove(pick % model.live.len());
                    if bytes {
                        verify(&backend, &l, 0, 1).map_err(|e| fail(step, e))?;
                    }
                    alloc
                        .deallocate_ptr(l.alloc.ptr())
                        .map_err(|e| fail(step, e))?;
                    last_freed = Some(l.alloc.ptr());
                    model.freed(l, &held, gen);
                }
                Op::RecordStream { pick, stream } => {
                    if model.live.is_empty() {
                        continue;
                    }
                    let i = pick % model.live.len();
                    let (s, l) = (StreamId::sim(stream), &mut model.live[i]);
                    alloc
                        .record_stream(l.alloc.ptr(), s)
                        .map_err(|e| fail(step, e))?;
                    if s != l.alloc.stream() && !l.uses.contains(&s) {
                        l.uses.push(s);
                    }
                }
                Op::Hold { stream } => {
                    backend.hold_stream(StreamId::sim(stream));
                    if !held.contains(&StreamId::sim(stream)) {
                        held.push(StreamId::sim(stream));
                    }
                }
                Op::Release { stream } => {
                    let s = StreamId::sim(stream);
                    backend.release_stream(s);
                    held.retain(|&h| h != s);
                    model.released(s);
                }
                Op::EmptyCache => {
                    alloc.empty_cache().map_err(|e| fail(step, e))?;
                    model.process_all();
                }
                Op::Squeeze { mb } => {
                    let len = (mb << 20).next_multiple_of(backend.granularity());
                    match backend.backend().create(len) {
                        Ok(h) => taken.push(h),
                        Err(e) => prop_assert!(e.is_out_of_memory(), "step {step}: {e}"),
                    }
                }
                Op::Unsqueeze => {
                    if let Some(h) = taken.pop() {
                        backend.backend().release(h).map_err(|e| fail(step, e))?;
                    }
                }
                Op::Invalid { bad, pick } => {
                    refused(&alloc, &model, bad, pick, last_freed).map_err(|e| fail(step, e))?
                }
                Op::Again { pick } => {
                    if model.live.is_empty() {
                        continue;
                    }
                    let i = pick % model.live.len();
                    let a = &model.live[i].alloc;
                    let (size, stream) = (a.size(), a.stream().raw());
                    queue.push(Op::Alloc { size, stream });
                    queue.push(Op::Free { pick: i });
                    continue;
                }
            }
            let seen = std::mem::take(&mut backend.log().seen);
            model.device_calls(&seen).map_err(|e| fail(step, e))?;
            check_step(&alloc, &backend, &mut model, step, bytes)?;
        }
    }
    let reached = Reached {
        stats: alloc.stats(),
        pending_held: model.pending_held,
        blocked_reuse: model.blocked_reuse,
        synced_before_unmap: model.synced_before_unmap,
        squeezed_ooms,
    };
    // Teardown: free everything, empty the cache, drop: the backend holds nothing.
    for h in taken {
        backend
            .backend()
            .release(h)
            .map_err(|e| fail(ops.len(), e))?;
    }
    for l in model.live.drain(..) {
        alloc.deallocate(l.alloc).map_err(|e| fail(ops.len(), e))?;
    }
    alloc.empty_cache().map_err(|e| fail(ops.len(), e))?;
    let stats = alloc.stats();
    prop_assert_eq!(stats.reserved_bytes.all.current, 0);
    prop_assert_eq!(stats.active_bytes.all.current, 0);
    drop(alloc);
    let left = backend.backend().live();
    prop_assert!(left.is_empty(), "leaked after teardown: {}", left);
    Ok(reached)
}

/// A bad input gives the right error and changes nothing: stats (call counts too) and snapshot
/// are equal before and after.
fn refused<B: EmulatedBackend>(
    alloc: &ExpandableAllocator<Observed<B>>,
    model: &Model,
    bad: Bad,
    pick: usize,
    last_freed: Option<DevAddr>,
) -> Result<(), String> {
    let (stats, snap) = (alloc.stats(), alloc.snapshot());
    let foreign = DevAddr::new(0x1234_5600);
    let result = match bad {
        Bad::Foreign => alloc.deallocate_ptr(foreign),
        Bad::RecordForeign => alloc.record_stream(foreign, StreamId::sim(1)),
        Bad::Interior => {
            let Some(l) = model.live.get(pick % model.live.len().max(1)) else {
                return Ok(());
            };
            let inside = DevAddr::new(l.alloc.ptr().get() + (l.alloc.size() / 2).max(1) as u64);
            alloc.deallocate_ptr(inside)
        }
        Bad::DoubleFree => {
            let Some(p) = last_freed else { return Ok(()) };
            match alloc.deallocate_ptr(p) {
                Err(AllocError::DoubleFree(_)) => Err(AllocError::DoubleFree(p)),
                other => return Err(format!("double free of {p:?} gave {other:?}")),
            }
        }
        Bad::ZeroSize => alloc.allocate(0, StreamId::DEFAULT).map(drop),
        Bad::HugeSize => alloc.allocate(usize::MAX, StreamId::DEFAULT).map(drop),
    };
    if result.is_ok() {
        return Err(format!("{bad:?} was accepted"));
    }
    if alloc.stats() != stats || alloc.snapshot() != snap {
        return Err(format!("{bad:?} changed the allocator's state"));
    }
    Ok(())
}

fn check_step<B: EmulatedBackend>(
    alloc: &ExpandableAllocator<Observed<B>>,
    backend: &Observed<B>,
    model: &mut Model,
    step: usize,
    bytes: bool,
) -> Result<(), TestCaseError> {
    alloc.check_invariants().map_err(|e| fail(step, e))?;
    let (stats, snap) = (alloc.stats(), alloc.snapshot());
    model.check_stats(&stats).map_err(|e| fail(step, e))?;
    {
        let log = backend.log();
        prop_assert_eq!(
            log.mapped.values().sum::<usize>(),
            backend.backend().live().mapped_bytes,
            "step {}: the observed mappings lost track",
            step
        );
        model
            .check_mapped(&stats, &snap, &log)
            .map_err(|e| fail(step, e))?;
    }
    model
        .check_snapshot(&stats, &snap)
        .map_err(|e| fail(step, e))?;
    no_overlap(&model.live).map_err(|e| fail(step, e))?;
    if bytes {
        for l in &model.live {
            verify(backend, l, step, 4).map_err(|e| fail(step, e))?;
        }
    }
    Ok(())
}
