//! The raw device layer: what each backend does once the rule checker has accepted a call.
//!
//! Implementations hold no policy and check no rules: [`super::checked::Checked`] validates every
//! call against the ledger first, so a raw call only ever sees aligned, in-reservation,
//! non-overlapping arguments and handles it created itself. Raw handle and event values never
//! leave the crate; users see the ledger's numbers.

use crate::backend::error::BackendErrorKind;
use crate::backend::{Access, MemInfo, StreamId};

/// A raw physical handle value (the driver's `CUmemGenericAllocationHandle`, a pool offset on Host).
pub(crate) type RawHandle = u64;
/// A raw event value (an index into the raw layer's own event table).
pub(crate) type RawEvent = u64;

pub(crate) type RawResult<T> = Result<T, BackendErrorKind>;

pub(crate) trait RawDevice: Send {
    /// "sim", "host" or "cuda".
    const NAME: &'static str;

    fn granularity(&self) -> usize;
    fn ordinal(&self) -> u32;
    fn device_count(&self) -> u32;
    /// Physical capacity the ledger enforces, or `None` when the device itself decides (Cuda).
    fn capacity(&self) -> Option<usize>;
    /// Whether `write`/`read` move real bytes.
    fn has_bytes(&self) -> bool;

    fn reserve(&mut self, len: usize) -> RawResult<u64>;
    fn free_reservation(&mut self, base: u64, len: usize) -> RawResult<()>;
    fn create(&mut self, len: usize) -> RawResult<RawHandle>;
    /// The user released the handle. Memory still mapped stays alive until `memory_gone`.
    fn release(&mut self, handle: RawHandle) -> RawResult<()>;
    /// The handle is released and no longer mapped anywhere: its memory may go (Host punches a
    /// hole in its pool). Infallible by design: nothing can be done about a failure here.
    fn memory_gone(&mut self, _handle: RawHandle, _len: usize) {}
    fn map(&mut self, at: u64, len: usize, handle: RawHandle, offset: usize) -> RawResult<()>;
    fn unmap(&mut self, at: u64, len: usize) -> RawResult<()>;
    fn set_access(&mut self, at: u64, len: usize, access: &[Access]) -> RawResult<()>;
    /// `None` when the ledger's capacity accounting is the answer (Sim, Host).
    fn mem_info(&mut self) -> RawResult<Option<MemInfo>>;

    /// Whether `stream` may be used (Cuda: registered, or the default stream).
    fn knows_stream(&self, stream: StreamId) -> bool;
    fn record_event(&mut self, stream: StreamId) -> RawResult<RawEvent>;
    fn query_event(&mut self, event: RawEvent) -> RawResult<bool>;
    fn release_event(&mut self, event: RawEvent) -> RawResult<()>;
    fn synchronize(&mut self, stream: StreamId) -> RawResult<()>;

    /// Copies into mapped, writable memory (only called when `has_bytes`).
    fn write(&mut self, at: u64, data: &[u8]) -> RawResult<()>;
    /// Copies out of mapped, readable memory (only called when `has_bytes`).
    fn read(&mut self, at: u64, out: &mut [u8]) -> RawResult<()>;
}
