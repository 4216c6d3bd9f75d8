//! Allocator configuration: [`ExpandableConfig`], its PyTorch-faithful preset, and PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` grammar.

mod alloc_conf;
mod own_settings;
mod round;

pub use alloc_conf::{parse_alloc_conf, AllocConf, ConfigError, ROUNDUP_INTERVALS};
pub use own_settings::{split_settings, OWN_KEYS};
#[allow(unused_imports)] // the allocators name them through `round::`
pub(crate) use round::{
    divisions_for, roundup_power2_next_division, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER,
};
pub use round::{get_allocation_size, round_size, MIN_BLOCK_SIZE, ONE_EXA_BYTES, SMALL_SIZE};

/// When [`ExpandableConfig::front_cache`] stashes freed blocks (Note \[Front cache\] in
/// `expandable/front/mod.rs`, Note \[Engage on contention\] in `expandable/front/engage.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontCacheMode {
    /// Never: every call takes the allocator's lock (settings: `front_cache:false`).
    Off,
    /// Once threads freeing blocks have found the allocator's lock taken a number of times, and
    /// until the stashes and arenas serve fewer than half of the allocations (settings:
    /// `front_cache:auto`).
    /// One thread never engages it. The default.
    OnContention,
    /// From the first call, whatever it serves (settings: `front_cache:true`).
    Always,
}

