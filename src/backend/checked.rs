//! `Checked<R>`: one implementation of [`Backend`] for every raw device.
//!
//! Every call goes: count it → consult the fault plan → validate against the ledger → do it on
//! the raw device → record it in the ledger. Only the last two steps change state, and the last
//! cannot fail, so a call that fails anywhere leaves the backend as it was. The lock is held for
//! the whole call, so two threads cannot both pass validation for the same range.

use parking_lot::Mutex;

use crate::backend::error::{BackendError, BackendErrorKind as E};
use crate::backend::fault::{FaultError, FaultPlan};
use crate::backend::ledger::Ledger;
use crate::backend::raw::{RawDevice, RawEvent};
use crate::backend::{
    Access, Backend, CallCounts, CallKind, Capabilities, EventId, LiveResources, MemInfo,
    PhysHandle, Protection, StreamId,
};
use crate::units::{DevAddr, VaRange};

pub(crate) struct Checked<R: RawDevice> {
    granularity: usize,
    device: u32,
    device_count: u32,
    capabilities: Capabilities,
    state: Mutex<State<R>>,
}

struct State<R> {
    ledger: Ledger,
    raw: R,
    calls: CallCounts,
    faults: FaultPlan,
}

impl<R: RawDevice> Checked<R> {
    pub(crate) fn new(raw: R, capabilities: Capabilities) -> Self {
        let ledger = Ledger::new(
            raw.granularity(),
            raw.ordinal(),
            raw.device_count(),
            raw.capacity(),
        );
        Self {
            granularity: raw.granularity(),
            device: raw.ordinal(),
            device_count: raw.device_count(),
            capabilities,
            state: Mutex::new(State {
                ledger,
                raw,
                calls: CallCounts::default(),
                faults: FaultPlan::new(),
            }),
        }
    }

    /// Runs one call of `kind`: counts it, injects a planned fault, and tags any error with `kind`.
    /// `requested` is the call's length argument (0 for calls without one): what an injected
    /// out-of-memory error says was asked for.
    fn call<T>(
        &self,
        kind: CallKind,
        requested: usize,
        body: impl FnOnce(&mut State<R>) -> Result<T, E>,
    ) -> Result<T, BackendError> {
        let mut state = self.state.lock();
        state.calls.count_call(kind);
        let result = match state.faults.on_call(kind) {
            Some(fault) => Err(state.injected(fault, kind, requested)),
            None => body(&mut state),
        };
        result.map_err(|e| {
            state.calls.count_failure(kind);
            BackendError::new(kind, e)
        })
    }

    /// Gives the raw device to `f` (for backend-specific extras such as held events).
    pub(crate) fn with_raw<T>(&self, f: impl FnOnce(&mut R) -> T) -> T {
        f(&mut self.state.lock().raw)
    }

    /// The raw event behind `event`, if it is live.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub(crate) fn raw_event(&self, event: EventId) -> Option<RawEvent> {
        self.state
            .lock()
            .ledger
            .live_event(event)
            .ok()
            .map(|e| e.raw)
    }

    /// Installs a fault plan, replacing the previous one; returns the previous one.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub(crate) fn set_faults(&self, plan: FaultPlan) -> FaultPlan {
        std::mem::replace(&mut self.state.lock().faults, plan)
    }

    /// Faults injected by the current plan.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub(crate) fn faults_fired(&self) -> u64 {
        self.state.lock().faults.fired()
    }

    /// The physical memory the device hands out (0 where the driver does not say).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub(crate) fn capacity(&self) -> usize {
        self.state.lock().ledger.capacity().unwrap_or(0)
    }
}

impl<R: RawDevice> State<R> {
    fn injected(&self, fault: FaultError, kind: CallKind, requested: usize) -> E {
        match (fault, kind) {
            (FaultError::OutOfMemory, CallKind::Reserve) => E::AddressSpaceExhausted { requested },
            (FaultError::OutOfMemory, _) => {
                let total = self.ledger.capacity().unwrap_or(0);
                E::OutOfMemory {
                    requested,
                    free: total.saturating_sub(self.ledger.physical_bytes()),
                    total,
                }
            }
            (FaultError::Injected, _) => E::Injected,
        }
    }

    fn bytes_supported(&self) -> Result<(), E> {
        if self.raw.has_bytes() {
            Ok(())
        } else {
            Err(E::Unsupported("moving bytes (this backend has no memory)"))
        }
    }
}

impl<R: RawDevice> Backend for Checked<R> {
    fn name(&self) -> &'static str {
        R::NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn device(&self) -> u32 {
        self.device
    }

    fn device_count(&self) -> u32 {
        self.device_count
    }

    fn reserve(&self, len: usize) -> Result<VaRange, BackendError> {
        self.call(CallKind::Reserve, len, |s| {
            s.ledger.check_len(len)?;
            let base = s.raw.reserve(len)?;
            s.ledger.apply_reserve(base, len);
            Ok(VaRange {
                start: DevAddr::new(base),
                len,
            })
        })
    }

