//! Runs the script against one allocator with one fault plan and checks, at every step a fault
//! hit, what a failed or degraded call promises; then finishes the script with the plan removed
//! and tears down.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use vmm_alloc::backend::{Backend, CallKind, LiveResources};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::testkit::{EmulatedBackend, FaultError, FaultPlan, Trigger};
use vmm_alloc::StreamId;
use vmm_alloc::{AllocError, Allocation, Allocator, DevAddr, ExpandableAllocator, MemoryStats};

use crate::script::{Op, HELD};

/// An allocator under test, whichever kind.
pub trait Under: Allocator {
    /// The allocator's own invariant check, where it has one.
    fn internal_check(&self) -> Result<(), String>;
    fn classic(&self) -> bool;
}

impl<B: Backend> Under for ExpandableAllocator<B> {
    fn internal_check(&self) -> Result<(), String> {
        self.check_invariants().map_err(|e| e.to_string())
    }
    fn classic(&self) -> bool {
        false
    }
}

impl<B: Backend> Under for ClassicAllocator<B> {
    fn internal_check(&self) -> Result<(), String> {
        self.check_invariants().map_err(|e| e.to_string())
    }
    fn classic(&self) -> bool {
        true
    }
}

/// Builds a fresh allocator over a backend.
pub type Make<B> = dyn Fn(B) -> Box<dyn Under>;

/// What a whole sweep did, for the summary line.
#[derive(Default, Debug)]
pub struct Tally {
    /// Runs of the script with a fault plan.
    pub cases: u64,
    /// Runs whose plan never fired (the run made fewer calls of that kind).
    pub unreached: u64,
    /// Faults injected, over all runs.
    pub injected: u64,
    /// Steps hit by a fault that returned an error.
    pub errors: u64,
    /// Steps hit by a fault that still succeeded (retry, remap, a swallowed failure).
    pub recovered: u64,
    /// What went wrong, one line per broken promise.
    pub failures: Vec<String>,
}

impl Tally {
    pub fn absorb(&mut self, other: Tally) {
        self.cases += other.cases;
        self.unreached += other.unreached;
        self.injected += other.injected;
        self.errors += other.errors;
        self.recovered += other.recovered;
        self.failures.extend(other.failures);
    }
}

/// A fault plan of one rule.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub kind: CallKind,
    pub trigger: Trigger,
    pub error: FaultError,
}

/// Bytes written at the sampled spans of an allocation (Host only): id-derived, so a block that
/// moved, was unmapped or was handed out twice shows up.
fn pattern_byte(id: u64, off: usize) -> u8 {
    (id.wrapping_mul(0x9E37_79B9)
        .wrapping_add(off as u64 * 7)
        .wrapping_add((off >> 12) as u64 * 13)
        % 251) as u8
        + 1
}

/// Sampled spans of a block: its first and last 4 KiB and 256 bytes at every 2 MiB boundary.
fn spans(size: usize) -> Vec<(usize, usize)> {
    let edge = size.min(4096);
    let mut v = vec![(0, edge), (size - edge, edge)];
    let mut off = 2 << 20;
    while off < size {
        v.push((off, (size - off).min(256)));
        off += 2 << 20;
    }
    v
}

/// One live allocation of the script.
struct Slot {
    alloc: Allocation,
    id: u64,
}

/// The allocator, its backend, the live slots: one run of the script.
pub struct Run<'a, B: EmulatedBackend> {
    backend: B,
    alloc: Option<Box<dyn Under>>,
    slots: Vec<Option<Slot>>,
    bytes: bool,
    next_id: u64,
    held: bool,
    /// A fault fired and no `empty_cache` has succeeded since it was removed: the backend may
    /// hold leftovers of failed calls that the allocator gives back on its next `empty_cache`.
    dirty: bool,
    what: String,
    failures: &'a mut Vec<String>,
}

