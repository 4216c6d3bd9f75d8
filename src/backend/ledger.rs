//! The rule checker and leak ledger every backend runs its calls through.
//!
//! Each `check_*` method is pure: it validates a call against the current state and returns the
//! error naming the broken rule, or what the call will touch. Each `apply_*` method records a call
//! that the raw device carried out, and cannot fail. A backend call is therefore
//! check → raw call → apply, and any failure leaves the ledger exactly as it was.
//!
//! Invariants (checked by the tests through `LiveResources`):
//! * reservations never overlap; every mapping lies inside exactly one reservation;
//! * mappings never overlap; `mapped_bytes == Σ mapping.len`;
//! * `handle.mappings == |{m : m.handle == handle}|`; a handle that is released and unmapped is
//!   gone from `handles`;
//! * `physical_bytes == Σ handle.len` over `handles` (released-but-mapped handles included);
//! * `ever_mapped` holds disjoint, non-adjacent ranges, each inside one live reservation, whose
//!   union covers every mapping.

use std::collections::BTreeMap;
use std::ops::Range;

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::error::BackendErrorKind as E;
use crate::backend::raw::{RawEvent, RawHandle};
use crate::backend::{Access, EventId, LiveResources, PhysHandle, Protection, StreamId};
use crate::units::{DevAddr, VaRange};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Mapping {
    pub(crate) len: usize,
    pub(crate) handle: u64,
    /// Access of the backend's own device (what `read`/`write` are allowed to do).
    pub(crate) protection: Protection,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct HandleEntry {
    pub(crate) raw: RawHandle,
    pub(crate) len: usize,
    pub(crate) mappings: usize,
    pub(crate) released: bool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct EventEntry {
    pub(crate) raw: RawEvent,
}

/// Handle and event ids carry their backend's tag in the top 16 bits, so an id from another
/// backend is rejected even when its number is one this backend also handed out.
const TAG_SHIFT: u32 = 48;
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

/// What an `apply_*` call says must happen to physical memory afterwards.
pub(crate) type Gone = Option<(RawHandle, usize)>;

#[derive(Debug)]
pub(crate) struct Ledger {
    granularity: usize,
    devices: u32,
    own_device: u32,
    capacity: Option<usize>,
    reservations: BTreeMap<u64, usize>,
    mappings: BTreeMap<u64, Mapping>,
    /// start -> len of the address ranges that have been mapped since their reservation was made,
    /// merged: what tells a double unmap (nothing mapped now, but something was) from an unmap of a
    /// range that was never mapped. Cleared with the reservation, so it never outgrows the live
    /// reservations: at most one entry per run of mapped-at-some-point granules.
    ever_mapped: BTreeMap<u64, usize>,
    handles: FxHashMap<u64, HandleEntry>,
    /// This ledger's tag, in the top bits of every id it hands out.
    tag: u64,
    next_handle: u64,
    events: FxHashMap<u64, EventEntry>,
    next_event: u64,
    physical_bytes: usize,
    mapped_bytes: usize,
    reserved_va_bytes: usize,
}

impl Ledger {
    pub(crate) fn new(
        granularity: usize,
        own_device: u32,
        devices: u32,
        capacity: Option<usize>,
    ) -> Self {
        Self {
            granularity,
            devices,
            own_device,
            capacity,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            ever_mapped: BTreeMap::new(),
            handles: FxHashMap::default(),
            tag: (NEXT_TAG.fetch_add(1, Ordering::Relaxed) % 0xFFFF + 1) << TAG_SHIFT,
            next_handle: 1,
            events: FxHashMap::default(),
            next_event: 1,
            physical_bytes: 0,
            mapped_bytes: 0,
            reserved_va_bytes: 0,
        }
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    pub(crate) fn physical_bytes(&self) -> usize {
        self.physical_bytes
    }

    pub(crate) fn live(&self) -> LiveResources {
        LiveResources {
            reservations: self.reservations.len(),
            reserved_va_bytes: self.reserved_va_bytes,
            mappings: self.mappings.len(),
            mapped_bytes: self.mapped_bytes,
            handles: self.handles.values().filter(|h| !h.released).count(),
            physical_bytes: self.physical_bytes,
            events: self.events.len(),
        }
    }

    // ---- argument rules -------------------------------------------------------------------

    pub(crate) fn check_len(&self, len: usize) -> Result<(), E> {
        if len == 0 || !len.is_multiple_of(self.granularity) {
            return Err(E::BadLength {
                len,
                granularity: self.granularity,
            });
        }
        Ok(())
    }

    fn check_aligned(&self, what: &'static str, value: u64) -> Result<(), E> {
        if !value.is_multiple_of(self.granularity as u64) {
            return Err(E::Misaligned {
                what,
                value,
                granularity: self.granularity,
            });
        }
        Ok(())
    }

    /// `at + len` as a raw end address, or the overflow error.
    fn end_of(at: DevAddr, len: usize) -> Result<u64, E> {
        at.checked_add(len)
            .map(DevAddr::get)
            .ok_or(E::RangeOverflow { addr: at, len })
    }

    // ---- reservations ---------------------------------------------------------------------

    pub(crate) fn apply_reserve(&mut self, base: u64, len: usize) {
        self.reservations.insert(base, len);
        self.reserved_va_bytes += len;
    }

    pub(crate) fn check_free_reservation(&self, range: VaRange) -> Result<(), E> {
        let unknown = E::UnknownReservation {
            addr: range.start,
            len: range.len,
        };
        if self.reservations.get(&range.start.get()) != Some(&range.len) {
            return Err(unknown);
        }
        let end = Self::end_of(range.start, range.len)?;
        let inside = self.mappings.range(range.start.get()..end).count();
        if inside > 0 {
            return Err(E::ReservationStillMapped {
                addr: range.start,
                mappings: inside,
            });
        }
        Ok(())
    }

    pub(crate) fn apply_free_reservation(&mut self, range: VaRange) {
        if self.reservations.remove(&range.start.get()).is_some() {
            self.reserved_va_bytes -= range.len;
            // The address range may be reserved again; there, nothing has been mapped yet.
            self.forget_ever_mapped(range.start.get(), range.start.get() + range.len as u64);
        }
    }

    /// Removes `[at, end)` from `ever_mapped`, cutting ranges that stick out of it.
    fn forget_ever_mapped(&mut self, at: u64, end: u64) {
        let before = self
            .ever_mapped
            .range(..at)
            .next_back()
            .filter(|&(&s, &l)| s + l as u64 > at);
        let cut: Vec<(u64, u64)> = before
            .into_iter()
            .chain(self.ever_mapped.range(at..end))
            .map(|(&s, &l)| (s, s + l as u64))
            .collect();
        for (s, e) in cut {
            self.ever_mapped.remove(&s);
            if s < at {
                self.ever_mapped.insert(s, (at - s) as usize);
            }
            if e > end {
                self.ever_mapped.insert(end, (e - end) as usize);
            }
        }
    }

    /// Adds `[at, end)` to `ever_mapped`, merged with the ranges it overlaps or touches.
    fn remember_mapped(&mut self, at: u64, end: u64) {
        // A range mapped again (what remapping does on a full device) is already covered: one
        // search, no merge. Ranges never touch, so a covering one leaves nothing to merge.
        let covering = self.ever_mapped.range(..=at).next_back();
        if covering.is_some_and(|(&s, &l)| s + l as u64 >= end) {
            return;
        }
        let (mut start, mut stop) = (at, end);
        let before = self
            .ever_mapped
            .range(..at)
            .next_back()
            .filter(|&(&s, &l)| s + l as u64 >= at);
        let merged: Vec<(u64, u64)> = before
            .into_iter()
            .chain(self.ever_mapped.range(at..=end))
            .map(|(&s, &l)| (s, s + l as u64))
            .collect();
        for (s, e) in merged {
            self.ever_mapped.remove(&s);
            start = start.min(s);
            stop = stop.max(e);
        }
        self.ever_mapped.insert(start, (stop - start) as usize);
    }

    // ---- handles --------------------------------------------------------------------------

    pub(crate) fn check_create(&self, len: usize) -> Result<(), E> {
        self.check_len(len)?;
        if let Some(total) = self.capacity {
            let free = total.saturating_sub(self.physical_bytes);
            if len > free {
                return Err(E::OutOfMemory {
                    requested: len,
                    free,
                    total,
                });
            }
        }
        Ok(())
    }

    /// This ledger's id for counter value `n`, and back.
    fn id(&self, n: u64) -> u64 {
        self.tag | n
    }

    fn counter(&self, id: u64) -> Option<u64> {
        (id & !((1 << TAG_SHIFT) - 1) == self.tag).then_some(id & ((1 << TAG_SHIFT) - 1))
    }

    pub(crate) fn apply_create(&mut self, raw: RawHandle, len: usize) -> PhysHandle {
        let id = self.id(self.next_handle);
        self.next_handle += 1;
        self.handles.insert(
            id,
            HandleEntry {
                raw,
                len,
                mappings: 0,
                released: false,
            },
        );
        self.physical_bytes += len;
        PhysHandle(id)
    }

    /// The live (unreleased) handle behind `handle`, or why it is not usable.
    pub(crate) fn live_handle(&self, handle: PhysHandle) -> Result<HandleEntry, E> {
        let Some(n) = self.counter(handle.0) else {
            return Err(E::UnknownHandle(handle));
        };
        match self.handles.get(&handle.0) {
            Some(entry) if !entry.released => Ok(*entry),
            Some(_) => Err(E::HandleAlreadyReleased(handle)),
            // Ids are handed out in order, so an id below the counter was live once.
            None if n >= 1 && n < self.next_handle => Err(E::HandleAlreadyReleased(handle)),
            None => Err(E::UnknownHandle(handle)),
        }
    }

    /// Marks `handle` released; returns its memory if no mapping keeps it alive.
    pub(crate) fn apply_release(&mut self, handle: PhysHandle) -> Gone {
        let entry = self.handles.get_mut(&handle.0)?;
        entry.released = true;
        self.drop_if_gone(handle.0)
    }

    fn drop_if_gone(&mut self, id: u64) -> Gone {
        Self::drop_handle_if_gone(&mut self.handles, &mut self.physical_bytes, id)
    }

    /// `drop_if_gone` on the two fields it changes, for a caller that holds another field.
    fn drop_handle_if_gone(
        handles: &mut FxHashMap<u64, HandleEntry>,
        physical_bytes: &mut usize,
        id: u64,
    ) -> Gone {
        let entry = *handles.get(&id)?;
        if entry.released && entry.mappings == 0 {
            handles.remove(&id);
            *physical_bytes -= entry.len;
            return Some((entry.raw, entry.len));
        }
        None
    }

    // ---- mappings -------------------------------------------------------------------------

    /// Validates a map call; returns the raw handle to map.
    pub(crate) fn check_map(
        &self,
        at: DevAddr,
        len: usize,
        handle: PhysHandle,
        offset: usize,
    ) -> Result<RawHandle, E> {
        self.check_len(len)?;
        self.check_aligned("address", at.get())?;
        self.check_aligned("offset", offset as u64)?;
        let end = Self::end_of(at, len)?;
        let inside = self
            .reservations
            .range(..=at.get())
            .next_back()
            .is_some_and(|(&base, &rlen)| {
                base.checked_add(rlen as u64)
                    .is_some_and(|rend| end <= rend)
            });
        if !inside {
            return Err(E::NotReserved { addr: at, len });
        }
        let entry = self.live_handle(handle)?;
        if offset.checked_add(len).is_none_or(|o| o > entry.len) {
            return Err(E::PastHandleEnd {
                offset,
                len,
                handle_size: entry.len,
            });
        }
        // CUDA's rule, not ours: `cuMemMap`'s offset "must be zero" and the driver refuses a
        // mapping shorter than the handle (CUDA_ERROR_NOT_SUPPORTED, measured on an H100).
        if offset != 0 || len != entry.len {
            return Err(E::PartialHandle {
                offset,
                len,
                handle_size: entry.len,
            });
        }
        if let Some((&start, m)) = self.mappings.range(..end).next_back() {
            if start + m.len as u64 > at.get() {
                return Err(E::AlreadyMapped {
                    addr: at,
                    len,
                    existing: DevAddr::new(start),
                });
            }
        }
        Ok(entry.raw)
    }

    pub(crate) fn apply_map(&mut self, at: DevAddr, len: usize, handle: PhysHandle) {
        self.mappings.insert(
            at.get(),
            Mapping {
                len,
                handle: handle.0,
                protection: Protection::None,
            },
        );
        self.mapped_bytes += len;
        if let Some(entry) = self.handles.get_mut(&handle.0) {
            entry.mappings += 1;
        }
        self.remember_mapped(at.get(), at.get() + len as u64);
    }

    /// Checks that mappings exactly tile `[at, at + len)`; returns that range, for the `apply_*`
    /// call to walk (no list of starts: a map or unmap per remapped page on a full device is the
    /// Sim's busiest path, and one allocation per call was a tenth of its cost).
    fn whole_mappings(&self, at: DevAddr, len: usize) -> Result<Range<u64>, E> {
        let end = Self::end_of(at, len)?;
        let partial = E::PartialMapping { addr: at, len };
        let mut cursor = at.get();
        for (&start, m) in self.mappings.range(at.get()..end) {
            if start != cursor {
                return Err(partial);
            }
            cursor = start + m.len as u64;
        }
        if cursor != end {
            return Err(partial);
        }
        Ok(at.get()..end)
    }

    /// Whether any of the disjoint ranges in `ranges` (start -> value, `len_of` its length)
    /// overlaps `[at, end)`: only the last one starting before `end` can.
    fn overlaps<V>(ranges: &BTreeMap<u64, V>, len_of: fn(&V) -> usize, at: u64, end: u64) -> bool {
        ranges
            .range(..end)
            .next_back()
            .is_some_and(|(&start, v)| start + len_of(v) as u64 > at)
    }

    /// Validates an unmap call; returns the range whose mappings go (`apply_unmap`).
    pub(crate) fn check_unmap(&self, at: DevAddr, len: usize) -> Result<Range<u64>, E> {
        self.check_len(len)?;
        self.check_aligned("address", at.get())?;
        let end = Self::end_of(at, len)?;
        // Exactly tiled (the usual case) implies overlapped: the overlap search runs only to
        // name the error, with the same precedence as before.
        let tiled = self.whole_mappings(at, len);
        if tiled.is_err() && !Self::overlaps(&self.mappings, |m| m.len, at.get(), end) {
            // CUDA accepts both; telling them apart points the caller at the right bug.
            return Err(
                if Self::overlaps(&self.ever_mapped, |&l| l, at.get(), end) {
                    E::DoubleUnmap { addr: at, len }
                } else {
                    E::NotMapped { addr: at, len }
                },
            );
        }
        tiled
    }

    /// Removes the mappings in `range` (from `check_unmap`); returns the handles whose memory is
    /// now gone.
    pub(crate) fn apply_unmap(&mut self, range: Range<u64>) -> Vec<(RawHandle, usize)> {
        let mut gone = Vec::new();
        // The mappings tile the range (checked): every mapping that starts in it goes, removed
        // in one walk of the tree (a search per mapping was half of an unmap's cost).
        let Self {
            mappings,
            handles,
            mapped_bytes,
            physical_bytes,
            ..
        } = self;
        for (_, m) in mappings.extract_if(range, |_, _| true) {
            *mapped_bytes -= m.len;
            if let Some(entry) = handles.get_mut(&m.handle) {
                entry.mappings -= 1;
            }
            gone.extend(Self::drop_handle_if_gone(handles, physical_bytes, m.handle));
        }
        gone
    }

    pub(crate) fn check_set_access(
        &self,
        at: DevAddr,
        len: usize,
        access: &[Access],
    ) -> Result<Range<u64>, E> {
        if access.is_empty() {
            return Err(E::EmptyAccessList);
        }
        for (i, a) in access.iter().enumerate() {
            if a.device >= self.devices || access[..i].iter().any(|b| b.device == a.device) {
                return Err(E::BadDevice {
                    ordinal: a.device,
                    devices: self.devices,
                });
            }
        }
        self.check_len(len)?;
        self.check_aligned("address", at.get())?;
        self.whole_mappings(at, len)
    }

    /// Sets the protection of the mappings in `range` (from `check_set_access`).
    pub(crate) fn apply_set_access(&mut self, range: Range<u64>, access: &[Access]) {
        let Some(own) = access.iter().find(|a| a.device == self.own_device) else {
            return;
        };
        for (_, m) in self.mappings.range_mut(range) {
            m.protection = own.protection;
        }
    }

    /// Checks that `[at, at + len)` lies in contiguous mappings that allow `needed`.
    pub(crate) fn check_bytes(&self, at: DevAddr, len: usize, needed: Protection) -> Result<(), E> {
        let end = Self::end_of(at, len)?;
        if len == 0 {
            return Ok(());
        }
        let partial = E::PartialMapping { addr: at, len };
        let mut cursor = at.get();
        // The mapping holding `at` may start before it.
        let first = self.mappings.range(..=at.get()).next_back();
        let rest = self.mappings.range(at.get() + 1..end);
        for (&start, m) in first.into_iter().chain(rest) {
            let m_end = start + m.len as u64;
            if m_end <= cursor {
                continue;
            }
            if start > cursor {
                return Err(partial);
            }
            if m.protection < needed {
                return Err(E::NoAccess {
                    addr: DevAddr::new(cursor),
                    needed: if needed == Protection::ReadWrite {
                        "read-write"
                    } else {
                        "read"
                    },
                });
            }
            cursor = m_end;
            if cursor >= end {
                return Ok(());
            }
        }
        Err(partial)
    }

    // ---- events ---------------------------------------------------------------------------

    pub(crate) fn apply_record_event(&mut self, raw: RawEvent) -> EventId {
        let id = self.id(self.next_event);
        self.next_event += 1;
        self.events.insert(id, EventEntry { raw });
        EventId(id)
    }

    pub(crate) fn live_event(&self, event: EventId) -> Result<EventEntry, E> {
        let Some(n) = self.counter(event.0) else {
            return Err(E::UnknownEvent(event));
        };
        match self.events.get(&event.0) {
            Some(entry) => Ok(*entry),
            None if n >= 1 && n < self.next_event => Err(E::EventAlreadyReleased(event)),
            None => Err(E::UnknownEvent(event)),
        }
    }

    pub(crate) fn apply_release_event(&mut self, event: EventId) {
        self.events.remove(&event.0);
    }

    // ---- teardown -------------------------------------------------------------------------

    /// Everything still held, for a backend's `Drop` to give back: mappings, then handles,
    /// reservations and events.
    pub(crate) fn leftovers(&self) -> Leftovers {
        Leftovers {
            mappings: self.mappings.iter().map(|(&a, m)| (a, m.len)).collect(),
            handles: self
                .handles
                .values()
                .map(|h| (h.raw, h.len, h.released))
                .collect(),
            reservations: self.reservations.iter().map(|(&b, &l)| (b, l)).collect(),
            events: self.events.values().map(|e| e.raw).collect(),
        }
    }

    pub(crate) fn stream_check(&self, known: bool, stream: StreamId) -> Result<(), E> {
        if known {
            Ok(())
        } else {
            Err(E::UnknownStream(stream))
        }
    }
}

pub(crate) struct Leftovers {
    pub(crate) mappings: Vec<(u64, usize)>,
    pub(crate) handles: Vec<(RawHandle, usize, bool)>,
    pub(crate) reservations: Vec<(u64, usize)>,
    pub(crate) events: Vec<RawEvent>,
}
