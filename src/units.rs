//! Units as types: device addresses and virtual-address ranges.
//!
//! Addresses print in hex; arithmetic on them is checked, so an overflowing range is an error
//! value at the caller, never a wrapped address.

use std::fmt;

/// A virtual address in the device's address space (a `CUdeviceptr` on CUDA, a process address on
/// the Host backend, a fake but realistic one on Sim).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DevAddr(u64);

impl DevAddr {
    /// Wraps a raw address value.
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw address value, as the driver takes it.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + bytes`, or `None` if it would leave the 64-bit address space.
    pub fn checked_add(self, bytes: usize) -> Option<Self> {
        self.0.checked_add(u64::try_from(bytes).ok()?).map(Self)
    }

    /// Bytes from `base` up to `self`, or `None` if `self` lies below `base`.
    pub fn offset_from(self, base: DevAddr) -> Option<usize> {
        usize::try_from(self.0.checked_sub(base.0)?).ok()
    }

    /// Whether the address is a multiple of `align` (which must be non-zero).
    pub fn is_aligned(self, align: usize) -> bool {
        align != 0 && self.0.is_multiple_of(align as u64)
    }
}

impl fmt::Debug for DevAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for DevAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::LowerHex for DevAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A reserved virtual-address range: `[start, start + len)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct VaRange {
    /// First address of the range.
    pub start: DevAddr,
    /// Length in bytes.
    pub len: usize,
}

impl VaRange {
    /// One past the last address, or `None` if the range wraps the address space.
    pub fn end(&self) -> Option<DevAddr> {
        self.start.checked_add(self.len)
    }

    /// Whether `[at, at + len)` lies wholly inside this range.
    pub fn contains(&self, at: DevAddr, len: usize) -> bool {
        match (self.end(), at.checked_add(len)) {
            (Some(end), Some(other_end)) => at >= self.start && other_end <= end,
            _ => false,
        }
    }
}

impl fmt::Display for VaRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, +{:#x})", self.start, self.len)
    }
}

/// Formats a byte count the way a person reads it (`2.00 MiB`), for messages.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
