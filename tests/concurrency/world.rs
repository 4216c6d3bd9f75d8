//! What every thread of one run shares: the allocator under test, the backend, and the test's own
//! books, which are what catch a broken allocator:
//!
//! * the *live map*: every block a thread holds, by address. A block handed out while it overlaps
//!   another live block (double hand-out, a range carved twice) is caught on insertion, on every
//!   backend, even with no bytes behind it;
//! * *patterns* (Host only): every block is filled with words unique to it and checked word by
//!   word before it is freed, so a block that another thread's block overlaps, or that was
//!   unmapped or remapped under it, shows as corrupt bytes;
//! * the *pending uses*: a block freed after `record_stream(B)` while the test held B's work
//!   pending must not be handed out again before B's work completes (PyTorch's `record_stream`
//!   contract, checked with the emulated backends' stream generations).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Mutex, PoisonError};

use vmm_alloc::backend::Capabilities;
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{AllocError, Allocation, Allocator, OomReport, StreamId};

/// Counters of one run, shared by all threads.
#[derive(Default)]
pub struct Counters {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub cross_thread_frees: AtomicU64,
    pub handoffs_refused: AtomicU64,
    pub record_streams: AtomicU64,
    pub ooms: AtomicU64,
    pub empty_caches: AtomicU64,
    pub stats_calls: AtomicU64,
    pub checks: AtomicU64,
    pub snapshots: AtomicU64,
    pub holds: AtomicU64,
    pub pending_checked: AtomicU64,
    pub bytes_verified: AtomicU64,
}

impl Counters {
    /// Allocator calls made (allocate, deallocate, record_stream, empty_cache, stats, snapshot,
    /// invariant checks).
    pub fn ops(&self) -> u64 {
        [
            &self.allocs,
            &self.ooms,
            &self.frees,
            &self.record_streams,
            &self.empty_caches,
            &self.stats_calls,
            &self.checks,
            &self.snapshots,
        ]
        .iter()
        .map(|c| c.load(Relaxed))
        .sum()
    }
}

/// A block a thread holds: the allocation, the id its pattern is made from, and the streams
/// given to `record_stream` for it.
#[derive(Debug)]
pub struct Held {
    pub a: Allocation,
    pub uid: u64,
    pub uses: Vec<StreamId>,
}

/// A use by stream `stream` that was still pending (the stream held) when the block was freed:
/// `[start, end)` must not be handed out while `stream`'s generation is still `generation`.
struct PendingUse {
    start: u64,
    end: u64,
    stream: StreamId,
    generation: u64,
    uid: u64,
}

pub struct World<'a, B: EmulatedBackend> {
    pub name: String,
    pub backend: B,
    pub alloc: &'a dyn Allocator,
    pub bytes: bool,
    /// Every stream the run uses: the workers' own streams, then the shared one.
    pub streams: Vec<StreamId>,
    /// Whether the device thread holds each stream of `streams` (set after `hold`, cleared
    /// before `release`, so `true` means held right now).
    held: Vec<AtomicBool>,
    live: Mutex<BTreeMap<u64, (u64, u64)>>,
    pending: Mutex<Vec<PendingUse>>,
    next_uid: AtomicU64,
    /// The out-of-memory report with the fewest bytes allocated: how legitimate OOMs were.
    pub lowest_oom: Mutex<Option<OomReport>>,
    /// Set when the run's time is up or a thread failed: every loop winds down.
    pub stop: AtomicBool,
    pub failed: AtomicBool,
    pub workers_left: AtomicU64,
    pub n: Counters,
}

/// Counts a worker out when it ends, normally or by a panic.
pub struct WorkerDone<'w, 'a, B: EmulatedBackend>(pub &'w World<'a, B>);

impl<B: EmulatedBackend> Drop for WorkerDone<'_, '_, B> {
    fn drop(&mut self) {
        self.0.workers_left.fetch_sub(1, SeqCst);
    }
}

