//! Every system call of the Host backend. The only module of it allowed `unsafe`.
//!
//! Soundness rests on one fact, checked here before every call that touches memory: the range lies
//! inside a reservation this device made (`inside_own`). Such ranges are always either
//! `PROT_NONE` anonymous memory or pool pages that this device mapped, never memory the rest of the
//! program owns, so `MAP_FIXED` over them and copies into them cannot corrupt Rust objects. The
//! rule checker in front of this layer additionally guarantees that copies only touch mapped pages
//! with the right protection (otherwise the CPU would fault, which is a crash, not corruption).
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::ptr;

use rustix::fs::{fallocate, fstat, ftruncate, memfd_create, FallocateFlags, MemfdFlags};
use rustix::io::Errno;
use rustix::mm::{mmap, mmap_anonymous, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};

use crate::backend::emulated::sim_event_methods;
use crate::backend::error::BackendErrorKind as E;
use crate::backend::events::SimEvents;
use crate::backend::raw::{RawDevice, RawEvent, RawHandle, RawResult};
use crate::backend::{Access, MemInfo, Protection};

/// Length of the sparse pool file: offsets are never reused, and 2^60 bytes cannot run out.
const POOL_LEN: u64 = 1 << 60;

fn os(call: &'static str) -> impl Fn(Errno) -> E {
    move |errno| E::Os {
        call,
        errno: errno.raw_os_error(),
        message: std::io::Error::from_raw_os_error(errno.raw_os_error()).to_string(),
    }
}

/// Cuts the over-reservation `[raw, raw + padded)` down to the `len` bytes from its first
/// `granularity`-aligned address, unmapping the head and the tail with `unmap`; returns that
/// address. If a cut fails, the rest of the over-reservation is unmapped too, so a failed reserve
/// leaves no address space behind.
fn trim_to_alignment(
    raw: usize,
    padded: usize,
    len: usize,
    granularity: usize,
    mut unmap: impl FnMut(usize, usize) -> Result<(), Errno>,
) -> RawResult<usize> {
    let base = raw.next_multiple_of(granularity);
    let head = base - raw;
    let tail = padded - head - len;
    // A cut splits a mapping and can fail for want of kernel mappings (`vm.max_map_count`);
    // unmapping what is left whole splits nothing, so the clean-up does not fail the same way
    // (and if it did, there would be nothing more to try).
    if head > 0 {
        if let Err(e) = unmap(raw, head) {
            let _ = unmap(raw, padded);
            return Err(os("munmap")(e));
        }
    }
    if tail > 0 {
        if let Err(e) = unmap(base + len, tail) {
            // Not from `raw`: the head is gone and may already be someone else's mapping.
            let _ = unmap(base, len + tail);
            return Err(os("munmap")(e));
        }
    }
    Ok(base)
}

pub(crate) struct HostDevice {
    granularity: usize,
    capacity: usize,
    pool: OwnedFd,
    next_offset: u64,
    /// raw handle (its pool offset) -> length
    handles: HashMap<RawHandle, usize>,
    /// base -> len of the reservations this device made
    reservations: BTreeMap<u64, usize>,
    pub(crate) events: SimEvents,
}

impl HostDevice {
    pub(crate) fn open(granularity: usize, capacity: usize) -> Result<Self, E> {
        let pool =
            memfd_create("vmm-alloc-host-pool", MemfdFlags::CLOEXEC).map_err(os("memfd_create"))?;
        ftruncate(&pool, POOL_LEN).map_err(os("ftruncate"))?;
        Ok(Self {
            granularity,
            capacity,
            pool,
            next_offset: 0,
            handles: HashMap::new(),
            reservations: BTreeMap::new(),
            events: SimEvents::default(),
        })
    }

    /// Whether `[at, at + len)` lies inside one reservation of this device.
    fn inside_own(&self, at: u64, len: usize) -> bool {
        let Some(end) = at.checked_add(len as u64) else {
            return false;
        };
        self.reservations
            .range(..=at)
            .next_back()
            .is_some_and(|(&base, &rlen)| end <= base + rlen as u64)
    }

