//! Stream uses (`record_stream`) and the events recorded for them when a block is freed.
//!
//! A block may be used by work on streams other than its own. When it is freed, one event is
//! recorded on each of those streams; the block is reused only once every one has completed
//! (PyTorch's `stream_uses` and `insert_events`). Which block waits where, and in what order
//! completed events are looked at, is each allocator's policy.

use crate::backend::{Backend, CallKind, EventId, StreamId};
use crate::error::BackendError;
use crate::mechanism::counters::track;
use crate::mechanism::deferred::Deferred;
use crate::stats::MemoryStats;

/// The streams besides its own that used a block. A boxed slice: empty, and unallocated, for most
/// blocks, and two words in the block (live maps move blocks on every allocate and free).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamUses(Box<[StreamId]>);

impl StreamUses {
    /// `recordStream`: notes `stream`, unless it is the block's own (`own`) or noted already.
    pub(crate) fn record(&mut self, own: StreamId, stream: StreamId) {
        if stream != own && !self.0.contains(&stream) {
            let mut uses = std::mem::take(&mut self.0).into_vec();
            uses.push(stream);
            self.0 = uses.into_boxed_slice();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Records one event on each stream that used the block, in the order they were noted: what
    /// the block waits for before reuse. If a recording fails, the events already recorded are
    /// released (or deferred) and the error returned: nothing changed.
    pub(crate) fn record_events<B: Backend>(
        &self,
        backend: &B,
        stats: &mut MemoryStats,
        deferred: &mut Deferred,
    ) -> Result<Vec<(StreamId, EventId)>, BackendError> {
        let mut recorded = Vec::with_capacity(self.0.len());
        for &s in self.0.iter() {
            match track(stats, CallKind::RecordEvent, backend.record_event(s)) {
                Ok(e) => recorded.push((s, e)),
                Err(err) => {
                    for (_, e) in recorded {
                        deferred.release_event(backend, stats, e);
                    }
                    return Err(err);
                }
            }
        }
        Ok(recorded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_each_other_stream_once() {
        let own = StreamId::sim(1);
        let mut uses = StreamUses::default();
        uses.record(own, own);
        assert!(uses.is_empty());
        uses.record(own, StreamId::sim(2));
        uses.record(own, StreamId::sim(2));
        uses.record(own, StreamId::sim(3));
        assert_eq!(&*uses.0, &[StreamId::sim(2), StreamId::sim(3)]);
    }
}
