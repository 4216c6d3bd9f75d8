//! The replay engine: drives an allocator over a [`Trace`] on the Sim backend (exact, no GPU)
//! and measures what it needed.

use rustc_hash::FxHashMap;
use std::time::Instant;

use crate::conf::{effective, Setup};
use crate::diagnosis::{diagnose, OomMoment, Request};
use crate::dump::recorder::Recorder;
use crate::dump::SnapshotDump;
use crate::{Event, Trace};
use vmm_alloc::backend::{CallCounts, SimBackend, SimConfig};
use vmm_alloc::config::{parse_alloc_conf, AllocConf, ConfigError, ExpandableConfig};
use vmm_alloc::error::AllocError;
use vmm_alloc::{Allocation, Allocator, ClassicAllocator, ExpandableAllocator, StreamId};

/// An allocator policy the replay tool compares.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Policy {
    /// PyTorch's classic caching allocator ([`ClassicAllocator`]), configured by the trace's
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    Classic,
    /// PyTorch's expandable segments, faithfully ([`ExpandableConfig::pytorch_expandable`]).
    PytorchExpandable,
    /// Ours, with its defaults ([`ExpandableConfig::default`]).
    Expandable,
}

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 3] = [
        Policy::Classic,
        Policy::PytorchExpandable,
        Policy::Expandable,
    ];

    /// The expandable-segments policies: PyTorch's and ours.
    pub const EXPANDABLE: [Policy; 2] = [Policy::PytorchExpandable, Policy::Expandable];

    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Classic => "classic",
            Policy::PytorchExpandable => "pytorch-expandable",
            Policy::Expandable => "expandable",
        }
    }

    /// Looks a policy up by its name.
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// An expandable policy's configuration, with the traced program's `PYTORCH_CUDA_ALLOC_CONF`
    /// applied when it parses (rounding, memory fraction, `max_split_size`); `None` for
    /// [`Policy::Classic`], which takes [`Policy::alloc_conf`] instead.
    pub fn config(self, alloc_conf: Option<&str>) -> Option<ExpandableConfig> {
        let base = match self {
            Policy::Classic => return None,
            Policy::PytorchExpandable => ExpandableConfig::pytorch_expandable(),
            Policy::Expandable => ExpandableConfig::default(),
        };
        Some(match alloc_conf {
            Some(conf) => base.clone().with_alloc_conf(conf).unwrap_or(base),
            None => base,
        })
    }

    /// The classic allocator's configuration: the traced program's `PYTORCH_CUDA_ALLOC_CONF` when
    /// it parses, else PyTorch's defaults.
    pub fn alloc_conf(alloc_conf: Option<&str>) -> AllocConf {
        alloc_conf
            .and_then(|c| parse_alloc_conf(c).ok())
            .unwrap_or_default()
    }
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Physical memory of the simulated device. Default 80 GiB (an H100).
    pub capacity: usize,
    /// Replay the traced program's `empty_cache()` calls. Default true.
    pub replay_empty_cache: bool,
    /// Points of the live/reserved timeline kept (each the maximum over its stretch of events).
    pub timeline_points: usize,
    /// Apply the trace's recorded `PYTORCH_CUDA_ALLOC_CONF`. Default true.
    pub use_trace_settings: bool,
    /// Record the allocator's history and final state in [`ReplayOutcome::history`], to write as
    /// a PyTorch memory snapshot. Default false: a replay that records nothing pays nothing.
    pub record_history: bool,
    /// A `PYTORCH_CUDA_ALLOC_CONF` change applied on top of the trace's recorded settings (keys
    /// it sets replace the recorded ones), validated: `--conf ALLOCATOR=SETTINGS`.
    pub settings: Option<String>,
    /// Explain the OOM moments ([`ReplayOutcome::oom_moments`]). Default true.
    pub diagnose: bool,
    /// Place the simulated device's reservations at its highest free addresses first
    /// ([`SimConfig::reserve_from_top`]); default false. Ours decides alike either way (Note
    /// \[Segment order\] in the library's `expandable/growth.rs`); classic and PyTorch's
    /// expandable policy, like PyTorch's, order blocks by address.
    pub reserve_from_top: bool,
}