    fn own_range(&self, at: u64, len: usize) -> RawResult<*mut c_void> {
        if self.inside_own(at, len) {
            Ok(at as usize as *mut c_void)
        } else {
            Err(E::NotReserved {
                addr: crate::DevAddr::new(at),
                len,
            })
        }
    }

    /// Pool bytes that hold memory (st_blocks of the memfd).
    pub(crate) fn resident_bytes(&self) -> Result<u64, E> {
        let st = fstat(&self.pool).map_err(os("fstat"))?;
        Ok(st.st_blocks as u64 * 512)
    }
}

impl RawDevice for HostDevice {
    const NAME: &'static str = "host";

    fn granularity(&self) -> usize {
        self.granularity
    }
    fn ordinal(&self) -> u32 {
        0
    }
    fn device_count(&self) -> u32 {
        1
    }
    fn capacity(&self) -> Option<usize> {
        Some(self.capacity)
    }
    fn has_bytes(&self) -> bool {
        true
    }

    fn reserve(&mut self, len: usize) -> RawResult<u64> {
        let g = self.granularity;
        // Over-reserve by one granule, then trim both ends so the range is granule-aligned.
        let padded = len
            .checked_add(g)
            .ok_or(E::AddressSpaceExhausted { requested: len })?;
        // SAFETY: a fresh anonymous PROT_NONE mapping at an address the kernel picks overlaps
        // nothing that exists.
        let raw = unsafe {
            mmap_anonymous(
                ptr::null_mut(),
                padded,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| match e {
            Errno::NOMEM => E::AddressSpaceExhausted { requested: len },
            e => os("mmap")(e),
        })? as usize;
        let base = trim_to_alignment(raw, padded, len, g, |at, n| {
            // SAFETY: `trim_to_alignment` passes only pieces of the mapping just created, which
            // nothing else knows about yet, and never a piece it already unmapped.
            unsafe { munmap(at as *mut c_void, n) }
        })?;
        self.reservations.insert(base as u64, len);
        Ok(base as u64)
    }

    fn free_reservation(&mut self, base: u64, len: usize) -> RawResult<()> {
        let at = self.own_range(base, len)?;
        // SAFETY: the range is exactly one of our reservations (checked above), holding only
        // PROT_NONE memory now that the rule checker saw it has no mappings.
        unsafe { munmap(at, len) }.map_err(os("munmap"))?;
        self.reservations.remove(&base);
        Ok(())
    }

    fn create(&mut self, len: usize) -> RawResult<RawHandle> {
        let offset = self.next_offset;
        let end = offset.checked_add(len as u64).filter(|&e| e <= POOL_LEN);
        self.next_offset = end.ok_or(E::OutOfMemory {
            requested: len,
            free: 0,
            total: self.capacity,
        })?;
        self.handles.insert(offset, len);
        Ok(offset)
    }

    fn release(&mut self, _handle: RawHandle) -> RawResult<()> {
        // Memory stays while mapped; `memory_gone` frees it.
        Ok(())
    }

    fn memory_gone(&mut self, handle: RawHandle, len: usize) {
        if self.handles.remove(&handle).is_some() {
            // Failure only means the memory stays until the pool fd closes; nothing to undo.
            let _ = fallocate(
                &self.pool,
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                handle,
                len as u64,
            );
        }
    }

    fn map(&mut self, at: u64, len: usize, handle: RawHandle, offset: usize) -> RawResult<()> {
        let addr = self.own_range(at, len)?;
        let file_offset = handle + offset as u64;
        // SAFETY: `addr..addr+len` is inside one of our reservations (checked above) and, per the
        // rule checker, not mapped yet, so MAP_FIXED replaces only PROT_NONE reservation pages.
        unsafe {
            mmap(
                addr,
                len,
                ProtFlags::empty(),
                MapFlags::SHARED | MapFlags::FIXED,
                &self.pool,
                file_offset,
            )
        }
        .map_err(os("mmap"))?;
        Ok(())
    }

    fn unmap(&mut self, at: u64, len: usize) -> RawResult<()> {
        let addr = self.own_range(at, len)?;
        // SAFETY: inside one of our reservations (checked above); replacing pool pages with
        // PROT_NONE anonymous memory returns the range to "reserved".
        unsafe {
            mmap_anonymous(
                addr,
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
            )
        }
        .map_err(os("mmap"))?;
        Ok(())
    }

    fn set_access(&mut self, at: u64, len: usize, access: &[Access]) -> RawResult<()> {
        let addr = self.own_range(at, len)?;
        let Some(own) = access.iter().find(|a| a.device == 0) else {
            return Ok(());
        };
        let flags = match own.protection {
            Protection::None => MprotectFlags::empty(),
            Protection::Read => MprotectFlags::READ,
            Protection::ReadWrite => MprotectFlags::READ | MprotectFlags::WRITE,
        };
        // SAFETY: inside one of our reservations (checked above); changing protection of our own
        // pool mappings affects no Rust object.
        unsafe { mprotect(addr, len, flags) }.map_err(os("mprotect"))
    }

    fn mem_info(&mut self) -> RawResult<Option<MemInfo>> {
        Ok(None)
    }

    sim_event_methods!();

    fn write(&mut self, at: u64, data: &[u8]) -> RawResult<()> {
        let dst = self.own_range(at, data.len())?;
        // SAFETY: the destination lies in our own reservation (checked above), so it cannot overlap
        // `data` or any other Rust object; the rule checker verified it is mapped read-write.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.cast::<u8>(), data.len()) };
        Ok(())
    }

    fn read(&mut self, at: u64, out: &mut [u8]) -> RawResult<()> {
        let src = self.own_range(at, out.len())?;
        // SAFETY: the source lies in our own reservation (checked above), so it cannot overlap
        // `out`; the rule checker verified it is mapped readable.
        unsafe {
            ptr::copy_nonoverlapping(src.cast::<u8>().cast_const(), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = 0x1000;

    /// Runs `trim_to_alignment` over a fake `unmap` whose `fail_at`-th call (0-based) fails;
    /// returns the result and the ranges the calls that succeeded unmapped.
    fn trim(
        raw: usize,
        len: usize,
        fail_at: Option<usize>,
    ) -> (RawResult<usize>, Vec<(usize, usize)>) {
        let mut calls = 0;
        let mut unmapped = Vec::new();
        let result = trim_to_alignment(raw, len + G, len, G, |at, n| {
            calls += 1;
            if fail_at == Some(calls - 1) {
                return Err(Errno::NOMEM);
            }
            unmapped.push((at, at + n));
            Ok(())
        });
        unmapped.sort_unstable();
        (result, unmapped)
    }

    /// Trims with the `fail_at`-th `unmap` failing, and checks that the reserve fails with the
    /// `munmap` error and that the successful unmaps gave back the whole over-reservation exactly:
    /// no gap (a leak), no byte twice (which could hit someone else's mapping).
    fn assert_failure_gives_everything_back(raw: usize, len: usize, fail_at: usize) {
        let (result, unmapped) = trim(raw, len, Some(fail_at));
        assert!(
            matches!(result, Err(E::Os { call: "munmap", .. })),
            "raw {raw:#x}, unmap #{fail_at} failing: {result:?}"
        );
        let mut cursor = raw;
        for &(a, b) in &unmapped {
            assert_eq!(
                a, cursor,
                "raw {raw:#x}, unmap #{fail_at} failing: unmapped {unmapped:x?}"
            );
            cursor = b;
        }
        assert_eq!(
            cursor,
            raw + len + G,
            "raw {raw:#x}, unmap #{fail_at} failing: unmapped only {unmapped:x?}"
        );
    }

    #[test]
    fn trim_keeps_the_aligned_middle() {
        let (raw, len) = (0x10_0300, 4 * G);
        let (result, unmapped) = trim(raw, len, None);
        let base = 0x10_1000;
        assert_eq!(result, Ok(base));
        assert_eq!(unmapped, vec![(raw, base), (base + len, raw + len + G)]);
    }

    #[test]
    fn failed_head_cut_unmaps_the_whole_over_reservation() {
        assert_failure_gives_everything_back(0x10_0300, 4 * G, 0);
    }

    #[test]
    fn failed_tail_cut_unmaps_the_rest() {
        assert_failure_gives_everything_back(0x10_0300, 4 * G, 1);
        // With an aligned `raw` there is no head: the tail cut is the first call.
        assert_failure_gives_everything_back(0x10_0000, 4 * G, 0);
    }
}