/// Everything a failed call may not change: every statistic's current value and peak, the
/// other figures of the statistics except the counters a failed call legitimately moves (backend
/// calls made, bytes created and released again by a rollback, `num_ooms`, `num_alloc_retries`),
/// and the snapshot. A rolled-back new segment counts in `segment`'s peak and its cumulative
/// increase/decrease totals (it existed during the call), so only `segment.current` is compared.
#[derive(PartialEq, Debug, Clone)]
struct View {
    figures: Vec<(&'static str, u64)>,
    stats: MemoryStats,
    snapshot: Snapshot,
}

fn view(a: &dyn Under) -> View {
    let s = a.stats();
    let arrays = [
        ("allocation", s.allocation),
        ("segment", s.segment),
        ("active", s.active),
        ("inactive_split", s.inactive_split),
        ("allocated_bytes", s.allocated_bytes),
        ("reserved_bytes", s.reserved_bytes),
        ("active_bytes", s.active_bytes),
        ("inactive_split_bytes", s.inactive_split_bytes),
        ("requested_bytes", s.requested_bytes),
    ];
    let mut figures = Vec::new();
    for (name, arr) in arrays {
        for st in [arr.all, arr.small_pool, arr.large_pool] {
            figures.push((name, st.current));
            if name != "segment" {
                figures.extend([(name, st.peak), (name, st.allocated), (name, st.freed)]);
            }
        }
    }
    figures.extend([
        ("num_device_alloc", s.num_device_alloc),
        ("num_device_free", s.num_device_free),
        ("handles_cached", s.handles_cached),
        ("handle_cache_bytes", s.handle_cache_bytes),
        ("stuck_bytes", s.stuck_bytes),
        ("parked_bytes", s.parked_bytes),
        ("handle_reuses", s.handle_reuses),
        ("remapped_bytes", s.remapped_bytes),
    ]);
    View {
        figures,
        stats: s,
        snapshot: a.snapshot(),
    }
}

/// What differs between two views, briefly.
fn diff(before: &View, after: &View) -> String {
    let mut out: Vec<String> = before
        .figures
        .iter()
        .zip(&after.figures)
        .filter(|(b, a)| b != a)
        .map(|((name, b), (_, a))| format!("{name} {b} -> {a}"))
        .collect();
    out.dedup();
    if before.snapshot != after.snapshot {
        out.push(format!(
            "snapshot: {} -> {} segments, live {:?} -> {:?}",
            before.snapshot.segments.len(),
            after.snapshot.segments.len(),
            live_blocks(&before.snapshot).len(),
            live_blocks(&after.snapshot).len()
        ));
    }
    out.join(", ")
}

/// Live allocations of a snapshot: (address, size, requested).
fn live_blocks(s: &Snapshot) -> BTreeSet<(u64, usize, usize)> {
    s.segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.address.get(), b.size, b.requested_size))
        .collect()
}

fn has_pending(s: &Snapshot) -> bool {
    s.segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .any(|b| b.state == BlockState::ActivePendingFree)
}

impl<'a, B: EmulatedBackend> Run<'a, B> {
    pub fn new(backend: B, make: &Make<B>, what: String, failures: &'a mut Vec<String>) -> Self {
        let bytes = backend
            .capabilities()
            .contains(vmm_alloc::backend::Capabilities::BYTES);
        let alloc = make(backend.clone());
        Run {
            backend,
            alloc: Some(alloc),
            slots: Vec::new(),
            bytes,
            next_id: 1,
            held: false,
            dirty: false,
            what,
            failures,
        }
    }

    fn a(&self) -> &dyn Under {
        self.alloc.as_deref().expect("allocator alive")
    }

    fn fail(&mut self, msg: String) {
        self.failures.push(format!("{}: {msg}", self.what));
    }

    fn fill(&self, a: &Allocation, id: u64) -> Result<(), String> {
        for (off, len) in spans(a.requested()) {
            let data: Vec<u8> = (off..off + len).map(|o| pattern_byte(id, o)).collect();
            let at = a.ptr().checked_add(off).ok_or("address overflow")?;
            self.backend
                .write(at, &data)
                .map_err(|e| format!("writing block #{id} at {at}: {e}"))?;
        }
        Ok(())
    }

