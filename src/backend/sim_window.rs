//! Each simulated device's own window of the process's address space, so that no two live Sim
//! backends ever hand out the same address (issue 21, item 2).
//!
//! Real devices have this property for free: `cuMemAddressReserve` and `mmap` return addresses
//! unique in the process, so a pointer made by one allocator is never a live block of another,
//! and the address-only paths (`deallocate_ptr`, `record_stream`, the C ABI) refuse it as "not
//! allocated by this allocator". Before this module every Sim backend started at the same base,
//! and allocator B freed its own live block when given allocator A's pointer.
//!
//! A backend takes a window of `va_limit` bytes from one process-wide map when it is built and
//! gives it back when its last clone drops; reservations then go inside the window only. The
//! first backend alive in a process (and any made while no other is alive) gets the old base,
//! so a program with one Sim device at a time sees the same addresses as before. The map costs
//! one lock and O(log w) for w live backends, on construction and drop only: never on a reserve.
//!
//! The process's space is `[0x2_0000_0000, 2^63)`. A backend whose window does not fit beside
//! the live ones (several live backends with `va_limit` near 2^62) falls back to the shared
//! base, as every backend did before: its addresses may then repeat another's.

use parking_lot::Mutex;

use crate::backend::sim_va::VaMap;

/// Where the first window starts (an H100 handed out `0x302000000`).
pub(crate) const SPACE_BASE: u64 = 0x2_0000_0000;
/// The end of the space the windows share: below the sign bit, so an address read as signed
/// somewhere (a JSON number, a Python int through C) stays positive.
const SPACE_END: u64 = 1 << 63;
/// Windows are multiples of this and this far apart.
const WINDOW_ALIGN: u64 = 1 << 32;

/// The live windows of the process (built on first use: `VaMap::new` is not `const`).
static WINDOWS: Mutex<Option<VaMap>> = Mutex::new(None);

/// One backend's window: where its reservations may go.
#[derive(Debug)]
pub(crate) struct Window {
    base: u64,
    /// The start of the window in the process-wide map, to give back; `None` for the shared
    /// fallback.
    taken: Option<u64>,
}

impl Window {
    /// A window of at least `len` bytes whose base is aligned to `align` (a power of two), from
    /// the lowest free space of the process; the shared base when none is free.
    pub(crate) fn take(len: u64, align: u64) -> Self {
        let shared = Self {
            base: SPACE_BASE.next_multiple_of(align),
            taken: None,
        };
        let Some(size) = len
            .checked_add(align)
            .and_then(|l| l.checked_next_multiple_of(WINDOW_ALIGN))
        else {
            return shared;
        };
        let mut windows = WINDOWS.lock();
        let map = windows.get_or_insert_with(|| VaMap::new(SPACE_BASE, SPACE_END, WINDOW_ALIGN));
        match map.reserve(size) {
            Some(start) => Self {
                base: start.next_multiple_of(align),
                taken: Some(start),
            },
            None => shared,
        }
    }

    /// The first address of the window.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(start) = self.taken {
            if let Some(map) = WINDOWS.lock().as_mut() {
                map.free(start);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_windows_are_disjoint_and_stay_so_after_one_is_freed() {
        let len = 1 << 40;
        let a = Window::take(len, 2 << 20);
        let b = Window::take(len, 2 << 20);
        let (lo, hi) = (a.base().min(b.base()), a.base().max(b.base()));
        assert!(lo + len <= hi, "windows {lo:#x} and {hi:#x} overlap");
        assert!(a.base().is_multiple_of(2 << 20) && b.base().is_multiple_of(2 << 20));
        drop(b);
        // Other tests of this process hold windows too, so which window comes next is not
        // known here; but a live window is never handed out twice.
        let c = Window::take(len, 2 << 20);
        assert!(c.taken.is_some());
        assert!(c.base() + len <= a.base() || a.base() + len <= c.base());
    }

    #[test]
    fn a_window_too_large_for_the_space_falls_back_to_the_shared_base() {
        let w = Window::take(u64::MAX - 1, 2 << 20);
        assert_eq!(w.base(), SPACE_BASE);
        assert!(w.taken.is_none());
    }
}