/// How an [`ExpandableAllocator`](crate::ExpandableAllocator) behaves. Each improvement over
/// PyTorch's expandable segments is a switch, so its gain can be measured against
/// [`ExpandableConfig::pytorch_expandable`].
#[derive(Clone, Debug, PartialEq)]
pub struct ExpandableConfig {
    /// Page size of small-pool segments (requests ≤ 1 MiB): each page is one physical handle.
    /// Rounded up to the backend's granularity. Default 2 MiB, as PyTorch.
    pub small_page: usize,
    /// Page size of large-pool segments. Default 20 MiB, as PyTorch (`large_segment_size_mb`),
    /// chosen by measurement: replaying the 23 shared PyTorch traces (Sim, 2026-11-23), 2 / 8 /
    /// 20 / 64 MiB pages make 342,207 / 91,450 / 39,342 / 13,785 driver calls at 80 GiB, and
    /// need 289.3 / 290.1 / 290.7 / 292.0 GiB of capacity summed over the traces (peak live
    /// 288.8 GiB). 20 MiB gives up 0.5 % of capacity against 2 MiB pages for 8.7× fewer calls;
    /// 64 MiB would save 2.9× more calls for another 0.45 %.
    pub large_page: usize,
    /// Virtual address space reserved per segment, as a multiple of device memory. PyTorch: 1.125.
    pub va_factor: f64,
    /// Keep unmapped physical handles and map them again before creating new ones.
    pub handle_cache: bool,
    /// Bytes of unmapped handles kept between calls (the release threshold): `empty_cache()` and
    /// every allocation that unmapped handles (remap, the free-everything retry) release what
    /// lies beyond it before returning. Default 0: `empty_cache()` gives every byte back to the
    /// device, as users calling it expect; handles unmapped under memory pressure are still
    /// reused at once, within the allocation that unmapped them.
    pub handle_cache_limit: usize,
    /// When growth finds no physical memory, unmap fully-free pages of any segment (once their
    /// stream's work is done) and map their handles where they are needed, before the last-resort
    /// "free everything and retry".
    pub remap_defrag: bool,
    /// Before unmapping free pages, synchronize their stream only if a block was freed on it since
    /// its last synchronization (queued work cannot touch memory freed before it was queued).
    /// PyTorch synchronizes before every unmap.
    pub sync_only_after_frees: bool,
    /// Devices (peers) that also get read-write access to every mapped page. Each must be a
    /// device the backend has (below [`Backend::device_count`](crate::backend::Backend::device_count)),
    /// or construction fails with [`AllocError::InvalidConfig`](crate::AllocError::InvalidConfig).
    pub peers: Vec<u32>,
    /// `roundup_power2_divisions` per interval (0 or 1 = plain 512-byte rounding).
    pub roundup_power2_divisions: [usize; ROUNDUP_INTERVALS],
    /// `per_process_memory_fraction`: the allocator never holds more than this fraction of device
    /// memory.
    pub memory_fraction: f64,
    /// `max_split_size_mb` in bytes. PyTorch applies its oversize rules to expandable free blocks
    /// too, which lets reserved memory grow without bound (pytorch#123548); ours ignores it unless
    /// `faithful_oversize` is set.
    pub max_split_size: Option<usize>,
    /// Apply `max_split_size`'s oversize rules as PyTorch does (the baseline's behaviour).
    pub faithful_oversize: bool,
    /// `max_non_split_rounding_mb` in bytes (used with `faithful_oversize`).
    pub max_non_split_rounding: usize,
    /// Page size chosen at the device's end: when a full page would take memory beyond the
    /// device (or the memory fraction), a growth maps only the bytes its request needs (rounded
    /// to the backend's granularity, one handle) instead of rounding its last page up to
    /// `large_page`, so no request fails for a page's unused tail. Everywhere else pages stay
    /// whole (few driver calls; the headroom does not cut them: a cut tail there saves no
    /// capacity and costs the next request a growth). PyTorch: off.
    pub pressure_tail: bool,
    /// Headroom kept for what lives outside the allocator (the CUDA context, library
    /// workspaces, other processes): the allocator does not create new physical memory beyond
    /// `limit − max(headroom_bytes, headroom_fraction × device memory)` while it can remap
    /// fully-free pages it already holds (Note \[Headroom\] in `expandable/growth.rs`). Beyond
    /// that it still creates (the headroom is a preference, never a cause of OOM). Default 0
    /// (the fraction below applies). PyTorch: 0 (grows into the device's last free bytes).
    pub headroom_bytes: usize,
    /// The headroom as a fraction of device memory (the larger of the two applies). Default
    /// 0.01: 0.8 GiB of an 80 GiB device. PyTorch: 0.
    pub headroom_fraction: f64,
    /// Remap before creating, with or without pressure: a growth first unmaps fully-free pages
    /// it already holds (synchronizing their stream if a block was freed on it since its last
    /// synchronization) and maps their handles where it needs them, and creates new physical
    /// memory only when none is left, so reserved memory tracks live memory plus partly used
    /// pages (Note \[Free holes\] in `expandable/growth.rs`). It costs a stream
    /// synchronization per growth that remaps after a free, where pages freed in the interior
    /// of a segment would otherwise only wait for a request that fits them. Default off (no
    /// synchronization without pressure). PyTorch: off.
    pub remap_before_create: bool,
    /// A small request (≤ 1 MiB) that finds no free range in the small pool of its stream, when
    /// a new small page would reach into the headroom, takes the best-fitting free range of the
    /// large pool of its stream instead of mapping memory (Note \[Borrowing\] in
    /// `expandable/allocate.rs`): free bytes in partly used large pages, which remapping cannot
    /// take, serve it; the block counts in the large pool's statistics, whose memory holds it.
    /// Default on. PyTorch: off (pools
    /// never share).
    pub borrow_across_pools: bool,
    /// Remap a fully-free page of the growing stream's own segments without synchronizing
    /// that stream: its handle is mapped where the growth needs it while the old mapping stays
    /// *parked* (still mapped, never handed out) until the stream is next synchronized for
    /// another reason, `empty_cache`, or the handle's release (Note \[Parked pages\] in
    /// `expandable/parked.rs`). Work queued on the stream before the free may still touch the
    /// old addresses; work queued after it (the only work that can use the new ones) runs after
    /// it, so this is as safe as reusing the free block in place. Pages of other streams still
    /// wait for a synchronization. The same rule lets a freed alias rescue whose ends its own
    /// stream lent give them back home without a synchronization, in a program whose large-pool
    /// memory is that stream's alone, its reservation parked until a request must grow (Note
    /// \[Parked rescue\] in `expandable/rescue.rs`). Default on. PyTorch: off (it synchronizes
    /// before every unmap).
    pub park_remaps: bool,
    /// A per-stream front cache (Note \[Front cache\] in `expandable/front/mod.rs`): a block freed
    /// with [`Allocator::deallocate`](crate::Allocator::deallocate) is stashed on its stream, and
    /// an allocation on that stream of the same size takes it back, neither taking the
    /// allocator's lock; an allocation of another size is carved from a free range of its
    /// stream that the last call under the lock lent (Note \[Front arena\] in
    /// `expandable/front/arena.rs`); so threads on different streams scale. Statistics stay exact; which
    /// block a request gets, and so how memory fragments, can differ. Default
    /// [`FrontCacheMode::OnContention`]: off until threads contend for the allocator's lock,
    /// and off again while it serves too few requests (Note \[Engage on contention\] in
    /// `expandable/front/engage.rs`), so a program that allocates from one thread gets exactly
    /// the measured policy. PyTorch: off.
    pub front_cache: FrontCacheMode,
    /// Where a growth goes when several places can hold it once their hole is mapped: the one
    /// whose span (free bytes before the hole, the hole, free bytes after it) is smallest, as
    /// best fit chooses among free blocks, keeping large spans whole for large requests (Note
    /// \[Growth\] in `expandable/growth.rs`). Off: the lowest address, as PyTorch ("the lowest
    /// address at which we can fit"). The places differ only where a segment has holes inside
    /// it (pages released or remapped under pressure, or by `empty_cache`). Default on.
    pub best_fit_growth: bool,
    /// A request of exactly the rounded size of the block freed just before it (no allocation
    /// in between), on the same stream and pool, gets that block's range back when the free did
    /// not merge it with free neighbours: among the free ranges best fit could choose (exact
    /// fits), the latest freed instead of the lowest, so a loop that frees and re-allocates a
    /// tensor keeps its layout (Note \[Last free\] in `expandable/last_free.rs`). Default on.
    /// PyTorch: off (lowest address). Applies only while the allocator holds at least
    /// `reuse_last_free_above` of its limit.
    pub reuse_last_free: bool,
    /// `reuse_last_free` applies only while the physical memory the allocator holds (mapped and
    /// cached) is at least this fraction of the device (of the memory-fraction limit): near the
    /// device's end, where a layout that drifts costs a growth that does not fit; below it, the
    /// exact fit is PyTorch's (the lowest), so a program with room to spare gets PyTorch's
    /// decisions (Note \[Last free\] in `expandable/last_free.rs`). In \[0, 1\]; 0 applies it
    /// always. Default 0.9.
    pub reuse_last_free_above: f64,
    /// Once a remap under memory pressure has synchronized another stream, unmap every
    /// fully-free page of that stream at once, not only those the growth needs (Note \[Drain
    /// after sync\] in `expandable/growth.rs`): fewer synchronizations on programs with several
    /// streams (38 % fewer on the generated 2- and 4-stream workloads for 2–3 % more capacity;
    /// 9–17 % fewer on 10 streams for 2–8 % more). Default off. PyTorch: off (it gives every
    /// free page back at once instead).
    pub drain_after_sync: bool,
    /// Under memory pressure, when every fully-free page a growth could take belongs to its own
    /// stream, take the lowest-addressed first (Note \[Harvest order\] in
    /// `expandable/growth.rs`): the free memory farthest below where segments grow, which later
    /// blocks would otherwise split, goes first. Off, or when other streams' pages are
    /// candidates: the highest-addressed first. Default on. PyTorch: no remap (it gives every
    /// free page back at once).
    pub harvest_lowest_first: bool,
    /// Under memory pressure, when the only free pages left to remap belong to another stream
    /// that would first need a synchronization, give every free page back and retry, as
    /// PyTorch does, instead of synchronizing that stream to take its pages one growth at a
    /// time (Note \[Give back before foreign sync\] in `expandable/growth.rs`). The growing
    /// stream's own pages are still remapped first, without a synchronization. For programs
    /// whose streams each hold a mosaic of slowly growing tensors (an inference server with a
    /// stream per client, each request growing its own KV cache): on the generated
    /// `inference-server` workloads it needs less than PyTorch's policy summed and never
    /// synchronizes more; on streams of large transient blocks it needs more (POLICY.md,
    /// "Inference servers"). `vmm-replay advise` tries it on every trace with several streams.
    /// Default off. PyTorch: gives every free page back whenever it runs out.
    pub give_back_before_foreign_sync: bool,
    /// The same give-back, for one stream at a time: under memory pressure, when the only free
    /// pages left to remap belong to another stream that would first need a synchronization,
    /// and that stream holds fewer whole free pages than this fraction of its mapped memory (a
    /// mosaic: its free bytes lie in pages it also uses), every free page is given back and the
    /// request retried instead of synchronizing that stream for the few pages it has (Note
    /// \[Give back before foreign sync\] in `expandable/growth.rs`). In \[0, 1\]; 0 turns it
    /// off. Default 0.05: on the generated inference servers (seeds 13–18, held out) it takes the
    /// cases that need more than PyTorch's policy from 11 of 12 to 8 and the synchronizations
    /// above it from 7 to 5, and no several-streams case moves across either bar, for 0.4–0.6 %
    /// more memory summed there (README, Results, "Judging a policy change"). PyTorch: gives
    /// every free page back whenever it runs out.
    pub give_back_below_free_pages: f64,
    /// The same give-back judged over every stream (Note \[Give back before foreign sync\] in
    /// `expandable/growth.rs`): when the whole free pages of all streams together are fewer than
    /// this fraction of the memory mapped, a growth that would synchronize another stream to
    /// remap its pages gives every free page back and retries instead. Free memory on a device
    /// that is mostly a mosaic of partly used pages (an inference server's KV caches) buys few
    /// pages per synchronization wherever it is taken; on streams of large transient blocks
    /// (pipelines) half the mapped memory is whole free pages when the device fills. In \[0, 1\];
    /// 0 turns it off. Default 0.15 (measured at the synchronizations that the per-stream rule
    /// let through: 3–27 % on the generated servers, 43–79 % on the several-streams workloads,
    /// quartiles): on the servers, seeds 1–18, the cases above PyTorch's policy 17 of 36 → 13
    /// and the synchronizations above it 17 → 7, and no several-streams case crosses either bar
    /// or classic's (README, Results, "Judging a policy change"). PyTorch: gives every free page
    /// back whenever it runs out.
    pub give_back_below_all_free_pages: f64,
    /// A growth of the large pool that takes the allocator's physical memory above this
    /// fraction of the device (of the memory-fraction limit) maps pages of the granularity
    /// (2 MiB) instead of `large_page`, so that the memory mapped near the device's end can be
    /// remapped piecewise under pressure (Note \[Fine pages\] in `expandable/growth.rs`).
    /// In \[0, 1\]; 1 (the default) turns it off. At 0.75, on the generated several-streams
    /// workloads ours then never needs more than PyTorch's policy and the shared traces need
    /// 0.14 GiB less summed, at about twice PyTorch's driver calls at minimum capacity (POLICY.md,
    /// "Finer pages near the device's end"). PyTorch: off.
    pub fine_pages_above: f64,
    /// The large page a growth maps shrinks so that one page per stream that took large-pool
    /// memory stays within this share of the device (of the memory-fraction limit): many
    /// streams on a device small for them each keep partly used pages that no remap can take
    /// (Note \[Stream pages\] in `expandable/growth.rs`). In \[0, 1\]; 0 turns it off.
    /// Default 0.03: on an 80 GiB device the page stays 20 MiB up to 122 streams; on the
    /// generated workloads of 10 and 32 streams at their minimum capacity it takes the cases
    /// where classic needs less from 6 to 0 and 18 to 11 (POLICY.md, "Many streams"). PyTorch:
    /// off (20 MiB pages).
    pub stream_page_share: f64,
    /// The smallest page `stream_page_share` shrinks the large page to (bytes, rounded up to
    /// the granularity). Default 8 MiB: smaller pages cost more driver calls than PyTorch's
    /// policy makes on the 32-stream workload.
    pub stream_page_floor: usize,
    /// Gives adjacent free pages back to the device with one `cuMemUnmap` over all of them (one
    /// call may span many whole mappings; the H100 and H200 accept it) instead of one call per
    /// page, in `empty_cache` and wherever every free page is given back (Note \[Unmap runs\]
    /// in `expandable/release.rs`), and unmaps the pages a growth remaps from quiet streams at
    /// the growth's end, each run of adjacent ones with one call, instead of one call per page
    /// as each is taken (Note \[Harvest unmap runs\] in `expandable/growth.rs`). Changes no
    /// decision, only how many driver calls they take. Default on. PyTorch: one call per page.
    pub batch_unmaps: bool,
    /// With `pressure_tail`, where a whole page would not fit in the device and the allocator
    /// holds memory for the growing stream alone, the last handle takes everything the device
    /// has left (at most a page) instead of only what the request needs: the next requests land
    /// in it instead of growing again, a few MiB and three driver calls each (Note
    /// \[Headroom\] in `expandable/growth.rs`). With other streams holding memory the rest stays
    /// with the device, for whichever stream needs it. Default on. PyTorch: off (no tails).
    pub tail_takes_rest: bool,
    /// Where PyTorch's last resort (give every free page back, grow again) still cannot serve a
    /// large request, serve it from the free tail of one partly used page and the free head of
    /// another, each mapped a second time around new memory (Note \[Alias rescue\] in
    /// `expandable/rescue.rs`). Acts only where the request would otherwise fail with an OOM.
    /// Default on. PyTorch: no (the OOM is raised).
    pub alias_rescue: bool,
    /// With `alias_rescue`, rescue on after an OOM was raised, too. Off (the default), an OOM
    /// the rescue could not prevent pauses it until the next `empty_cache`: a program that
    /// catches OOMs and goes on with a full device gets PyTorch's behaviour there, where rescues
    /// pin partly used pages and beget more rescues (7 × the time at 25 % fewer failures on a
    /// full device's churn; Note \[Alias rescue\] in `expandable/rescue.rs`). A run with no OOM
    /// is the same with either.
    pub rescue_after_oom: bool,
    /// A growth that cannot get the memory it must map (the device's room, the handle cache and
    /// every free page it may remap fall short) fails before it reserves, harvests or maps
    /// anything (Note \[Hopeless growth\] in `expandable/hopeless.rs`): the same decisions with
    /// fewer driver calls on every request that reaches the last resort. Default on. PyTorch:
    /// off (the growth's calls are made and undone).
    pub skip_hopeless_growth: bool,
    /// After the last resort (every free page unmapped, the request retried) serves a request,
    /// the pages it unmapped and nothing used are mapped back where they were, as free memory of
    /// their streams, instead of released at the call's end and created again by the growths
    /// after it (Note \[Pages put back\] in `expandable/put_back.rs`). A call that raises an OOM
    /// still gives them all back. Default on. PyTorch: off.
    pub put_back_after_retry: bool,
    /// With `put_back_after_retry`, the pages of *other* streams the served last resort
    /// unmapped are kept, not released at the call's end, for the growths that would create a
    /// page of their length, which take one instead; a create that finds none releases kept
    /// pages for its room, as do an OOM and `empty_cache` (Note \[Kept pages\] in
    /// `expandable/kept.rs`). Every decision is the one made without it (kept pages count as
    /// the device's room): the same capacity and synchronizations, fewer creates and releases.
    /// Default on. PyTorch: off.
    pub keep_after_retry: bool,
    /// Where the driver refuses a new segment's `va_factor ×` device memory of addresses (the
    /// process's address space is short: many streams × devices), reserve the request alone
    /// instead of failing it (Note \[Address space budget\] in `expandable/growth.rs`). Default
    /// on. PyTorch: off (the request fails as out of memory).
    pub va_fallback: bool,
}

