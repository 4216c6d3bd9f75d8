//! A backend wrapper that reports every state-changing call that succeeded to an observer: a test
//! sees what the allocator does to the device (which ranges are mapped, when it waits for work)
//! from the backend's side, not from the allocator's own books.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{EmulatedBackend, FaultPlan};
use crate::backend::{
    Access, Backend, BackendError, CallCounts, Capabilities, EventId, LiveResources, MemInfo,
    PhysHandle, StreamId,
};
use crate::units::{DevAddr, VaRange};

/// A call that succeeded and changed what the backend holds, or waited for work.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Call<'a> {
    /// `reserve` returned this range.
    Reserve(VaRange),
    /// `free_reservation` of this range.
    FreeReservation(VaRange),
    /// `create` of `len` bytes returned `handle`.
    Create {
        /// The new handle.
        handle: PhysHandle,
        /// Its size.
        len: usize,
    },
    /// `release` of a handle.
    Release(PhysHandle),
    /// `map` of `len` bytes of `handle` from `offset` at `at`.
    Map {
        /// Where.
        at: DevAddr,
        /// How many bytes.
        len: usize,
        /// Which handle.
        handle: PhysHandle,
        /// From which byte of it.
        offset: usize,
    },
    /// `unmap` of `[at, at + len)`.
    Unmap {
        /// Where.
        at: DevAddr,
        /// How many bytes.
        len: usize,
    },
    /// `set_access` of `[at, at + len)`.
    SetAccess {
        /// Where.
        at: DevAddr,
        /// How many bytes.
        len: usize,
        /// The access list.
        access: &'a [Access],
    },
    /// `record_event` on `stream` returned `event`.
    RecordEvent {
        /// The stream.
        stream: StreamId,
        /// The new event.
        event: EventId,
    },
    /// `release_event`.
    ReleaseEvent(EventId),
    /// `synchronize` of a stream.
    Synchronize(StreamId),
}

/// Told about each call an [`Observed`] backend made successfully, right after it returned.
pub trait Observer: Send + Sync {
    /// One successful call.
    fn observe(&self, call: Call<'_>);
}

/// A backend that forwards every call to `B` and reports the successful state-changing ones to
/// its observer `O`. Cloning clones both (a shared observer such as [`MappingLog`] stays shared).
#[derive(Clone, Debug)]
pub struct Observed<B, O = MappingLog> {
    backend: B,
    observer: O,
}

impl<B: Backend> Observed<B, MappingLog> {
    /// `backend`, observed by a fresh [`MappingLog`].
    pub fn new(backend: B) -> Self {
        Self::with_observer(backend, MappingLog::default())
    }

    /// The mapping log (locked).
    pub fn log(&self) -> MutexGuard<'_, MappingState> {
        self.observer.lock()
    }
}

impl<B: Backend, O: Observer> Observed<B, O> {
    /// `backend`, observed by `observer`.
    pub fn with_observer(backend: B, observer: O) -> Self {
        Self { backend, observer }
    }

    /// The wrapped backend: calls made on it directly are not observed.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    fn seen<'a, T>(
        &self,
        result: Result<T, BackendError>,
        call: impl FnOnce(&T) -> Call<'a>,
    ) -> Result<T, BackendError> {
        if let Ok(value) = &result {
            self.observer.observe(call(value));
        }
        result
    }
}

impl<B: Backend, O: Observer> Backend for Observed<B, O> {
    fn name(&self) -> &'static str {
        self.backend.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }
    fn granularity(&self) -> usize {
        self.backend.granularity()
    }
    fn device(&self) -> u32 {
        self.backend.device()
    }
    fn device_count(&self) -> u32 {
        self.backend.device_count()
    }
    fn reserve(&self, len: usize) -> Result<VaRange, BackendError> {
        self.seen(self.backend.reserve(len), |&r| Call::Reserve(r))
    }
    fn free_reservation(&self, range: VaRange) -> Result<(), BackendError> {
        self.seen(self.backend.free_reservation(range), |_| {
            Call::FreeReservation(range)
        })
    }
    fn create(&self, len: usize) -> Result<PhysHandle, BackendError> {
        self.seen(self.backend.create(len), |&handle| Call::Create {
            handle,
            len,
        })
    }
    fn release(&self, handle: PhysHandle) -> Result<(), BackendError> {
        self.seen(self.backend.release(handle), |_| Call::Release(handle))
    }
    fn map(
        &self,
        at: DevAddr,
        len: usize,
        handle: PhysHandle,
        offset: usize,
    ) -> Result<(), BackendError> {
        self.seen(self.backend.map(at, len, handle, offset), |_| Call::Map {
            at,
            len,
            handle,
            offset,
        })
    }
    fn unmap(&self, at: DevAddr, len: usize) -> Result<(), BackendError> {
        self.seen(self.backend.unmap(at, len), |_| Call::Unmap { at, len })
    }
    fn set_access(&self, at: DevAddr, len: usize, access: &[Access]) -> Result<(), BackendError> {
        self.seen(self.backend.set_access(at, len, access), |_| {
            Call::SetAccess { at, len, access }
        })
    }
    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.backend.mem_info()
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.seen(self.backend.record_event(stream), |&event| {
            Call::RecordEvent { stream, event }
        })
    }
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.backend.query_event(event)
    }
    fn release_event(&self, event: EventId) -> Result<(), BackendError> {
        self.seen(self.backend.release_event(event), |_| {
            Call::ReleaseEvent(event)
        })
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        self.seen(self.backend.synchronize(stream), |_| {
            Call::Synchronize(stream)
        })
    }
    fn write(&self, at: DevAddr, data: &[u8]) -> Result<(), BackendError> {
        self.backend.write(at, data)
    }
    fn read(&self, at: DevAddr, out: &mut [u8]) -> Result<(), BackendError> {
        self.backend.read(at, out)
    }
    fn calls(&self) -> CallCounts {
        self.backend.calls()
    }
    fn live(&self) -> LiveResources {
        self.backend.live()
    }
}