    fn verify(&self, ptr: DevAddr, requested: usize, id: u64) -> Result<(), String> {
        for (off, len) in spans(requested) {
            let mut got = vec![0u8; len];
            let at = ptr.checked_add(off).ok_or("address overflow")?;
            self.backend
                .read(at, &mut got)
                .map_err(|e| format!("reading block #{id} at {at}: {e}"))?;
            if let Some(k) = (0..len).find(|&k| got[k] != pattern_byte(id, off + k)) {
                return Err(format!(
                    "block #{id} at {ptr}: byte {} is {:#x}, expected {:#x}",
                    off + k,
                    got[k],
                    pattern_byte(id, off + k)
                ));
            }
        }
        Ok(())
    }

    fn verify_all(&self) -> Result<(), String> {
        if !self.bytes {
            return Ok(());
        }
        for s in self.slots.iter().flatten() {
            self.verify(s.alloc.ptr(), s.alloc.requested(), s.id)?;
        }
        Ok(())
    }

    /// Applies one step. `Err` only for a step that returned an allocator error.
    fn apply(&mut self, op: Op) -> Result<(), AllocError> {
        match op {
            Op::Alloc { slot, size, stream } => {
                let a = self.a().allocate(size, StreamId::sim(stream))?;
                let id = self.next_id;
                self.next_id += 1;
                if self.bytes {
                    if let Err(e) = self.fill(&a, id) {
                        self.fail(format!("fresh allocation not writable: {e}"));
                    }
                }
                if self.slots.len() <= slot {
                    self.slots.resize_with(slot + 1, || None);
                }
                if let Some(old) = self.slots[slot].replace(Slot { alloc: a, id }) {
                    // Scripts never reuse a slot; keep the test honest anyway.
                    self.a().deallocate_ptr(old.alloc.ptr())?;
                }
                Ok(())
            }
            Op::Free { slot } => {
                let Some(s) = self.slots.get(slot).and_then(Option::as_ref) else {
                    return Ok(());
                };
                let (ptr, requested, id) = (s.alloc.ptr(), s.alloc.requested(), s.id);
                if self.bytes {
                    if let Err(e) = self.verify(ptr, requested, id) {
                        self.fail(format!("data lost before free: {e}"));
                    }
                }
                // By address, so that the slot keeps the allocation if the free fails.
                self.a().deallocate_ptr(ptr)?;
                self.slots[slot] = None;
                Ok(())
            }
            Op::Record { slot, stream } => {
                let Some(ptr) = self
                    .slots
                    .get(slot)
                    .and_then(Option::as_ref)
                    .map(|s| s.alloc.ptr())
                else {
                    return Ok(());
                };
                self.a().record_stream(ptr, StreamId::sim(stream))
            }
            Op::EmptyCache => self.a().empty_cache(),
            Op::Hold => {
                self.backend.hold_stream(StreamId::sim(HELD));
                self.held = true;
                Ok(())
            }
            Op::Unhold => {
                self.backend.release_stream(StreamId::sim(HELD));
                self.held = false;
                Ok(())
            }
        }
    }

    /// Checks everything that must hold between any two calls.
    fn invariants(&self) -> Result<(), String> {
        let a = self.a();
        a.internal_check()?;
        let (stats, snap, live) = (a.stats(), a.snapshot(), self.backend.live());
        check_snapshot(&stats, &snap, a.classic())?;
        check_backend(&stats, &snap, live, a.classic(), !self.dirty)?;
        self.verify_all()
    }

    /// The promise of a call that returned an error.
    fn unchanged(
        &self,
        op: Op,
        before: &View,
        after: &View,
        err: &AllocError,
    ) -> Result<(), String> {
        let pressure = after.stats.num_device_free != before.stats.num_device_free
            || after.stats.remapped_bytes != before.stats.remapped_bytes
            || after.stats.handles_cached != before.stats.handles_cached
            || after.stats.stuck_bytes != before.stats.stuck_bytes
            || after.stats.parked_bytes != before.stats.parked_bytes
            || has_pending(&before.snapshot);
        let exact = match op {
            Op::Free { .. } | Op::Record { .. } => true,
            Op::Alloc { .. } => !pressure && !err.is_out_of_memory(),
            _ => false,
        };
        if exact {
            if after.figures != before.figures || after.snapshot != before.snapshot {
                return Err(format!(
                    "failed with {err} but changed the state: {}",
                    diff(before, after)
                ));
            }
            return Ok(());
        }
        // Out of memory, memory released under pressure, or a partial empty_cache: live
        // allocations stay exactly as they were and nothing is gained.
        if live_blocks(&after.snapshot) != live_blocks(&before.snapshot) {
            return Err(format!(
                "failed with {err} and changed the live allocations"
            ));
        }
        let (b, a) = (&before.stats, &after.stats);
        if a.allocation != b.allocation || a.allocated_bytes != b.allocated_bytes {
            return Err(format!(
                "failed with {err} and moved allocation stats: {:?} -> {:?}",
                b.allocated_bytes, a.allocated_bytes
            ));
        }
        if a.reserved_bytes.all.current > b.reserved_bytes.all.current
            || a.segment.all.current > b.segment.all.current
        {
            return Err(format!(
                "failed with {err} but reserves more: {} -> {} bytes, {} -> {} segments",
                b.reserved_bytes.all.current,
                a.reserved_bytes.all.current,
                b.segment.all.current,
                a.segment.all.current
            ));
        }
        Ok(())
    }
}

