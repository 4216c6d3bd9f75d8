//! Operation sequences with backend faults injected, for any [`Allocator`] on Sim or Host.
//!
//! The reference models (`vmm_alloc::testkit::expandable_model`, `classic_model`) predict exact placements and
//! stats, which a fault makes unpredictable: an allocation may fail with a driver error, a free
//! may fail to record its events, `empty_cache` may stop half-way. So this driver checks what
//! must hold whatever fails: a failed call returns an error (never a panic) and changes nothing
//! a caller can see (a failed allocation allocates nothing, a failed free leaves the block live);
//! reserved bytes are mapped in the backend; live allocations are aligned, disjoint
//! and, on Host, keep their data; the allocator's own invariant check passes; and once the faults
//! stop, freeing everything, emptying the cache and dropping the allocator leaves the backend
//! holding nothing.

use proptest::prelude::*;
use vmm_alloc::backend::{CallKind, CallKinds};
use vmm_alloc::testkit::{EmulatedBackend, FaultError, FaultPlan, Trigger};
use vmm_alloc::{AllocError, Allocation, Allocator, DevAddr, StreamId};

use crate::runner::Tally;

const STREAMS: u64 = 3;
const MB: usize = 1 << 20;

/// Installs `plan` on `backend`, replacing the current one; returns how many faults the old one
/// fired.
pub fn arm<B: EmulatedBackend>(backend: &B, plan: FaultPlan) -> u64 {
    let fired = backend.clear_faults();
    backend.set_faults(plan);
    fired
}

/// The calls a fault may hit: every call an allocator makes (not `Init`, made before it exists,
/// nor `Write`/`Read`, which only this driver makes, to stamp and check data).
fn kinds() -> impl Iterator<Item = CallKind> {
    CallKind::ALL
        .into_iter()
        .filter(|k| !matches!(k, CallKind::Init | CallKind::Write | CallKind::Read))
}

/// One step.
#[derive(Clone, Debug)]
pub enum FOp {
    /// `allocate(size)` on a stream.
    Alloc { size: usize, stream: u64 },
    /// Frees the `pick`-th latest live allocation (modulo the live count).
    Free { pick: usize },
    /// `record_stream` of the `pick`-th latest live allocation.
    Record { pick: usize, stream: u64 },
    /// Holds a stream (its events stay pending) or releases it (they complete).
    Stream { stream: u64, hold: bool },
    /// `empty_cache()`.
    EmptyCache,
    /// From now on, the call of `kind` selected by `trigger` (counted from now) fails too.
    Arm {
        kind: CallKind,
        trigger: Trigger,
        oom: bool,
    },
    /// From now on, each call of `kinds` also fails with probability `permille` / 1000.
    Random {
        seed: u64,
        permille: u16,
        oom: bool,
        kinds: CallKinds,
    },
    /// No more faults.
    Heal,
}

fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..=MB,
        3 => MB..12 * MB,
        2 => 12 * MB..48 * MB,
    ]
}

fn trigger_strategy() -> impl Strategy<Value = Trigger> {
    prop_oneof![
        3 => (1u64..6).prop_map(Trigger::Nth),
        1 => (1u64..6).prop_map(Trigger::From),
    ]
}

/// Steps with faults armed often enough that most sequences hit several; faults never hit the
/// kinds in `spared` (an allocator's known, reported failure, so the campaign finds others).
pub fn fop_strategy(spared: &[CallKind]) -> impl Strategy<Value = FOp> {
    let kinds: Vec<CallKind> = kinds().filter(|k| !spared.contains(k)).collect();
    let random_kinds = kinds.iter().fold(CallKinds::empty(), |k, c| k | c.as_set());
    prop_oneof![
        10 => (size_strategy(), 0..STREAMS).prop_map(|(size, stream)| FOp::Alloc { size, stream }),
        6 => (0usize..32).prop_map(|pick| FOp::Free { pick }),
        2 => (0usize..32, 0..STREAMS).prop_map(|(pick, stream)| FOp::Record { pick, stream }),
        2 => (0..STREAMS, any::<bool>()).prop_map(|(stream, hold)| FOp::Stream { stream, hold }),
        1 => Just(FOp::EmptyCache),
        3 => (prop::sample::select(kinds), trigger_strategy(), any::<bool>())
            .prop_map(|(kind, trigger, oom)| FOp::Arm { kind, trigger, oom }),
        1 => (any::<u64>(), 1u16..300, any::<bool>()).prop_map(move |(seed, permille, oom)| {
            FOp::Random { seed, permille, oom, kinds: random_kinds }
        }),
        1 => Just(FOp::Heal),
    ]
}

