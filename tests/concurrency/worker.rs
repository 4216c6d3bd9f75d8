//! The worker threads: allocate and free on their own stream and on the shared one, hand blocks
//! to the next worker (RMM's `AllocFreeDifferentThreads`), free what the previous one handed over.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use vmm_alloc::backend::EventId;
use vmm_alloc::StreamId;

use crate::rng::Rng;
use crate::world::{Held, PanicFlag, WorkerDone, World};
use vmm_alloc::testkit::EmulatedBackend;

/// A block allocated on `stream` by one worker, given to the next one to free. `event` was
/// recorded on `stream` after the producer's use of it: the consumer waits for it, as a CUDA
/// consumer makes its stream wait for the producer's event, before touching the block.
pub struct Handoff {
    pub h: Held,
    pub event: EventId,
    pub stream: StreamId,
}

/// How big blocks get, and how many one worker keeps.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub live_cap: usize,
    /// Size classes: (per cent of requests, smallest, largest), per cents summing to 100.
    pub sizes: &'static [(u64, usize, usize)],
}

pub struct Worker<'w, 'a, B: EmulatedBackend> {
    pub world: &'w World<'a, B>,
    pub index: usize,
    pub rng: Rng,
    pub shape: Shape,
    pub outbox: SyncSender<Handoff>,
    pub inbox: Receiver<Handoff>,
}

impl<B: EmulatedBackend> Worker<'_, '_, B> {
    pub fn run(mut self) {
        let w = self.world;
        let _done = WorkerDone(w);
        let _flag = PanicFlag(w);
        let mut mine: Vec<Held> = Vec::new();
        while !w.stopping() {
            let r = self.rng.below(1000);
            if r < 450 {
                if mine.len() >= self.shape.live_cap {
                    self.free_one(&mut mine);
                } else {
                    let stream = self.pick_alloc_stream();
                    let size = self.size();
                    match w.allocate(size, stream) {
                        Some(mut h) => {
                            if self.rng.chance(80) {
                                let other = self.other_stream(stream);
                                w.record_stream(&mut h, other);
                            }
                            mine.push(h);
                        }
                        // Out of memory: give half back, as a program would shrink its batch.
                        None => {
                            for _ in 0..mine.len().div_ceil(2) {
                                self.free_one(&mut mine);
                            }
                        }
                    }
                }
            } else if r < 750 {
                self.free_one(&mut mine);
            } else if r < 870 {
                self.hand_off();
            } else {
                for _ in 0..4 {
                    match self.inbox.try_recv() {
                        Ok(item) => self.consume(item),
                        Err(_) => break,
                    }
                }
            }
        }
        // Wind down: free what is left, tell the next worker nothing more comes, and take
        // everything the previous one still sends until it says the same.
        while !mine.is_empty() {
            self.free_one(&mut mine);
        }
        let Self {
            inbox,
            outbox,
            rng,
            index,
            ..
        } = self;
        drop(outbox);
        let mut this = Drain {
            world: w,
            rng,
            index,
        };
        while let Ok(item) = inbox.recv() {
            this.consume(item);
        }
    }

    fn own_stream(&self) -> StreamId {
        self.world.streams[self.index]
    }

    fn shared_stream(&self) -> StreamId {
        *self.world.streams.last().unwrap()
    }

    /// The own stream mostly, the shared one sometimes.
    fn pick_alloc_stream(&mut self) -> StreamId {
        if self.rng.chance(300) {
            self.shared_stream()
        } else {
            self.own_stream()
        }
    }

    /// Any stream of the run other than `not`.
    fn other_stream(&mut self, not: StreamId) -> StreamId {
        let streams = &self.world.streams;
        loop {
            let s = streams[self.rng.below(streams.len() as u64) as usize];
            if s != not {
                return s;
            }
        }
    }

    /// A size from the shape's classes.
    fn size(&mut self) -> usize {
        let mut r = self.rng.below(100);
        for &(per_cent, lo, hi) in self.shape.sizes {
            if r < per_cent {
                return self.rng.range(lo, hi);
            }
            r -= per_cent;
        }
        unreachable!("size classes must sum to 100 per cent")
    }

    /// Frees a random block of `mine`, sometimes after another stream used it.
    fn free_one(&mut self, mine: &mut Vec<Held>) {
        if mine.is_empty() {
            return;
        }
        let i = self.rng.below(mine.len() as u64) as usize;
        let mut h = mine.swap_remove(i);
        if self.rng.chance(200) {
            let other = self.other_stream(h.a.stream());
            self.world.record_stream(&mut h, other);
        }
        let by_ptr = self.rng.chance(200);
        self.world.free(h, by_ptr);
    }

    /// Allocates a block, "uses" it on its stream, records an event there and sends both to the
    /// next worker; if that worker's inbox is full, frees the block itself.
    fn hand_off(&mut self) {
        let w = self.world;
        let stream = if self.rng.chance(200) {
            self.shared_stream()
        } else {
            self.own_stream()
        };
        let size = self.size();
        let Some(h) = w.allocate(size, stream) else {
            return;
        };
        let event = w
            .backend
            .record_event(stream)
            .unwrap_or_else(|e| panic!("{}: record_event({stream:?}): {e}", w.name));
        match self.outbox.try_send(Handoff { h, event, stream }) {
            Ok(()) => {}
            Err(TrySendError::Full(item) | TrySendError::Disconnected(item)) => {
                w.n.handoffs_refused.fetch_add(1, Relaxed);
                w.backend.release_event(item.event).expect("release_event");
                w.free(item.h, false);
            }
        }
    }

    fn consume(&mut self, item: Handoff) {
        Drain {
            world: self.world,
            rng: Rng::new(self.rng.next_u64()),
            index: self.index,
        }
        .consume(item)
    }
}

/// The consumer side, also used after the worker's own loop ended.
struct Drain<'w, 'a, B: EmulatedBackend> {
    world: &'w World<'a, B>,
    rng: Rng,
    index: usize,
}

impl<B: EmulatedBackend> Drain<'_, '_, B> {
    /// Waits for the producer's event (synchronizing its stream if its work is held), then
    /// either frees the block at once or first uses it on the own stream B (new pattern,
    /// `record_stream(B)`), so the allocator must keep it until B's work is done.
    fn consume(&mut self, item: Handoff) {
        let w = self.world;
        let Handoff {
            mut h,
            event,
            stream,
        } = item;
        let done = w.backend.query_event(event).expect("query_event");
        if !done {
            w.backend.synchronize(stream).expect("synchronize");
            assert!(
                w.backend.query_event(event).expect("query_event"),
                "{}: event incomplete after synchronize",
                w.name
            );
        }
        w.backend.release_event(event).expect("release_event");
        let own = w.streams[self.index];
        if own != h.a.stream() && self.rng.chance(400) {
            w.refill(&mut h);
            w.record_stream(&mut h, own);
        }
        w.n.cross_thread_frees.fetch_add(1, Relaxed);
        let by_ptr = self.rng.chance(200);
        w.free(h, by_ptr);
    }
}
