//! Simulated stream events, shared by the Sim and Host backends.
//!
//! There is no real asynchronous work on those backends, so an event completes as soon as it is
//! recorded, unless a test holds its stream: then the stream's events stay pending until the test
//! releases the stream, completes the event, or synchronizes the stream. That is how tests exercise
//! cross-stream reuse (memory freed on stream A must not be reused on B before A's work is done).

use std::collections::{HashMap, HashSet};

use crate::backend::raw::RawEvent;
use crate::backend::StreamId;

#[derive(Default, Debug)]
pub(crate) struct SimEvents {
    next: RawEvent,
    /// raw event -> (its stream, completed?)
    events: HashMap<RawEvent, (StreamId, bool)>,
    held: HashSet<StreamId>,
    /// stream -> how many times all its events were completed at once (synchronize, release).
    generations: HashMap<StreamId, u64>,
}

impl SimEvents {
    pub(crate) fn record(&mut self, stream: StreamId) -> RawEvent {
        self.next += 1;
        let complete = !self.held.contains(&stream);
        self.events.insert(self.next, (stream, complete));
        self.next
    }

    pub(crate) fn query(&self, event: RawEvent) -> bool {
        self.events.get(&event).is_some_and(|&(_, done)| done)
    }

    pub(crate) fn release(&mut self, event: RawEvent) {
        self.events.remove(&event);
    }

    /// Completes every pending event of `stream` (the stream's work is done).
    pub(crate) fn synchronize(&mut self, stream: StreamId) {
        *self.generations.entry(stream).or_default() += 1;
        for (s, done) in self.events.values_mut() {
            if *s == stream {
                *done = true;
            }
        }
    }
}

/// The test controls (`testkit::EmulatedBackend`).
#[cfg(feature = "testkit")]
impl SimEvents {
    /// From now on, events recorded on `stream` stay pending.
    pub(crate) fn hold(&mut self, stream: StreamId) {
        self.held.insert(stream);
    }

    /// Stops holding `stream` and completes its pending events.
    pub(crate) fn release_stream(&mut self, stream: StreamId) {
        self.held.remove(&stream);
        self.synchronize(stream);
    }

    /// Completes one event. Returns false if the event is unknown.
    pub(crate) fn complete(&mut self, event: RawEvent) -> bool {
        match self.events.get_mut(&event) {
            Some((_, done)) => {
                *done = true;
                true
            }
            None => false,
        }
    }

    /// How many times every event of `stream` was completed at once (by `synchronize` or by
    /// releasing the held stream).
    pub(crate) fn generation(&self, stream: StreamId) -> u64 {
        self.generations.get(&stream).copied().unwrap_or(0)
    }

    /// Events of `stream` recorded and not yet complete.
    pub(crate) fn pending(&self, stream: StreamId) -> usize {
        self.events
            .values()
            .filter(|&&(s, done)| s == stream && !done)
            .count()
    }
}