/// What the snapshot and the statistics must agree on, for both allocators; for the classic one
/// also the tiling of every segment by its blocks and the merging of free neighbours.
fn check_snapshot(stats: &MemoryStats, snap: &Snapshot, classic: bool) -> Result<(), String> {
    let blocks = || snap.segments.iter().flat_map(|s| &s.blocks);
    let in_state = |st: BlockState| blocks().filter(move |b| b.state == st);
    let allocated: Vec<_> = in_state(BlockState::ActiveAllocated).collect();
    let pending: Vec<_> = in_state(BlockState::ActivePendingFree).collect();
    let sum = |v: &[&vmm_alloc::snapshot::BlockInfo]| v.iter().map(|b| b.size as u64).sum::<u64>();
    let checks = [
        (
            "allocation",
            stats.allocation.all.current,
            allocated.len() as u64,
        ),
        (
            "allocated_bytes",
            stats.allocated_bytes.all.current,
            sum(&allocated),
        ),
        (
            "active",
            stats.active.all.current,
            (allocated.len() + pending.len()) as u64,
        ),
        (
            "active_bytes",
            stats.active_bytes.all.current,
            sum(&allocated) + sum(&pending),
        ),
        (
            "segment",
            stats.segment.all.current,
            snap.segments.len() as u64,
        ),
        (
            "reserved_bytes",
            stats.reserved_bytes.all.current,
            snap.segments.iter().map(|s| s.mapped_size as u64).sum(),
        ),
    ];
    for (name, stat, seen) in checks {
        if stat != seen {
            return Err(format!("stat {name} = {stat}, the snapshot shows {seen}"));
        }
    }
    if !classic {
        return Ok(());
    }
    for seg in &snap.segments {
        let mut cursor = seg.address.get();
        let mut prev_free = false;
        for b in &seg.blocks {
            if b.address.get() != cursor {
                return Err(format!(
                    "segment {} is not tiled: block at {} after {cursor:#x}",
                    seg.address, b.address
                ));
            }
            let free = b.state == BlockState::Inactive;
            if free && prev_free {
                return Err(format!(
                    "two adjacent free blocks not merged at {}",
                    b.address
                ));
            }
            prev_free = free;
            cursor += b.size as u64;
        }
        if cursor != seg.address.get() + seg.total_size as u64 || seg.mapped_size != seg.total_size
        {
            return Err(format!("segment {} blocks do not cover it", seg.address));
        }
    }
    Ok(())
}

