//! Memory statistics with PyTorch's names and meanings (`torch.cuda.memory_stats()`), plus what
//! PyTorch lacks: handles cached, bytes unmapped by remap, driver calls by kind.

use crate::backend::CallCounts;

/// One statistic: PyTorch's `Stat`.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Stat {
    /// Value now.
    pub current: u64,
    /// Highest value since creation or the last [`MemoryStats::reset_peak`].
    pub peak: u64,
    /// Total of all increases.
    pub allocated: u64,
    /// Total of all decreases.
    pub freed: u64,
}

impl Stat {
    /// `increase_stat`: `current += n`, `peak = max(peak, current)`, `allocated += n`.
    #[inline]
    pub(crate) fn increase(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }

    /// `decrease_stat`: `current -= n`, `freed += n`.
    #[inline]
    pub(crate) fn decrease(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }
}

/// Which pool a request belongs to: PyTorch's `StatType` minus the aggregate.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum PoolKind {
    /// Requests of at most 1 MiB (`kSmallSize`).
    Small,
    /// Everything larger.
    Large,
}

/// A statistic for all pools together and for each pool: PyTorch's `StatArray`
/// (keys `<stat>.all.*`, `<stat>.small_pool.*`, `<stat>.large_pool.*`).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct StatArray {
    /// Both pools.
    pub all: Stat,
    /// The small pool.
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// Increases the aggregate and `pool`'s stat.
    #[inline]
    pub(crate) fn increase(&mut self, pool: PoolKind, n: u64) {
        self.all.increase(n);
        self.pool_mut(pool).increase(n);
    }

    /// Decreases the aggregate and `pool`'s stat.
    #[inline]
    pub(crate) fn decrease(&mut self, pool: PoolKind, n: u64) {
        self.all.decrease(n);
        self.pool_mut(pool).decrease(n);
    }

    /// The stat of one pool.
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Small => &self.small_pool,
            PoolKind::Large => &self.large_pool,
        }
    }

    #[inline]
    fn pool_mut(&mut self, pool: PoolKind) -> &mut Stat {
        match pool {
            PoolKind::Small => &mut self.small_pool,
            PoolKind::Large => &mut self.large_pool,
        }
    }

    fn reset_peak(&mut self) {
        for s in [&mut self.all, &mut self.small_pool, &mut self.large_pool] {
            s.peak = s.current;
        }
    }
}

/// What an allocator reports: PyTorch's `DeviceStats`, plus our extras.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct MemoryStats {
    /// Live allocations (count).
    pub allocation: StatArray,
    /// Segments: one VA reservation each (expandable) or one device allocation (classic).
    pub segment: StatArray,
    /// Live allocations plus freed ones still waiting for other streams' events (count).
    pub active: StatArray,
    /// Free blocks that split a segment and so cannot be released (count; classic only).
    pub inactive_split: StatArray,
    /// Bytes in live allocations (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes reserved from the device: mapped pages (expandable) or segments (classic).
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks.
    pub active_bytes: StatArray,
    /// Bytes in inactive split blocks (classic only, as in PyTorch with expandable segments).
    pub inactive_split_bytes: StatArray,
    /// Bytes requested by users (unrounded), of active blocks.
    pub requested_bytes: StatArray,
    /// Times the last-resort stage ran: every cached block freed and the allocation retried
    /// (PyTorch's `release_cached_blocks` then retry), counted per attempt whether the retry
    /// succeeded or not, as PyTorch counts it.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
    /// Device allocations: pages mapped (expandable; `cuMemMap`) or segments allocated (classic).
    pub num_device_alloc: u64,
    /// Device frees: pages unmapped or segments freed.
    pub num_device_free: u64,
    /// Physical handles held in the cache right now, unmapped, ready to be mapped again.
    pub handles_cached: u64,
    /// Bytes of physical handles in the cache right now.
    pub handle_cache_bytes: u64,
    /// Bytes of physical handles created so far (`cuMemCreate`).
    pub bytes_created: u64,
    /// Page mappings served from the handle cache instead of a new `cuMemCreate`.
    pub handle_reuses: u64,
    /// Bytes of free interior pages unmapped and remapped where growth needed them.
    pub remapped_bytes: u64,
    /// Bytes of chunks a rolled-back growth mapped and then could not unmap (the driver refused):
    /// still mapped, never handed out, not in `reserved_bytes`, unmapped again by `empty_cache`
    /// or the allocator's drop. Expandable only; normally 0.
    pub stuck_bytes: u64,
    /// Bytes of parked mappings: old mappings of free pages remapped to a growth of their own
    /// stream without a synchronization (Note \[Parked pages\] in `expandable/parked.rs`). Still
    /// mapped at their old addresses, which nothing is handed out from, until the stream's next
    /// synchronization; no memory of their own (their handles are counted where they were
    /// remapped); and the second mappings of a parked rescue, whose freed block's ends are free
    /// at home again (Note \[Parked rescue\] in `expandable/rescue.rs`). Expandable only.
    pub parked_bytes: u64,
    /// How many parked mappings there are (each one `cuMemMap` of a handle also mapped, or
    /// cached, elsewhere).
    pub parked_pages: u64,
    /// Requests served by an alias rescue (Note \[Alias rescue\] in `expandable/rescue.rs`):
    /// where the last resort failed, the free ends of partly used pages were mapped a second
    /// time around new memory. Each of them would have been an OOM without it. Expandable only.
    pub alias_rescues: u64,
    /// Requests served by a freed rescued block of their size and stream, mapped still (Note
    /// \[Rescue revived\] in `expandable/rescue.rs`): no call, no synchronization, where a new
    /// rescue would make about ten calls. Expandable only.
    pub alias_revivals: u64,
    /// Bytes of the second mappings the alias rescues hold now: ends of partly used pages mapped
    /// again around a rescued block, no memory of their own (their handles are counted where
    /// they were first mapped), and any such mapping a failed rescue left for the driver to take
    /// back (Note \[Deferred releases\]). Expandable only.
    pub alias_bytes: u64,
    /// How many such second mappings there are (each one `cuMemMap` of a handle mapped
    /// elsewhere).
    pub alias_mappings: u64,
    /// Alias rescues mapped in a segment's rescue space (Note \[Rescue space\] in `expandable/rescue.rs`): each counts
    /// in `segment` as a segment of its own but holds no reservation of its own. Expandable
    /// only.
    pub rescues_in_space: u64,
    /// Backend calls by kind, made by this allocator.
    pub calls: CallCounts,
}

impl MemoryStats {
    /// `reset_peak_memory_stats`: every `peak` becomes `current`.
    pub fn reset_peak(&mut self) {
        for s in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            s.reset_peak();
        }
    }
}
