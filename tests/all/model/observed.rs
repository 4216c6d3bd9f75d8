//! A backend wrapper that watches what the allocator does to the device: which ranges are mapped
//! (so the model checks containment against the backend's view, not the allocator's own map) and,
//! in order, every synchronize and unmap (so the model can tell whether a page was unmapped while
//! its stream's work might still use it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use vmm_alloc::backend::{
    Access, Backend, CallCounts, Capabilities, EventId, HostBackend, LiveResources, MemInfo,
    PhysHandle, SimBackend,
};
use vmm_alloc::{BackendError, DevAddr, StreamId, VaRange};

/// The test controls of the emulated backends that the model drives.
pub trait Controls: Backend + Clone + 'static {
    fn hold(&self, s: StreamId);
    fn unhold(&self, s: StreamId);
    fn generation(&self, s: StreamId) -> u64;
}

macro_rules! controls {
    ($ty:ty) => {
        impl Controls for $ty {
            fn hold(&self, s: StreamId) {
                self.hold_stream(s)
            }
            fn unhold(&self, s: StreamId) {
                self.release_stream(s)
            }
            fn generation(&self, s: StreamId) -> u64 {
                self.stream_generation(s)
            }
        }
    };
}
controls!(SimBackend);
controls!(HostBackend);

/// One device call that matters to the "no unmap under running work" rule, in call order.
#[derive(Clone, Copy, Debug)]
pub enum Seen {
    Sync(StreamId),
    Unmap { at: u64, len: usize },
}

#[derive(Default)]
pub struct Log {
    /// start -> length of every mapping the backend holds.
    pub mapped: BTreeMap<u64, usize>,
    /// Synchronizes and unmaps since the model last drained them.
    pub seen: Vec<Seen>,
}

impl Log {
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

#[derive(Clone)]
pub struct Observed<B> {
    pub inner: B,
    log: Arc<Mutex<Log>>,
}

impl<B: Controls> Observed<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            log: Arc::default(),
        }
    }

    pub fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: Backend> Backend for Observed<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn granularity(&self) -> usize {
        self.inner.granularity()
    }
    fn device(&self) -> u32 {
        self.inner.device()
    }
    fn device_count(&self) -> u32 {
        self.inner.device_count()
    }
    fn reserve(&self, len: usize) -> Result<VaRange, BackendError> {
        self.inner.reserve(len)
    }
    fn free_reservation(&self, range: VaRange) -> Result<(), BackendError> {
        self.inner.free_reservation(range)
    }
    fn create(&self, len: usize) -> Result<PhysHandle, BackendError> {
        self.inner.create(len)
    }
    fn release(&self, handle: PhysHandle) -> Result<(), BackendError> {
        self.inner.release(handle)
    }
    fn map(&self, at: DevAddr, len: usize, h: PhysHandle, off: usize) -> Result<(), BackendError> {
        self.inner.map(at, len, h, off)?;
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.mapped.insert(at.get(), len);
        Ok(())
    }
    fn unmap(&self, at: DevAddr, len: usize) -> Result<(), BackendError> {
        self.inner.unmap(at, len)?;
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<u64> = log
            .mapped
            .range(at.get()..at.get() + len as u64)
            .map(|(&s, _)| s)
            .collect();
        for s in gone {
            log.mapped.remove(&s);
        }
        log.seen.push(Seen::Unmap { at: at.get(), len });
        Ok(())
    }
    fn set_access(&self, at: DevAddr, len: usize, access: &[Access]) -> Result<(), BackendError> {
        self.inner.set_access(at, len, access)
    }
    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.inner.mem_info()
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.inner.record_event(stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.inner.query_event(event)
    }
    fn release_event(&self, event: EventId) -> Result<(), BackendError> {
        self.inner.release_event(event)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        self.inner.synchronize(stream)?;
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.seen.push(Seen::Sync(stream));
        Ok(())
    }
    fn write(&self, at: DevAddr, data: &[u8]) -> Result<(), BackendError> {
        self.inner.write(at, data)
    }
    fn read(&self, at: DevAddr, out: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read(at, out)
    }
    fn calls(&self) -> CallCounts {
        self.inner.calls()
    }
    fn live(&self) -> LiveResources {
        self.inner.live()
    }
}