fn error(oom: bool) -> FaultError {
    if oom {
        FaultError::OutOfMemory
    } else {
        FaultError::Injected
    }
}

/// The plan after `op`: `Arm` and `Random` add to the current plan (so faults combine: a
/// failed map whose rollback's unmap fails too), `Heal` clears it.
fn plan_after(plan: &FaultPlan, op: &FOp) -> Option<FaultPlan> {
    match *op {
        FOp::Arm { kind, trigger, oom } => Some(plan.clone().fail(kind, trigger, error(oom))),
        FOp::Random {
            seed,
            permille,
            oom,
            kinds,
        } => Some(
            plan.clone()
                .random(seed, permille as f64 / 1000.0, kinds, error(oom)),
        ),
        FOp::Heal => Some(FaultPlan::new()),
        _ => None,
    }
}

/// A live allocation and the id its data pattern is derived from.
struct Held {
    alloc: Allocation,
    id: u64,
}

/// The byte at `off` of allocation `id`: depends on both, so a block moved, swapped or
/// overwritten by a neighbour reads wrong.
fn byte(id: u64, off: usize) -> u8 {
    let x = (id << 20) ^ off as u64;
    (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
}

/// Where the pattern lives: the first, middle and last 64 bytes (each granule-straddling block
/// has its start and end in different pages, so a page mapped wrongly shows).
fn probes(len: usize) -> [(usize, usize); 3] {
    let n = len.min(64);
    [(0, n), ((len / 2).min(len - n), n), (len - n, n)]
}

fn stamp<B: EmulatedBackend>(b: &B, h: &Held) -> Result<(), String> {
    for (off, n) in probes(h.alloc.requested()) {
        let data: Vec<u8> = (off..off + n).map(|o| byte(h.id, o)).collect();
        b.write(DevAddr::new(h.alloc.ptr().get() + off as u64), &data)
            .map_err(|e| format!("writing allocation {}: {e}", h.id))?;
    }
    Ok(())
}

fn verify<B: EmulatedBackend>(b: &B, h: &Held) -> Result<(), String> {
    for (off, n) in probes(h.alloc.requested()) {
        let mut got = vec![0u8; n];
        b.read(DevAddr::new(h.alloc.ptr().get() + off as u64), &mut got)
            .map_err(|e| format!("reading allocation {}: {e}", h.id))?;
        if let Some(i) = (0..n).find(|&i| got[i] != byte(h.id, off + i)) {
            return Err(format!(
                "data of allocation {} ({:?}) changed at offset {}",
                h.id,
                h.alloc.ptr(),
                off + i
            ));
        }
    }
    Ok(())
}

/// The allocator under test with what the driver keeps beside it.
struct Rig<'a, B: EmulatedBackend, A: Allocator> {
    backend: B,
    alloc: A,
    extra: &'a dyn Fn(&A) -> Result<(), String>,
    live: Vec<Held>,
    bytes: bool,
    /// The faults armed (installing a copy restarts its call counts: "the n-th call from now").
    plan: FaultPlan,
    /// Whether faults stay armed during `empty_cache`.
    empty_cache_faults: bool,
}