    fn free_reservation(&self, range: VaRange) -> Result<(), BackendError> {
        self.call(CallKind::FreeReservation, 0, |s| {
            s.ledger.check_free_reservation(range)?;
            s.raw.free_reservation(range.start.get(), range.len)?;
            s.ledger.apply_free_reservation(range);
            Ok(())
        })
    }

    fn create(&self, len: usize) -> Result<PhysHandle, BackendError> {
        self.call(CallKind::Create, len, |s| {
            s.ledger.check_create(len)?;
            let raw = s.raw.create(len)?;
            Ok(s.ledger.apply_create(raw, len))
        })
    }

    fn release(&self, handle: PhysHandle) -> Result<(), BackendError> {
        self.call(CallKind::Release, 0, |s| {
            let entry = s.ledger.live_handle(handle)?;
            s.raw.release(entry.raw)?;
            if let Some((raw, len)) = s.ledger.apply_release(handle) {
                s.raw.memory_gone(raw, len);
            }
            Ok(())
        })
    }

    fn map(
        &self,
        at: DevAddr,
        len: usize,
        handle: PhysHandle,
        offset: usize,
    ) -> Result<(), BackendError> {
        self.call(CallKind::Map, len, |s| {
            let raw = s.ledger.check_map(at, len, handle, offset)?;
            s.raw.map(at.get(), len, raw, offset)?;
            s.ledger.apply_map(at, len, handle);
            Ok(())
        })
    }

    fn unmap(&self, at: DevAddr, len: usize) -> Result<(), BackendError> {
        self.call(CallKind::Unmap, len, |s| {
            let starts = s.ledger.check_unmap(at, len)?;
            s.raw.unmap(at.get(), len)?;
            for (raw, len) in s.ledger.apply_unmap(starts) {
                s.raw.memory_gone(raw, len);
            }
            Ok(())
        })
    }

    fn set_access(&self, at: DevAddr, len: usize, access: &[Access]) -> Result<(), BackendError> {
        self.call(CallKind::SetAccess, len, |s| {
            let starts = s.ledger.check_set_access(at, len, access)?;
            s.raw.set_access(at.get(), len, access)?;
            s.ledger.apply_set_access(starts, access);
            Ok(())
        })
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.call(CallKind::MemInfo, 0, |s| {
            if let Some(info) = s.raw.mem_info()? {
                return Ok(info);
            }
            let total = s.ledger.capacity().unwrap_or(0);
            Ok(MemInfo {
                free: total.saturating_sub(s.ledger.physical_bytes()),
                total,
            })
        })
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.call(CallKind::RecordEvent, 0, |s| {
            s.ledger.stream_check(s.raw.knows_stream(stream), stream)?;
            let raw = s.raw.record_event(stream)?;
            Ok(s.ledger.apply_record_event(raw))
        })
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.call(CallKind::QueryEvent, 0, |s| {
            let entry = s.ledger.live_event(event)?;
            s.raw.query_event(entry.raw)
        })
    }

    fn release_event(&self, event: EventId) -> Result<(), BackendError> {
        self.call(CallKind::ReleaseEvent, 0, |s| {
            let entry = s.ledger.live_event(event)?;
            s.raw.release_event(entry.raw)?;
            s.ledger.apply_release_event(event);
            Ok(())
        })
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        self.call(CallKind::Synchronize, 0, |s| {
            s.ledger.stream_check(s.raw.knows_stream(stream), stream)?;
            s.raw.synchronize(stream)
        })
    }

    fn write(&self, at: DevAddr, data: &[u8]) -> Result<(), BackendError> {
        self.call(CallKind::Write, 0, |s| {
            s.bytes_supported()?;
            s.ledger
                .check_bytes(at, data.len(), Protection::ReadWrite)?;
            if data.is_empty() {
                return Ok(());
            }
            s.raw.write(at.get(), data)
        })
    }

    fn read(&self, at: DevAddr, out: &mut [u8]) -> Result<(), BackendError> {
        self.call(CallKind::Read, 0, |s| {
            s.bytes_supported()?;
            s.ledger.check_bytes(at, out.len(), Protection::Read)?;
            if out.is_empty() {
                return Ok(());
            }
            s.raw.read(at.get(), out)
        })
    }

    fn calls(&self) -> CallCounts {
        self.state.lock().calls
    }

    fn live(&self) -> LiveResources {
        self.state.lock().ledger.live()
    }
}

impl<R: RawDevice> Drop for Checked<R> {
    /// Gives back whatever a caller leaked, so dropping a backend never strands device memory or
    /// address space. Errors are ignored: there is no one left to report them to, and the driver
    /// frees everything at context teardown anyway.
    fn drop(&mut self) {
        let state = self.state.get_mut();
        let left = state.ledger.leftovers();
        for (at, len) in left.mappings {
            let _ = state.raw.unmap(at, len);
        }
        for (raw, len, released) in left.handles {
            if !released {
                let _ = state.raw.release(raw);
            }
            state.raw.memory_gone(raw, len);
        }
        for (base, len) in left.reservations {
            let _ = state.raw.free_reservation(base, len);
        }
        for event in left.events {
            let _ = state.raw.release_event(event);
        }
    }
}