/// Sets `failed` and `stop` if the thread that owns it panics, so the other threads wind down
/// instead of running to the deadline.
pub struct PanicFlag<'w, 'a, B: EmulatedBackend>(pub &'w World<'a, B>);

impl<B: EmulatedBackend> Drop for PanicFlag<'_, '_, B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, SeqCst);
            self.0.stop.store(true, SeqCst);
        }
    }
}

impl<'a, B: EmulatedBackend> World<'a, B> {
    pub fn new(name: String, backend: B, alloc: &'a dyn Allocator, streams: Vec<StreamId>) -> Self {
        let bytes = backend.capabilities().contains(Capabilities::BYTES);
        Self {
            name,
            backend,
            alloc,
            bytes,
            held: streams.iter().map(|_| AtomicBool::new(false)).collect(),
            streams,
            live: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(Vec::new()),
            next_uid: AtomicU64::new(1),
            lowest_oom: Mutex::new(None),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            workers_left: AtomicU64::new(0),
            n: Counters::default(),
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Relaxed)
    }

    fn stream_index(&self, stream: StreamId) -> usize {
        self.streams
            .iter()
            .position(|&s| s == stream)
            .expect("a stream of this run")
    }

    pub fn is_held(&self, stream: StreamId) -> bool {
        self.held[self.stream_index(stream)].load(SeqCst)
    }

    /// Makes `stream`'s work pending (`true`) or completes it and stops holding it (`false`).
    pub fn set_held(&self, stream: StreamId, hold: bool) {
        let flag = &self.held[self.stream_index(stream)];
        if hold {
            self.backend.hold_stream(stream);
            flag.store(true, SeqCst);
            self.n.holds.fetch_add(1, Relaxed);
        } else {
            flag.store(false, SeqCst);
            self.backend.release_stream(stream);
        }
    }

    /// Allocates, checks the block against the test's books and fills it with its pattern.
    /// `None` on a legitimate out-of-memory error (counted); panics on any other error.
    pub fn allocate(&self, size: usize, stream: StreamId) -> Option<Held> {
        let a = match self.alloc.allocate(size, stream) {
            Ok(a) => a,
            Err(AllocError::OutOfMemory(r)) => {
                self.n.ooms.fetch_add(1, Relaxed);
                let mut low = self
                    .lowest_oom
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if low.as_ref().is_none_or(|l| r.allocated < l.allocated) {
                    *low = Some(*r);
                }
                return None;
            }
            Err(e) => panic!("{}: allocate({size}, {stream:?}) failed: {e}", self.name),
        };
        self.n.allocs.fetch_add(1, Relaxed);
        let (start, len) = (a.ptr().get(), a.size() as u64);
        assert!(
            start.is_multiple_of(512) && a.size() >= size && a.requested() == size,
            "{}: bad allocation {a:?} for {size} bytes",
            self.name
        );
        assert_eq!(a.stream(), stream, "{}: {a:?}", self.name);
        let uid = self.next_uid.fetch_add(1, Relaxed);
        self.check_not_pending(start, start + len, uid);
        {
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((&s, &(e, other))) = live.range(..start + len).next_back() {
                assert!(
                    e <= start,
                    "{}: block #{uid} [{start:#x}, {:#x}) overlaps live block #{other} [{s:#x}, {e:#x}): handed out twice",
                    self.name,
                    start + len
                );
            }
            live.insert(start, (start + len, uid));
        }
        let held = Held {
            a,
            uid,
            uses: Vec::new(),
        };
        self.fill(&held);
        Some(held)
    }