impl<B: EmulatedBackend, A: Allocator> Rig<'_, B, A> {
    fn latest(&self, pick: usize) -> usize {
        self.live.len() - 1 - pick % self.live.len()
    }

    fn apply(&mut self, step: usize, op: &FOp, tally: &mut Tally) -> Result<(), String> {
        match *op {
            FOp::Alloc { size, stream } => {
                let before = self.alloc.stats();
                match self.alloc.allocate(size, StreamId::sim(stream)) {
                    Ok(a) => {
                        let h = Held {
                            alloc: a,
                            id: step as u64,
                        };
                        if self.bytes {
                            stamp(&self.backend, &h)?;
                        }
                        self.live.push(h);
                    }
                    Err(AllocError::OutOfMemory(_) | AllocError::Backend(_)) => {
                        let after = self.alloc.stats();
                        if after.allocated_bytes != before.allocated_bytes
                            || after.allocation != before.allocation
                        {
                            return Err("a failed allocation changed the allocated stats".into());
                        }
                    }
                    Err(e) => return Err(format!("allocate({size}): {e}")),
                }
            }
            FOp::Free { pick } if !self.live.is_empty() => {
                let i = self.latest(pick);
                if self.bytes {
                    verify(&self.backend, &self.live[i])?;
                }
                // A free that fails (its events could not be recorded) leaves the block live.
                if self.alloc.deallocate_ptr(self.live[i].alloc.ptr()).is_ok() {
                    self.live.remove(i);
                }
            }
            FOp::Record { pick, stream } if !self.live.is_empty() => {
                let p = self.live[self.latest(pick)].alloc.ptr();
                self.alloc
                    .record_stream(p, StreamId::sim(stream))
                    .map_err(|e| format!("record_stream: {e}"))?;
            }
            FOp::Stream { stream, hold } => {
                if hold {
                    self.backend.hold_stream(StreamId::sim(stream));
                } else {
                    self.backend.release_stream(StreamId::sim(stream));
                }
            }
            FOp::EmptyCache if self.empty_cache_faults => {
                let _ = self.alloc.empty_cache();
            }
            FOp::EmptyCache => {
                tally.faults += arm(&self.backend, FaultPlan::new());
                let _ = self.alloc.empty_cache();
                arm(&self.backend, self.plan.clone());
            }
            _ => {
                if let Some(plan) = plan_after(&self.plan, op) {
                    tally.faults += arm(&self.backend, plan.clone());
                    self.plan = plan;
                }
            }
        }
        Ok(())
    }

    /// What holds after every step, faults or not.
    fn check(&self) -> Result<(), String> {
        (self.extra)(&self.alloc)?;
        let stats = self.alloc.stats();
        let held = self.backend.live();
        // Not equal: what a failed rollback could not unmap is held apart from the segments
        // (the classic allocator's debris) until a later `empty_cache` gives it back.
        if stats.reserved_bytes.all.current > held.mapped_bytes as u64 {
            return Err(format!(
                "reserved_bytes {} but the backend maps only {} bytes",
                stats.reserved_bytes.all.current, held.mapped_bytes
            ));
        }
        let sum: u64 = self.live.iter().map(|h| h.alloc.size() as u64).sum();
        if stats.allocated_bytes.all.current != sum
            || stats.allocation.all.current != self.live.len() as u64
        {
            return Err(format!(
                "allocated_bytes {} in {} allocations, but {} live bytes in {}",
                stats.allocated_bytes.all.current,
                stats.allocation.all.current,
                sum,
                self.live.len()
            ));
        }
        let mut spans: Vec<(u64, u64)> = self
            .live
            .iter()
            .map(|h| {
                (
                    h.alloc.ptr().get(),
                    h.alloc.ptr().get() + h.alloc.size() as u64,
                )
            })
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[0].1 > w[1].0) {
            return Err(format!(
                "live allocations overlap: {:x?} and {:x?}",
                w[0], w[1]
            ));
        }
        for h in &self.live {
            let a = &h.alloc;
            if a.ptr().get() % 512 != 0 || a.size() < a.requested() {
                return Err(format!("bad allocation {a:?}"));
            }
            if self.bytes {
                verify(&self.backend, h)?;
            }
        }
        Ok(())
    }

    /// Faults off, everything freed, cache emptied, allocator dropped: nothing may be left.
    fn teardown(mut self, tally: &mut Tally) -> Result<(), String> {
        tally.faults += arm(&self.backend, FaultPlan::new());
        for s in 0..STREAMS {
            self.backend.release_stream(StreamId::sim(s));
        }
        for h in std::mem::take(&mut self.live) {
            if self.bytes {
                verify(&self.backend, &h)?;
            }
            self.alloc
                .deallocate(h.alloc)
                .map_err(|e| format!("teardown free: {e}"))?;
        }
        self.alloc
            .empty_cache()
            .map_err(|e| format!("teardown empty_cache: {e}"))?;
        let stats = self.alloc.stats();
        if stats.reserved_bytes.all.current != 0 || stats.allocated_bytes.all.current != 0 {
            return Err(format!(
                "after freeing everything and empty_cache: {stats:?}"
            ));
        }
        let backend = self.backend.clone();
        drop(self);
        let left = backend.live();
        if !left.is_empty() {
            return Err(format!("leaked after teardown: {left}"));
        }
        Ok(())
    }
}