/// What the backend holds must be what the allocator accounts for: no handle, mapping or
/// reservation it forgot, none it counts but gave back. With `exact` false (a fault fired and no
/// `empty_cache` has run since), the backend may hold more: what a failed call could not give
/// back, which the allocator keeps to give back later (classic "debris", expandable "stuck"
/// chunks and abandoned reservations); `empty_cache` must then give it all back.
fn check_backend(
    stats: &MemoryStats,
    snap: &Snapshot,
    live: LiveResources,
    classic: bool,
    exact: bool,
) -> Result<(), String> {
    let segments = stats.segment.all.current as usize;
    let reserved = stats.reserved_bytes.all.current as usize;
    let ok = if classic {
        let held = [
            live.reservations,
            live.mappings,
            live.handles,
            live.mapped_bytes,
        ];
        let accounted = [segments, segments, segments, reserved];
        if exact {
            held == accounted
        } else {
            held.iter().zip(accounted).all(|(&h, a)| h >= a)
        }
    } else {
        // Chunks a failed rollback could not unmap ("stuck") stay mapped outside `reserved`,
        // each still one mapping of one handle; a rolled-back new segment whose reservation
        // would not free is no segment any more but still a reservation (Note [Abandoned]).
        // A parked page (Note [Parked pages]) is a second mapping of a handle mapped or cached
        // elsewhere, outside `reserved`; so is an alias rescue's alias (Note [Alias rescue]).
        let parked = (
            (stats.parked_pages + stats.alias_mappings) as usize,
            (stats.parked_bytes + stats.alias_bytes) as usize,
        );
        // A rescue in a segment's rescue space is a segment with no reservation of its own
        // (Note [Rescue space]).
        let segments = segments - stats.rescues_in_space as usize;
        (live.reservations == segments || !exact && live.reservations > segments)
            && live.handles + parked.0 == live.mappings + stats.handles_cached as usize
            && live.mapped_bytes >= reserved + parked.1
            && (!exact || live.mapped_bytes == reserved + parked.1)
    };
    if !ok {
        return Err(format!(
            "backend holds {live}; allocator accounts {segments} segment(s), {reserved} B reserved, {} cached handle(s)",
            stats.handles_cached
        ));
    }
    // Events of completed frees are released at once (or, if that failed, at the next
    // `empty_cache`).
    if exact && !has_pending(snap) && live.events > 0 {
        return Err(format!(
            "backend holds {} event(s) but no free is pending",
            live.events
        ));
    }
    Ok(())
}

/// What one run saw.
#[derive(Default, Debug)]
pub struct Outcome {
    /// Backend calls the script made (the finish and teardown not included).
    pub script_calls: vmm_alloc::backend::CallCounts,
    pub fired: u64,
    pub errors: u64,
    pub recovered: u64,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

/// Whether an error says what failed: out of memory, or the backend call that failed.
fn names_the_problem(err: &AllocError, fault: &Fault) -> bool {
    match err {
        AllocError::OutOfMemory(_) => err.to_string().contains("Tried to allocate"),
        AllocError::Backend(e) => {
            let msg = err.to_string();
            e.op == fault.kind
                && msg.contains(fault.kind.driver_name())
                && (msg.contains("injected fault") || e.is_out_of_memory())
        }
        _ => false,
    }
}

impl<B: EmulatedBackend> Run<'_, B> {
    /// Runs `script` with `fault` armed from the start: at every step the fault hits, checks the
    /// step's promise and every invariant; a transient fault is removed after the step it hit,
    /// a persistent one after `persist` steps it hit. Then finishes the script, frees
    /// everything, and checks that nothing is left, before and after teardown.
    pub fn go(
        mut self,
        script: &[Op],
        fault: Option<Fault>,
        persist: usize,
        check_every: usize,
    ) -> Outcome {
        let mut out = Outcome::default();
        if let Some(f) = fault {
            self.backend
                .set_faults(FaultPlan::new().fail(f.kind, f.trigger, f.error));
        }
        let mut armed = fault;
        let mut hits_left = persist;
        let mut since_check = 0;
        let start = self.backend.calls();
        for (i, &op) in script.iter().enumerate() {
            let fired_before = self.backend.faults_fired();
            let before = armed.map(|_| view(self.a()));
            let result = catch_unwind(AssertUnwindSafe(|| self.apply(op)));
            let result = match result {
                Ok(r) => r,
                Err(p) => {
                    let msg = panic_message(&*p);
                    self.fail(format!("step {i} {op:?} PANICKED: {msg}"));
                    // The state may be anything now: drop without judging it.
                    let _ = catch_unwind(AssertUnwindSafe(|| drop(self.alloc.take())));
                    return out;
                }
            };
            let fired = self.backend.faults_fired() - fired_before;
            let (Some(f), Some(before)) = (armed, before) else {
                if matches!(op, Op::EmptyCache) && result.is_ok() && self.dirty {
                    // Everything failed calls left behind must be given back by now.
                    self.dirty = false;
                    if let Err(e) = self.invariants() {
                        self.fail(format!("after step {i} {op:?} (faults removed): {e}"));
                        return out;
                    }
                }
                if let Err(e) = &result {
                    if !e.is_out_of_memory() {
                        self.fail(format!("step {i} {op:?} failed with no fault armed: {e}"));
                        return out;
                    }
                }
                since_check += 1;
                if check_every > 0 && since_check >= check_every && fault.is_some() {
                    since_check = 0;
                    if let Err(e) = self.invariants() {
                        self.fail(format!("after step {i} {op:?} (faults removed): {e}"));
                        return out;
                    }
                }
                continue;
            };
            if fired == 0 {
                if let Err(e) = &result {
                    if !e.is_out_of_memory() {
                        self.fail(format!("step {i} {op:?} failed but no fault fired: {e}"));
                        return out;
                    }
                }
                continue;
            }
            out.fired += fired;
            self.dirty = true;
            let after = view(self.a());
            let verdict = match &result {
                Err(e) => {
                    out.errors += 1;
                    if !names_the_problem(e, &f) {
                        Err(format!("the error does not name the failed call: {e:?}"))
                    } else {
                        self.unchanged(op, &before, &after, e)
                    }
                }
                Ok(()) => {
                    out.recovered += 1;
                    Ok(())
                }
            };
            if let Err(e) = verdict.and_then(|()| self.invariants()) {
                self.fail(format!("step {i} {op:?} hit by {f:?}: {e}"));
                return out;
            }
            let done = match f.trigger {
                Trigger::Nth(_) => true,
                Trigger::From(_) => {
                    hits_left = hits_left.saturating_sub(1);
                    hits_left == 0
                }
            };
            if done {
                self.backend.clear_faults();
                armed = None;
            }
        }
        out.script_calls = self.backend.calls().since(&start);
        self.backend.clear_faults();
        self.finish();
        out
    }