/// Replayed OOMs explained per run (the first ones; recorded failed requests always are, up to
/// the same bound again): the first shows the fragmentation, the rest repeat it.
pub const MAX_OOM_MOMENTS: usize = 4;

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            capacity: 80 << 30,
            replay_empty_cache: true,
            timeline_points: 1000,
            use_trace_settings: true,
            record_history: false,
            settings: None,
            diagnose: true,
            reserve_from_top: false,
        }
    }
}

/// A replay that could not go on: an error that is not an out-of-memory (those are counted, not
/// raised), with the event of the trace where it happened when there was one (errors of the
/// allocator's setup have none).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}{source}", self.at())]
pub struct ReplayError {
    /// Index of the event among those replayed (initial blocks first), and what it was.
    pub event: Option<(u64, String)>,
    /// What the allocator said.
    #[source]
    pub source: AllocError,
}

impl ReplayError {
    fn at(&self) -> String {
        match &self.event {
            Some((i, what)) => format!("event {i} ({what}): "),
            None => String::new(),
        }
    }
}

impl From<AllocError> for ReplayError {
    fn from(source: AllocError) -> Self {
        Self {
            event: None,
            source,
        }
    }
}

/// One point of the timeline: the maxima over a stretch of events.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TimelinePoint {
    /// Index of the last event of the stretch.
    pub event: u64,
    /// Live requested bytes.
    pub live: u64,
    /// Physical bytes held by the allocator (mapped pages plus cached handles).
    pub reserved: u64,
}

/// What one allocator needed for one trace.
#[derive(Clone, Debug)]
pub struct ReplayOutcome {
    /// The policy's name.
    pub allocator: &'static str,
    /// The `PYTORCH_CUDA_ALLOC_CONF` settings it replayed with (the trace's with any change on
    /// top; empty: the defaults).
    pub settings: String,
    /// The simulated device's capacity.
    pub capacity_bytes: u64,
    /// Peak of live requested bytes (what the program needed at least).
    pub peak_live_bytes: u64,
    /// Peak physical memory held: mapped pages plus cached handles.
    pub peak_reserved_bytes: u64,
    /// `peak_live_bytes / peak_reserved_bytes`.
    pub utilization: f64,
    /// Allocations that failed with out-of-memory (skipped; their frees too), recorded failed
    /// requests included.
    pub ooms: u64,
    /// The trace's recorded failed requests (`oom` entries) replayed.
    pub recorded_ooms: u64,
    /// Of them, the ones this allocator served.
    pub recorded_ooms_served: u64,
    /// cudaMalloc retries: allocations that succeeded only after the cache was released
    /// (PyTorch's `num_alloc_retries`; each synchronizes every stream).
    pub alloc_retries: u64,
    /// The OOM moments explained (up to [`MAX_OOM_MOMENTS`] replayed OOMs and as many recorded
    /// failed requests), in event order.
    pub oom_moments: Vec<OomMoment>,
    /// Backend calls the allocator made, all kinds.
    pub driver_calls: u64,
    /// The same by kind (`cuMemCreate`, `cuMemMap`, `cuStreamSynchronize`, ...).
    pub calls: CallCounts,
    /// Bytes of physical handles created (PyTorch's policy re-creates under pressure).
    pub bytes_created: u64,
    /// Events replayed (initial blocks included).
    pub events: u64,
    /// Wall time of the replay.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_second: f64,
    /// Live and reserved bytes over the trace.
    pub timeline: Vec<TimelinePoint>,
    /// The history and final state, when [`ReplayOptions::record_history`] was set.
    pub history: Option<SnapshotDump>,
}

/// How many events pass between two calls of a replay's progress callback.
pub const PROGRESS_EVERY: u64 = 1 << 16;

/// Replays `trace` through `policy` on a fresh Sim device.
pub fn replay(
    trace: &Trace,
    policy: Policy,
    opts: &ReplayOptions,
) -> Result<ReplayOutcome, ReplayError> {
    replay_with_progress(trace, policy, opts, &mut |_| {})
}