impl Default for ExpandableConfig {
    fn default() -> Self {
        Self {
            small_page: SMALL_BUFFER,
            large_page: 20 << 20,
            va_factor: 1.125,
            handle_cache: true,
            handle_cache_limit: 0,
            remap_defrag: true,
            sync_only_after_frees: true,
            peers: Vec::new(),
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            memory_fraction: 1.0,
            max_split_size: None,
            faithful_oversize: false,
            max_non_split_rounding: 20 << 20,
            pressure_tail: true,
            headroom_bytes: 0,
            headroom_fraction: 0.01,
            remap_before_create: false,
            borrow_across_pools: true,
            park_remaps: true,
            front_cache: FrontCacheMode::OnContention,
            best_fit_growth: true,
            reuse_last_free: true,
            reuse_last_free_above: 0.9,
            drain_after_sync: false,
            harvest_lowest_first: true,
            give_back_before_foreign_sync: false,
            give_back_below_free_pages: 0.05,
            give_back_below_all_free_pages: 0.15,
            fine_pages_above: 1.0,
            stream_page_share: 0.03,
            stream_page_floor: 8 << 20,
            batch_unmaps: true,
            tail_takes_rest: true,
            alias_rescue: true,
            rescue_after_oom: false,
            skip_hopeless_growth: true,
            put_back_after_retry: true,
            keep_after_retry: true,
            va_fallback: true,
        }
    }
}