impl<B: EmulatedBackend, O: Observer + Clone + Default + 'static> EmulatedBackend
    for Observed<B, O>
{
    fn with_capacity(capacity: usize) -> Result<Self, BackendError> {
        Ok(Self::with_observer(
            B::with_capacity(capacity)?,
            O::default(),
        ))
    }
    fn set_faults(&self, plan: FaultPlan) {
        self.backend.set_faults(plan)
    }
    fn clear_faults(&self) -> u64 {
        self.backend.clear_faults()
    }
    fn faults_fired(&self) -> u64 {
        self.backend.faults_fired()
    }
    fn hold_stream(&self, stream: StreamId) {
        self.backend.hold_stream(stream)
    }
    fn release_stream(&self, stream: StreamId) {
        self.backend.release_stream(stream)
    }
    fn stream_generation(&self, stream: StreamId) -> u64 {
        self.backend.stream_generation(stream)
    }
    fn complete_event(&self, event: EventId) -> bool {
        self.backend.complete_event(event)
    }
    fn pending_events(&self, stream: StreamId) -> usize {
        self.backend.pending_events(stream)
    }
    fn capacity(&self) -> usize {
        self.backend.capacity()
    }
}

/// One call that matters to "no unmap under running work", in call order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Seen {
    /// A stream was synchronized.
    Sync(StreamId),
    /// `[at, at + len)` was unmapped.
    Unmap {
        /// Start address.
        at: u64,
        /// Length.
        len: usize,
    },
}

/// What a [`MappingLog`] has seen.
#[derive(Clone, Default, Debug)]
pub struct MappingState {
    /// Start -> length of every mapping the backend holds.
    pub mapped: BTreeMap<u64, usize>,
    /// Synchronizes and unmaps, in call order, since a test last drained them.
    pub seen: Vec<Seen>,
}

impl MappingState {
    /// Whether `[at, at + len)` lies in contiguous backend mappings.
    pub fn covers(&self, at: u64, len: usize) -> bool {
        let end = at + len as u64;
        let mut cursor = at;
        let first = self.mapped.range(..=at).next_back();
        for (&s, &l) in first.into_iter().chain(self.mapped.range(at + 1..end)) {
            if s > cursor {
                return false;
            }
            cursor = cursor.max(s + l as u64);
            if cursor >= end {
                return true;
            }
        }
        cursor >= end
    }
}

/// An [`Observer`] that keeps the backend's mappings and the unmaps and synchronizes in order.
/// Clones share one log.
#[derive(Clone, Default, Debug)]
pub struct MappingLog {
    state: Arc<Mutex<MappingState>>,
}

impl MappingLog {
    /// The log, locked (a test that panicked while holding it does not poison it for others).
    pub fn lock(&self) -> MutexGuard<'_, MappingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Observer for MappingLog {
    fn observe(&self, call: Call<'_>) {
        let mut log = self.lock();
        match call {
            Call::Map { at, len, .. } => {
                log.mapped.insert(at.get(), len);
            }
            Call::Unmap { at, len } => {
                let range = at.get()..at.get() + len as u64;
                let gone: Vec<u64> = log.mapped.range(range).map(|(&s, _)| s).collect();
                for s in gone {
                    log.mapped.remove(&s);
                }
                log.seen.push(Seen::Unmap { at: at.get(), len });
            }
            Call::Synchronize(stream) => log.seen.push(Seen::Sync(stream)),
            _ => {}
        }
    }
}