    /// Frees everything, empties the cache, checks that the device is back to nothing held and
    /// still usable, drops the allocator and checks that the backend holds nothing.
    fn finish(&mut self) {
        if let Err(e) = self.finish_inner() {
            self.fail(format!("at the end: {e}"));
            let _ = catch_unwind(AssertUnwindSafe(|| drop(self.alloc.take())));
        }
    }

    fn finish_inner(&mut self) -> Result<(), String> {
        let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
            self.invariants()?;
            self.dirty = false;
            if self.held {
                self.backend.release_stream(StreamId::sim(HELD));
            }
            for slot in 0..self.slots.len() {
                self.apply(Op::Free { slot })
                    .map_err(|e| format!("free of slot {slot}: {e}"))?;
            }
            let a = self.a();
            a.empty_cache().map_err(|e| format!("empty_cache: {e}"))?;
            let cap = self.backend.mem_info().map_err(|e| e.to_string())?.total;
            let big = a
                .allocate(cap / 4 * 3, StreamId::DEFAULT)
                .map_err(|e| format!("3/4 of the device after freeing everything: {e}"))?;
            a.deallocate(big).map_err(|e| e.to_string())?;
            a.empty_cache().map_err(|e| format!("empty_cache: {e}"))?;
            self.invariants()?;
            let s = a.stats();
            let live = self.backend.live();
            if s.reserved_bytes.all.current != 0
                || s.allocated_bytes.all.current != 0
                || s.handles_cached != 0
                || live.mappings != 0
                || live.handles != 0
                || live.reservations != 0
            {
                return Err(format!(
                    "after freeing everything and empty_cache: reserved {} B, allocated {} B, {} cached handle(s); backend holds {live}",
                    s.reserved_bytes.all.current, s.allocated_bytes.all.current, s.handles_cached
                ));
            }
            Ok(())
        }));
        match r {
            Ok(r) => r?,
            Err(p) => return Err(format!("PANICKED: {}", panic_message(&*p))),
        }
        catch_unwind(AssertUnwindSafe(|| drop(self.alloc.take())))
            .map_err(|p| format!("drop PANICKED: {}", panic_message(&*p)))?;
        let live = self.backend.live();
        if !live.is_empty() {
            return Err(format!("after teardown the backend still holds {live}"));
        }
        Ok(())
    }
}