/// [`replay`], calling `progress` with the number of events replayed so far every
/// [`PROGRESS_EVERY`] events and once at the end (for a progress bar).
pub fn replay_with_progress(
    trace: &Trace,
    policy: Policy,
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayOutcome, ReplayError> {
    let capacity = opts.capacity.next_multiple_of(2 << 20);
    let sim = SimBackend::with_config(SimConfig {
        capacity,
        reserve_from_top: opts.reserve_from_top,
        ..SimConfig::default()
    })
    .map_err(AllocError::from)?;
    let conf = opts
        .use_trace_settings
        .then_some(trace.alloc_conf.as_deref())
        .flatten();
    let (text, setup) = effective(policy, conf, opts.settings.as_deref()).map_err(|message| {
        AllocError::from(ConfigError {
            message,
            token: None,
        })
    })?;
    let config = match setup {
        Setup::Classic(c) => {
            let alloc = ClassicAllocator::new(sim, c)?;
            // Dumping a classic replay as a snapshot is not supported yet: no history.
            return drive(trace, policy, opts, capacity, &alloc, None, progress, text);
        }
        Setup::Expandable(config) => config,
    };
    let alloc = ExpandableAllocator::new(sim, config.clone())?;
    let history = opts.record_history.then(|| {
        let applied = (!text.is_empty()).then(|| text.clone());
        Recorder::new(&alloc, capacity as u64, config, applied)
    });
    drive(
        trace, policy, opts, capacity, &alloc, history, progress, text,
    )
}

/// Replays `trace` through `alloc` and measures it.
#[allow(clippy::too_many_arguments)] // one private call site each, all of it needed
fn drive<A: Allocator>(
    trace: &Trace,
    policy: Policy,
    opts: &ReplayOptions,
    capacity: usize,
    alloc: &A,
    history: Option<Recorder>,
    progress: &mut dyn FnMut(u64),
    settings: String,
) -> Result<ReplayOutcome, ReplayError> {
    let total = (trace.initial.len() + trace.events.len()) as u64;
    let stride = (total / opts.timeline_points.max(1) as u64).max(1);
    let mut run = Run {
        alloc,
        live: FxHashMap::default(),
        live_bytes: 0,
        peak_live: 0,
        peak_reserved: 0,
        ooms: 0,
        timeline: Vec::new(),
        bucket: TimelinePoint {
            event: 0,
            live: 0,
            reserved: 0,
        },
        stride,
        index: 0,
        history,
        capacity: capacity as u64,
        diagnose: opts.diagnose,
        recorded_ooms: 0,
        recorded_served: 0,
        moments: Vec::new(),
    };
    let start = Instant::now();
    for (i, b) in trace.initial.iter().enumerate() {
        let what = || {
            format!(
                "initial block {} of {} bytes on stream {}",
                b.id, b.size, b.stream
            )
        };
        run.alloc(b.id, b.size, b.stream).map_err(at(i, what))?;
    }
    let first = trace.initial.len();
    for (i, e) in trace.events.iter().enumerate() {
        if i as u64 % PROGRESS_EVERY == PROGRESS_EVERY - 1 {
            progress(trace.initial.len() as u64 + i as u64);
        }
        let done = match *e {
            Event::Alloc { id, size, stream } => run.alloc(id, size, stream),
            Event::Free { id } => run.free(id),
            Event::EmptyCache if opts.replay_empty_cache => {
                alloc.empty_cache().map(|()| run.tick())
            }
            Event::EmptyCache => {
                run.tick();
                Ok(())
            }
            Event::FailedAlloc { size, stream } => run.failed_alloc(size, stream),
        };
        done.map_err(at(first + i, || describe(e)))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    progress(total);
    if run.bucket.event > 0 || run.timeline.is_empty() {
        run.timeline.push(run.bucket);
    }
    let stats = alloc.stats();
    let history = run.history.take().map(|h| h.finish(alloc));
    let (peak_live, peak_reserved, ooms, timeline) =
        (run.peak_live, run.peak_reserved, run.ooms, run.timeline);
    Ok(ReplayOutcome {
        allocator: policy.name(),
        settings,
        recorded_ooms: run.recorded_ooms,
        recorded_ooms_served: run.recorded_served,
        alloc_retries: stats.num_alloc_retries,
        oom_moments: run.moments,
        capacity_bytes: capacity as u64,
        peak_live_bytes: peak_live,
        peak_reserved_bytes: peak_reserved,
        utilization: if peak_reserved == 0 {
            0.0
        } else {
            peak_live as f64 / peak_reserved as f64
        },
        ooms,
        driver_calls: stats.calls.total(),
        calls: stats.calls,
        bytes_created: stats.bytes_created,
        events: total,
        seconds,
        events_per_second: if seconds > 0.0 {
            total as f64 / seconds
        } else {
            0.0
        },
        timeline,
        history,
    })
}

/// What makes an error of event `i` a [`ReplayError`] naming it; `what` describes the event,
/// called only on error (a replay runs millions of events).
fn at(i: usize, what: impl FnOnce() -> String) -> impl FnOnce(AllocError) -> ReplayError {
    move |source| ReplayError {
        event: Some((i as u64, what())),
        source,
    }
}

/// An event in words, for an error that names it.
fn describe(e: &Event) -> String {
    match *e {
        Event::Alloc { id, size, stream } => {
            format!("allocation {id} of {size} bytes on stream {stream}")
        }
        Event::Free { id } => format!("free of allocation {id}"),
        Event::EmptyCache => "empty_cache()".to_string(),
        Event::FailedAlloc { size, stream } => {
            format!("the recorded failed request of {size} bytes on stream {stream}")
        }
    }
}

/// The smallest capacity (a multiple of `step`) with which `trace` replays through `policy` with
/// no OOM, found by bisection between the peak live bytes and `upper`; `None` if even `upper`
/// is not enough. Bisection assumes that a trace that fits a capacity fits every larger one;
/// where it does not (a policy's pressure decisions change with the capacity), the result
/// fits and `result - step` does not, but a smaller capacity may fit again. Also returns the outcome of the run at that capacity (without history: the
/// bisection's runs record none).
pub fn min_capacity(
    trace: &Trace,
    policy: Policy,
    opts: &ReplayOptions,
    upper: usize,
    step: usize,
) -> Result<Option<(usize, ReplayOutcome)>, ReplayError> {
    let step = step.max(1);
    let at = |capacity: usize| {
        replay(
            trace,
            policy,
            &ReplayOptions {
                capacity,
                timeline_points: 1,
                record_history: false,
                diagnose: false,
                ..opts.clone()
            },
        )
    };
    let mut hi = upper.next_multiple_of(step);
    let Ok(mut best) = at(hi) else {
        return Ok(None);
    };
    if best.ooms > 0 {
        return Ok(None);
    }
    // The largest multiple of `step` below the peak live bytes: nothing fits there.
    let mut lo = (trace.peak_live_bytes() as usize).saturating_sub(1) / step * step;
    while hi - lo > step {
        let mid = (lo + (hi - lo) / 2) / step * step;
        let mid = if mid <= lo { lo + step } else { mid };
        let outcome = at(mid)?;
        if outcome.ooms == 0 {
            hi = mid;
            best = outcome;
        } else {
            lo = mid;
        }
    }
    Ok(Some((hi, best)))
}

struct Run<'a, A: Allocator> {
    alloc: &'a A,
    live: FxHashMap<u64, (Allocation, u64)>,
    live_bytes: u64,
    peak_live: u64,
    peak_reserved: u64,
    ooms: u64,
    timeline: Vec<TimelinePoint>,
    bucket: TimelinePoint,
    stride: u64,
    index: u64,
    /// The history, when recorded.
    history: Option<Recorder>,
    capacity: u64,
    diagnose: bool,
    recorded_ooms: u64,
    recorded_served: u64,
    moments: Vec<OomMoment>,
}

impl<A: Allocator> Run<'_, A> {
    fn alloc(&mut self, id: u64, size: u64, stream: u64) -> Result<(), AllocError> {
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        match self.alloc.allocate(size, StreamId::sim(stream)) {
            Ok(a) => {
                self.live_bytes += size as u64;
                self.peak_live = self.peak_live.max(self.live_bytes);
                if let Some(h) = &mut self.history {
                    h.alloc(&a);
                }
                // A reused id (a reader's bug) must not leak the earlier allocation.
                if let Some((old, old_size)) = self.live.insert(id, (a, size as u64)) {
                    self.live_bytes -= old_size;
                    if let Some(h) = &mut self.history {
                        h.free(&old);
                    }
                    self.alloc.deallocate(old)?;
                }
            }
            Err(e) if e.is_out_of_memory() || matches!(e, AllocError::TooLarge { .. }) => {
                self.ooms += 1;
                let replayed = self.moments.iter().filter(|m| !m.recorded).count();
                if replayed < MAX_OOM_MOMENTS && self.diagnose {
                    // After the allocator's own release and retry: what it was left with.
                    let after = (self.alloc.snapshot(), self.alloc.held_bytes());
                    let request = Request {
                        event: self.index,
                        size: size as u64,
                        stream,
                        recorded: false,
                        served: false,
                        address_space_exhausted: out_of_addresses(&e),
                    };
                    self.explain(request, after);
                }
                if let Some(h) = &mut self.history {
                    h.oom(&e, size as u64, stream, self.alloc);
                }
            }
            Err(e) => return Err(e),
        }
        self.tick();
        Ok(())
    }

    /// A request the traced program's allocator failed: served and freed at once, or an OOM.
    fn failed_alloc(&mut self, size: u64, stream: u64) -> Result<(), AllocError> {
        self.recorded_ooms += 1;
        let bytes = usize::try_from(size).unwrap_or(usize::MAX);
        let explain = self.moments.iter().filter(|m| m.recorded).count() < MAX_OOM_MOMENTS;
        // The picture before the request: what the program's allocator faced.
        let before =
            (explain && self.diagnose).then(|| (self.alloc.snapshot(), self.alloc.held_bytes()));
        let mut va = false;
        let served = match self.alloc.allocate(bytes, StreamId::sim(stream)) {
            Ok(a) => {
                self.peak_live = self.peak_live.max(self.live_bytes + size);
                let reserved = self.alloc.held_bytes();
                self.peak_reserved = self.peak_reserved.max(reserved);
                self.bucket.live = self.bucket.live.max(self.live_bytes + size);
                self.alloc.deallocate(a)?;
                self.recorded_served += 1;
                true
            }
            Err(e) if e.is_out_of_memory() || matches!(e, AllocError::TooLarge { .. }) => {
                self.ooms += 1;
                va = out_of_addresses(&e);
                false
            }
            Err(e) => return Err(e),
        };
        if let Some(before) = before {
            let request = Request {
                event: self.index,
                size,
                stream,
                recorded: true,
                served,
                address_space_exhausted: va,
            };
            self.explain(request, before);
        }
        self.tick();
        Ok(())
    }

    /// Records the picture of an OOM moment for `request` from the allocator's state `before`
    /// (its snapshot and held bytes).
    fn explain(&mut self, request: Request, before: (vmm_alloc::snapshot::Snapshot, u64)) {
        let (snapshot, reserved) = before;
        self.moments.push(diagnose(
            request,
            &snapshot,
            self.live_bytes,
            reserved,
            self.capacity,
        ));
    }

    fn free(&mut self, id: u64) -> Result<(), AllocError> {
        // Frees of allocations that failed are skipped, as the program would not have made them.
        if let Some((a, size)) = self.live.remove(&id) {
            self.live_bytes -= size;
            if let Some(h) = &mut self.history {
                h.free(&a);
            }
            self.alloc.deallocate(a)?;
        }
        self.tick();
        Ok(())
    }

    /// Ends one replayed event.
    fn tick(&mut self) {
        if let Some(h) = &mut self.history {
            h.end_step(self.alloc, &self.alloc.stats());
        }
        let reserved = self.alloc.held_bytes();
        self.peak_reserved = self.peak_reserved.max(reserved);
        self.bucket.live = self.bucket.live.max(self.live_bytes);
        self.bucket.reserved = self.bucket.reserved.max(reserved);
        self.bucket.event = self.index;
        self.index += 1;
        if self.index.is_multiple_of(self.stride) {
            self.timeline.push(self.bucket);
            self.bucket = TimelinePoint {
                event: self.index,
                live: 0,
                reserved: 0,
            };
        }
    }
}

/// Whether `e` is an out-of-memory for want of addresses, not device memory.
fn out_of_addresses(e: &AllocError) -> bool {
    matches!(e, AllocError::OutOfMemory(r) if r.address_space_exhausted)
}

#[cfg(test)]
mod tests;