impl ExpandableConfig {
    /// PyTorch's expandable-segments policy, for side-by-side measurement: 2 MiB small pages,
    /// 20 MiB large pages, no handle reuse (every unmap releases, every map creates), no remap
    /// (under pressure unmap every free page, then retry), a stream synchronization before every
    /// unmap, VA = 1.125 × device memory (a request fails where the driver refuses it), pages of the pool's size under pressure too, no
    /// headroom (growth takes the device's last free bytes before anything is unmapped), pools
    /// that never lend each other free ranges, and the oversize rules of `max_split_size`
    /// applied to expandable blocks.
    pub fn pytorch_expandable() -> Self {
        Self {
            handle_cache: false,
            remap_defrag: false,
            sync_only_after_frees: false,
            faithful_oversize: true,
            pressure_tail: false,
            headroom_bytes: 0,
            headroom_fraction: 0.0,
            remap_before_create: false,
            borrow_across_pools: false,
            park_remaps: false,
            front_cache: FrontCacheMode::Off,
            best_fit_growth: false,
            reuse_last_free: false,
            reuse_last_free_above: 0.9,
            harvest_lowest_first: false,
            give_back_below_free_pages: 0.0,
            give_back_below_all_free_pages: 0.0,
            stream_page_share: 0.0,
            batch_unmaps: false,
            tail_takes_rest: false,
            alias_rescue: false,
            skip_hopeless_growth: false,
            put_back_after_retry: false,
            keep_after_retry: false,
            va_fallback: false,
            ..Self::default()
        }
    }