/// Runs `ops` on the allocator `make` builds over `backend`, checking after every step; `extra`
/// is the allocator's own invariant check, if it has one; `empty_cache_faults`: whether armed
/// faults may hit `empty_cache` too (or it runs with them suspended).
pub fn run<B: EmulatedBackend, A: Allocator>(
    backend: B,
    make: impl FnOnce(B) -> Result<A, AllocError>,
    extra: &dyn Fn(&A) -> Result<(), String>,
    empty_cache_faults: bool,
    ops: &[FOp],
    tally: &mut Tally,
) -> Result<(), String> {
    use vmm_alloc::backend::Capabilities;
    let bytes = backend.capabilities().contains(Capabilities::BYTES);
    let alloc = make(backend.clone()).map_err(|e| format!("building the allocator: {e}"))?;
    let mut rig = Rig {
        backend,
        alloc,
        extra,
        live: Vec::new(),
        bytes,
        plan: FaultPlan::new(),
        empty_cache_faults,
    };
    for (step, op) in ops.iter().enumerate() {
        tally.ops += 1;
        rig.apply(step, op, tally)
            .and_then(|()| rig.check())
            .map_err(|e| format!("step {step} ({op:?}): {e}"))?;
    }
    rig.teardown(tally)
        .map_err(|e| format!("teardown after {} steps: {e}", ops.len()))
}

/// Minimizes a failing fault sequence: deletes what it can, then replaces each `Random` fault
/// (opaque: which calls did it fail?) by one or two explicit `Arm`s that still fail, and deletes
/// again. The result names the failing calls.
pub fn minimize(
    ops: Vec<FOp>,
    fails: &dyn Fn(&[FOp]) -> bool,
    deadline: std::time::Instant,
) -> Vec<FOp> {
    let mut ops = crate::runner::shorten(ops, fails, deadline);
    // The explicit faults a random one over `kinds` may stand for.
    let arms = |kinds: CallKinds| -> Vec<FOp> {
        let kinds: Vec<CallKind> = self::kinds().filter(|&k| kinds.has(k)).collect();
        let mut out = Vec::new();
        for kind in kinds {
            for n in 1..6 {
                for trigger in [Trigger::Nth(n), Trigger::From(n)] {
                    for oom in [false, true] {
                        out.push(FOp::Arm { kind, trigger, oom });
                    }
                }
            }
        }
        out
    };
    while let Some(i) = ops.iter().position(|o| matches!(o, FOp::Random { .. })) {
        let FOp::Random { kinds, .. } = ops[i] else {
            break;
        };
        let arms = arms(kinds);
        let with = |xs: &[&FOp]| {
            let mut v = ops[..i].to_vec();
            v.extend(xs.iter().map(|&x| x.clone()));
            v.extend_from_slice(&ops[i + 1..]);
            v
        };
        let single = arms.iter().map(|a| with(&[a])).find(|v| fails(v));
        let found = single.or_else(|| {
            arms.iter()
                .flat_map(|a| arms.iter().map(move |b| (a, b)))
                .take_while(|_| std::time::Instant::now() < deadline)
                .map(|(a, b)| with(&[a, b]))
                .find(|v| fails(v))
        });
        match found {
            Some(v) => ops = v,
            None => break,
        }
    }
    crate::runner::shorten(ops, fails, deadline)
}
