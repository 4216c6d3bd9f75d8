//! The kinds of backend call, and counters of them.

use std::fmt;

/// One kind of backend call. Counters, fault injection and errors are keyed by it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[non_exhaustive]
pub enum CallKind {
    /// `cuInit` and device setup: constructing a backend (its errors come from here).
    Init,
    /// `cuMemAddressReserve`: reserve a virtual-address range.
    Reserve,
    /// `cuMemAddressFree`: give a reserved range back.
    FreeReservation,
    /// `cuMemCreate`: create a physical handle.
    Create,
    /// `cuMemRelease`: release a physical handle.
    Release,
    /// `cuMemMap`: map (part of) a handle at an address.
    Map,
    /// `cuMemUnmap`: unmap a range.
    Unmap,
    /// `cuMemSetAccess`: set the access of a mapped range.
    SetAccess,
    /// `cuMemGetInfo`: free and total device memory.
    MemInfo,
    /// `cuEventCreate` + `cuEventRecord`: record an event on a stream.
    RecordEvent,
    /// `cuEventQuery`: has an event completed?
    QueryEvent,
    /// `cuEventDestroy`: release an event.
    ReleaseEvent,
    /// `cuStreamSynchronize`: wait for a stream's work.
    Synchronize,
    /// `cuMemcpyHtoD`: copy bytes into device memory (tests, examples).
    Write,
    /// `cuMemcpyDtoH`: copy bytes out of device memory (tests, examples).
    Read,
}

impl CallKind {
    /// Every kind, in declaration order.
    pub const ALL: [CallKind; 15] = [
        CallKind::Init,
        CallKind::Reserve,
        CallKind::FreeReservation,
        CallKind::Create,
        CallKind::Release,
        CallKind::Map,
        CallKind::Unmap,
        CallKind::SetAccess,
        CallKind::MemInfo,
        CallKind::RecordEvent,
        CallKind::QueryEvent,
        CallKind::ReleaseEvent,
        CallKind::Synchronize,
        CallKind::Write,
        CallKind::Read,
    ];

    /// The number of kinds.
    pub const COUNT: usize = Self::ALL.len();

    /// Position in [`CallKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The driver function this kind stands for.
    pub fn driver_name(self) -> &'static str {
        match self {
            CallKind::Init => "cuInit",
            CallKind::Reserve => "cuMemAddressReserve",
            CallKind::FreeReservation => "cuMemAddressFree",
            CallKind::Create => "cuMemCreate",
            CallKind::Release => "cuMemRelease",
            CallKind::Map => "cuMemMap",
            CallKind::Unmap => "cuMemUnmap",
            CallKind::SetAccess => "cuMemSetAccess",
            CallKind::MemInfo => "cuMemGetInfo",
            CallKind::RecordEvent => "cuEventRecord",
            CallKind::QueryEvent => "cuEventQuery",
            CallKind::ReleaseEvent => "cuEventDestroy",
            CallKind::Synchronize => "cuStreamSynchronize",
            CallKind::Write => "cuMemcpyHtoD",
            CallKind::Read => "cuMemcpyDtoH",
        }
    }

    /// The one-bit set holding this kind.
    pub fn as_set(self) -> CallKinds {
        CallKinds::from_bits_truncate(1 << self.index())
    }
}

impl fmt::Display for CallKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.driver_name())
    }
}

bitflags::bitflags! {
    /// A set of call kinds, e.g. the kinds that random fault injection may fail.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct CallKinds: u32 {
        /// [`CallKind::Init`]
        const INIT = 1 << 0;
        /// [`CallKind::Reserve`]
        const RESERVE = 1 << 1;
        /// [`CallKind::FreeReservation`]
        const FREE_RESERVATION = 1 << 2;
        /// [`CallKind::Create`]
        const CREATE = 1 << 3;
        /// [`CallKind::Release`]
        const RELEASE = 1 << 4;
        /// [`CallKind::Map`]
        const MAP = 1 << 5;
        /// [`CallKind::Unmap`]
        const UNMAP = 1 << 6;
        /// [`CallKind::SetAccess`]
        const SET_ACCESS = 1 << 7;
        /// [`CallKind::MemInfo`]
        const MEM_INFO = 1 << 8;
        /// [`CallKind::RecordEvent`]
        const RECORD_EVENT = 1 << 9;
        /// [`CallKind::QueryEvent`]
        const QUERY_EVENT = 1 << 10;
        /// [`CallKind::ReleaseEvent`]
        const RELEASE_EVENT = 1 << 11;
        /// [`CallKind::Synchronize`]
        const SYNCHRONIZE = 1 << 12;
        /// [`CallKind::Write`]
        const WRITE = 1 << 13;
        /// [`CallKind::Read`]
        const READ = 1 << 14;
        /// The calls through which growing a segment can fail: reserve, create, map, set access.
        const GROWTH = Self::RESERVE.bits() | Self::CREATE.bits() | Self::MAP.bits() | Self::SET_ACCESS.bits();
    }
}

impl CallKinds {
    /// Whether `kind` is in the set.
    pub fn has(self, kind: CallKind) -> bool {
        self.contains(kind.as_set())
    }
}

/// How many calls of each kind a backend received, and how many of them failed (for any reason:
/// a broken rule, an injected fault or the driver itself).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct CallCounts {
    calls: [u64; CallKind::COUNT],
    failures: [u64; CallKind::COUNT],
}

impl CallCounts {
    /// Calls of `kind` received, failed ones included.
    pub fn calls(&self, kind: CallKind) -> u64 {
        self.calls[kind.index()]
    }

    /// Calls of `kind` that returned an error.
    pub fn failures(&self, kind: CallKind) -> u64 {
        self.failures[kind.index()]
    }

    /// Calls of every kind, added up.
    pub fn total(&self) -> u64 {
        self.calls.iter().sum()
    }

    /// Counts the difference `self - earlier`, for "what did this operation cost" questions.
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        let mut out = CallCounts::default();
        for i in 0..CallKind::COUNT {
            out.calls[i] = self.calls[i].saturating_sub(earlier.calls[i]);
            out.failures[i] = self.failures[i].saturating_sub(earlier.failures[i]);
        }
        out
    }

    pub(crate) fn count_call(&mut self, kind: CallKind) {
        self.calls[kind.index()] += 1;
    }

    pub(crate) fn count_failure(&mut self, kind: CallKind) {
        self.failures[kind.index()] += 1;
    }
}

impl fmt::Display for CallCounts {
    /// Lists the kinds that were called, e.g. `cuMemCreate=4 cuMemMap=4 (1 failed)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for kind in CallKind::ALL {
            let (n, failed) = (self.calls(kind), self.failures(kind));
            if n == 0 {
                continue;
            }
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{kind}={n}")?;
            if failed > 0 {
                write!(f, " ({failed} failed)")?;
            }
        }
        if first {
            f.write_str("no calls")?;
        }
        Ok(())
    }
}