    /// Fails if `[start, end)` overlaps a block freed while a stream that used it still had
    /// pending work, and that work has not completed since.
    fn check_not_pending(&self, start: u64, end: u64, uid: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|p| self.backend.stream_generation(p.stream) == p.generation);
        self.n.pending_checked.fetch_add(1, Relaxed);
        if let Some(p) = pending.iter().find(|p| p.start < end && start < p.end) {
            panic!(
                "{}: block #{uid} [{start:#x}, {end:#x}) reuses [{:#x}, {:#x}) of block #{} before the work of {:?} that used it completed (record_stream ignored)",
                self.name, p.start, p.end, p.uid, p.stream
            );
        }
    }

    /// `record_stream(block, stream)`, remembered for the pending-use check.
    pub fn record_stream(&self, h: &mut Held, stream: StreamId) {
        self.alloc
            .record_stream(h.a.ptr(), stream)
            .unwrap_or_else(|e| panic!("{}: record_stream({:?}): {e}", self.name, h.a));
        self.n.record_streams.fetch_add(1, Relaxed);
        if !h.uses.contains(&stream) {
            h.uses.push(stream);
        }
    }

    /// Checks the block's pattern and frees it (with `deallocate` or, for variety, by pointer).
    pub fn free(&self, h: Held, by_ptr: bool) {
        self.verify(&h);
        let (start, end) = (h.a.ptr().get(), h.a.ptr().get() + h.a.size() as u64);
        // Uses by other streams whose work is pending right now must keep the range out of reach
        // until that work completes. The generation is read before the flag: if the flag still
        // says held, no completion happened in between (see `set_held`).
        for &s in h.uses.iter().filter(|&&s| s != h.a.stream()) {
            let generation = self.backend.stream_generation(s);
            if self.is_held(s) {
                self.pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(PendingUse {
                        start,
                        end,
                        stream: s,
                        generation,
                        uid: h.uid,
                    });
            }
        }
        let removed = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&start);
        assert_eq!(
            removed,
            Some((end, h.uid)),
            "{}: books lost {h:?}",
            self.name
        );
        let result = if by_ptr {
            self.alloc.deallocate_ptr(h.a.ptr())
        } else {
            self.alloc.deallocate(h.a)
        };
        result.unwrap_or_else(|e| panic!("{}: deallocate block #{}: {e}", self.name, h.uid));
        self.n.frees.fetch_add(1, Relaxed);
    }

    /// Gives the block a new pattern (a new owner's use of it).
    pub fn refill(&self, h: &mut Held) {
        self.verify(h);
        let uid = self.next_uid.fetch_add(1, Relaxed);
        let start = h.a.ptr().get();
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = live.get_mut(&start).expect("a live block");
        assert_eq!(entry.1, h.uid, "{}: books lost {h:?}", self.name);
        entry.1 = uid;
        drop(live);
        h.uid = uid;
        self.fill(h);
    }

    fn fill(&self, h: &Held) {
        if !self.bytes {
            return;
        }
        let words = h.a.size() / 8;
        let mut buf = Vec::with_capacity(h.a.size());
        for i in 0..words as u64 {
            buf.extend_from_slice(&word(h.uid, i).to_le_bytes());
        }
        self.backend
            .write(h.a.ptr(), &buf)
            .unwrap_or_else(|e| panic!("{}: write block #{}: {e}", self.name, h.uid));
    }

    fn verify(&self, h: &Held) {
        if !self.bytes {
            return;
        }
        let mut buf = vec![0u8; h.a.size()];
        self.backend
            .read(h.a.ptr(), &mut buf)
            .unwrap_or_else(|e| panic!("{}: read block #{}: {e}", self.name, h.uid));
        for (i, chunk) in buf.chunks_exact(8).enumerate() {
            let got = u64::from_le_bytes(chunk.try_into().unwrap());
            if got != word(h.uid, i as u64) {
                panic!(
                    "{}: block #{} ({:?}) corrupt at byte {}: {got:#018x}, expected {:#018x} (block #{} wrote it?)",
                    self.name,
                    h.uid,
                    h.a,
                    i * 8,
                    word(h.uid, i as u64),
                    got >> 32
                );
            }
        }
        self.n.bytes_verified.fetch_add(buf.len() as u64, Relaxed);
    }

    /// Live blocks in the test's books.
    pub fn live_blocks(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Word `i` of block `uid`'s pattern: the id in the high half, so two blocks differ in every word.
fn word(uid: u64, i: u64) -> u64 {
    (uid << 32) | (i & 0xFFFF_FFFF)
}