    /// Applies the settings of a `PYTORCH_CUDA_ALLOC_CONF` string on top of `self`: only the
    /// fields the string mentions change (unlike PyTorch's runtime `_set_allocator_settings`,
    /// which resets `max_split_size_mb`, `roundup_power2_divisions` and
    /// `garbage_collection_threshold` when absent; a `ExpandableConfig` is built up from explicit values,
    /// so an absent key keeps the value already there).
    ///
    /// * `large_segment_size_mb` sets [`large_page`](Self::large_page) and, as in PyTorch, also
    ///   `max_non_split_rounding` unless `max_non_split_rounding_mb` is given;
    /// * `max_split_size_mb`, `max_non_split_rounding_mb`, `roundup_power2_divisions` and
    ///   `per_process_memory_fraction` set their fields;
    /// * `expandable_segments` and `garbage_collection_threshold` are accepted (validated with
    ///   PyTorch's rules) but do not apply here: this allocator is always expandable, and the
    ///   garbage collector is a classic-allocator feature (PyTorch's GC skips expandable blocks
    ///   too); [`ClassicAllocator`](crate::ClassicAllocator) honours it;
    /// * the other keys PyTorch knows (pinned memory, `backend`, ...) are validated and ignored;
    ///   unknown keys are an error.
    ///
    /// The minimum of `max_split_size_mb` is checked against the string's own
    /// `large_segment_size_mb` (20 when absent), as PyTorch does.
    ///
    /// ```
    /// use vmm_alloc::config::ExpandableConfig;
    /// let c = ExpandableConfig::default().with_alloc_conf("roundup_power2_divisions:4,large_segment_size_mb:64").unwrap();
    /// assert_eq!(c.large_page, 64 << 20);
    /// let d = ExpandableConfig { memory_fraction: 0.5, ..ExpandableConfig::default() }.with_alloc_conf("max_split_size_mb:128").unwrap();
    /// assert_eq!((d.memory_fraction, d.max_split_size), (0.5, Some(128 << 20)));
    /// assert!(ExpandableConfig::default().with_alloc_conf("max_split_size_mb:2").is_err());
    /// ```
    pub fn with_alloc_conf(mut self, conf: &str) -> Result<Self, ConfigError> {
        let parsed = parse_alloc_conf(conf)?;
        let given = |key: &str| parsed.was_given(key);
        if given("large_segment_size_mb") {
            self.large_page = parsed.large_segment_size;
        }
        if given("max_split_size_mb") {
            self.max_split_size = parsed.max_split_size;
        }
        if given("max_non_split_rounding_mb") || given("large_segment_size_mb") {
            self.max_non_split_rounding = parsed.max_non_split_rounding;
        }
        if given("roundup_power2_divisions") {
            self.roundup_power2_divisions = parsed.roundup_power2_divisions;
        }
        if given("per_process_memory_fraction") {
            self.memory_fraction = parsed.per_process_memory_fraction;
        }
        Ok(self)
    }

    /// Checks the values a caller may have set by hand.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |message: String| {
            Err(ConfigError {
                message,
                token: None,
            })
        };
        if self.small_page == 0 || self.large_page == 0 {
            return bad("page sizes must be non-zero".into());
        }
        if !(self.va_factor.is_finite() && self.va_factor >= 1.0 && self.va_factor <= 64.0) {
            return bad(format!("va_factor {} must be in [1, 64]", self.va_factor));
        }
        // Our own fractions (PyTorch's `per_process_memory_fraction` keeps its message below).
        for (name, value) in [
            ("headroom_fraction", self.headroom_fraction),
            (
                "give_back_below_free_pages",
                self.give_back_below_free_pages,
            ),
            (
                "give_back_below_all_free_pages",
                self.give_back_below_all_free_pages,
            ),
            ("fine_pages_above", self.fine_pages_above),
            ("reuse_last_free_above", self.reuse_last_free_above),
            ("stream_page_share", self.stream_page_share),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return bad(format!("{name} {value} must be in [0, 1]"));
            }
        }
        if !(0.0..=1.0).contains(&self.memory_fraction) {
            return bad("per_process_memory_fraction is invalid, set it in [0.0, 1.0]".into());
        }
        Ok(())
    }
}
