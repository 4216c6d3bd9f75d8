//! "Would a setting have saved my run?": replays one trace under the `PYTORCH_CUDA_ALLOC_CONF`
//! settings that matter (and under ours), on all cores, and recommends the smallest change that
//! fits the user's device.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::conf::{merge, settings};
use crate::replay::{min_capacity, replay, Policy, ReplayError, ReplayOptions, ReplayOutcome};
use crate::{Event, Trace};
use vmm_alloc::config::parse_alloc_conf;
use vmm_alloc::units::human_bytes;

/// The granularity of the minimum-capacity bisection (the Sim backend's page).
pub const CAPACITY_STEP: usize = 2 << 20;

/// Common GPU memory sizes, GiB: the default capacity is the smallest that held the recording.
pub const GPU_SIZES_GIB: [u64; 12] = [4, 6, 8, 12, 16, 24, 32, 40, 48, 80, 141, 192];

/// One configuration of the sweep: an allocator and a settings change (`None`: as recorded).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Candidate {
    /// The allocator.
    pub policy: Policy,
    /// The `PYTORCH_CUDA_ALLOC_CONF` change on top of the recorded settings.
    pub change: Option<String>,
    /// The trace was recorded with `expandable_segments:True`: PyTorch's expandable policy is
    /// then the configuration as recorded, and classic the one that needs a change
    /// (`expandable_segments:False`).
    pub recorded_expandable: bool,
}

impl Candidate {
    /// `classic max_split_size_mb:128`, `expandable_segments:True`, `vmm-alloc`, ...
    pub fn name(&self) -> String {
        let change = self.full_change();
        match self.policy {
            Policy::Classic if change.is_empty() => "classic (as recorded)".into(),
            Policy::Classic => format!("classic {change}"),
            Policy::PytorchExpandable if self.recorded_expandable && change.is_empty() => {
                "expandable_segments:True (as recorded)".into()
            }
            Policy::PytorchExpandable if change.is_empty() => "expandable_segments:True".into(),
            Policy::PytorchExpandable => format!("expandable_segments:True {change}"),
            Policy::Expandable if change.is_empty() => "vmm-alloc (ours)".into(),
            Policy::Expandable => format!("vmm-alloc (ours) {change}"),
        }
    }

    /// How many settings it changes (what "smallest change" counts): switching between
    /// PyTorch's two allocators counts as one.
    pub fn keys_changed(&self) -> usize {
        let switch = match self.policy {
            Policy::Classic => self.recorded_expandable,
            Policy::PytorchExpandable => !self.recorded_expandable,
            Policy::Expandable => false,
        };
        self.change.as_deref().map_or(0, |c| settings(c).len()) + usize::from(switch)
    }

    /// `change` with the switch of PyTorch allocator it needs in front (for classic after a
    /// recording with expandable segments, `expandable_segments:False`).
    fn full_change(&self) -> String {
        let change = self.change.as_deref().unwrap_or("");
        if self.policy == Policy::Classic && self.recorded_expandable {
            merge(Some("expandable_segments:False"), change)
        } else {
            change.to_string()
        }
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` a PyTorch program sets to run this configuration:
    /// `recorded` with the change and the allocator switch applied.
    pub fn pytorch_conf(&self, recorded: Option<&str>) -> String {
        let mut change = self.full_change();
        if self.policy == Policy::PytorchExpandable {
            change = merge(Some(&change), "expandable_segments:True");
        }
        merge(recorded, &change)
    }
}

/// Whether `trace` was recorded with `expandable_segments:True` (its recorded settings parse
/// and say so).
pub fn recorded_expandable(trace: &Trace) -> bool {
    trace
        .alloc_conf
        .as_deref()
        .and_then(|c| parse_alloc_conf(c).ok())
        .is_some_and(|c| c.expandable_segments)
}

/// The sweep: classic as recorded, under several `max_split_size_mb` values, power-of-two
/// rounding, both together, `max_split_size_mb` with `garbage_collection_threshold` (PyTorch's
/// documented recipe; the collector only acts under a memory fraction below 1, so alone it
/// changes nothing), PyTorch's expandable segments, and ours.
pub fn candidates() -> Vec<Candidate> {
    let classic = |c: &str| Candidate {
        policy: Policy::Classic,
        change: (!c.is_empty()).then(|| c.to_string()),
        recorded_expandable: false,
    };
    let mut out = vec![classic("")];
    for mb in [64, 128, 256, 512] {
        out.push(classic(&format!("max_split_size_mb:{mb}")));
    }
    for d in [2, 4, 8] {
        out.push(classic(&format!("roundup_power2_divisions:{d}")));
    }
    for mb in [128, 512] {
        out.push(classic(&format!(
            "max_split_size_mb:{mb},roundup_power2_divisions:4"
        )));
        out.push(classic(&format!(
            "max_split_size_mb:{mb},garbage_collection_threshold:0.8"
        )));
    }
    for policy in [Policy::PytorchExpandable, Policy::Expandable] {
        out.push(Candidate {
            policy,
            change: None,
            recorded_expandable: false,
        });
    }
    out
}

/// Ours' setting for programs whose streams each hold slowly growing tensors (Note [Give back
/// before foreign sync] in vmm-alloc's `expandable/growth.rs`): tried on traces with several
/// streams, where it can change something.
pub const SEVERAL_STREAMS_SETTING: &str = "give_back_before_foreign_sync:true";

/// Ours' setting for a device nearly full (Note [Fine pages] in vmm-alloc's
/// `expandable/growth.rs`): 2 MiB pages for what is mapped past 85 % of it.
pub const NEAR_FULL_SETTING: &str = "fine_pages_above:0.85";

/// Ours' setting for the smallest device a program can run on, whatever the driver calls: every
/// large-pool page 2 MiB (the granularity) instead of 20, so that no page holds free bytes a
/// live block pins beyond one granule, at 2–9 × PyTorch's expandable policy's driver calls
/// while memory grows (POLICY.md, "The other side of the conflict: 2 MiB pages"). Tried last on
/// every trace, so it is recommended only where no cheaper configuration fits.
pub const SMALLEST_SETTING: &str = "large_page_mb:2";

/// The sweep for `trace`: [`candidates`], ours with [`NEAR_FULL_SETTING`], when the trace
/// allocates on more than one stream ours with [`SEVERAL_STREAMS_SETTING`] and with both, and
/// last ours with [`SMALLEST_SETTING`].
pub fn candidates_for(trace: &Trace) -> Vec<Candidate> {
    let recorded = recorded_expandable(trace);
    let mut out = candidates();
    for c in &mut out {
        c.recorded_expandable = recorded;
    }
    let ours = |change: String| Candidate {
        policy: Policy::Expandable,
        change: Some(change),
        recorded_expandable: recorded,
    };
    out.push(ours(NEAR_FULL_SETTING.to_string()));
    let mut streams = trace
        .initial
        .iter()
        .map(|b| b.stream)
        .chain(trace.events.iter().filter_map(|e| match *e {
            Event::Alloc { stream, .. } | Event::FailedAlloc { stream, .. } => Some(stream),
            _ => None,
        }));
    let first = streams.next();
    if streams.any(|s| Some(s) != first) {
        out.push(ours(SEVERAL_STREAMS_SETTING.to_string()));
        out.push(ours(format!(
            "{NEAR_FULL_SETTING},{SEVERAL_STREAMS_SETTING}"
        )));
    }
    out.push(ours(SMALLEST_SETTING.to_string()));
    out
}

/// One configuration's figures.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// What ran.
    pub candidate: Candidate,
    /// The run at the capacity asked for.
    pub at_capacity: ReplayOutcome,
    /// The smallest capacity without an OOM (`None`: not even the unconstrained run's peak).
    pub min_capacity: Option<u64>,
}

impl Verdict {
    /// It replays the trace in the capacity without an OOM.
    pub fn fits(&self) -> bool {
        self.at_capacity.ooms == 0
    }
}

/// Replays `trace` through `candidate` at `capacity`, and finds its minimum capacity.
pub fn evaluate(
    trace: &Trace,
    candidate: &Candidate,
    capacity: usize,
) -> Result<Verdict, ReplayError> {
    let opts = ReplayOptions {
        capacity,
        settings: candidate.change.clone(),
        timeline_points: 400,
        ..ReplayOptions::default()
    };
    let at_capacity = replay(trace, candidate.policy, &opts)?;
    // A device that holds the trace (the one asked for when it fits, else an unconstrained
    // one), and the bisection's upper end: the peak the trace reached there.
    let (holds, upper) = if at_capacity.ooms == 0 {
        (capacity, at_capacity.peak_reserved_bytes as usize)
    } else {
        let roomy = ReplayOptions {
            capacity: capacity.saturating_mul(4).max(1 << 40),
            timeline_points: 1,
            diagnose: false,
            ..opts.clone()
        };
        let peak = replay(trace, candidate.policy, &roomy)?.peak_reserved_bytes as usize;
        (roomy.capacity, peak)
    };
    let quiet = ReplayOptions {
        diagnose: false,
        ..opts.clone()
    };
    let mut min = min_capacity(
        trace,
        candidate.policy,
        &quiet,
        upper.max(CAPACITY_STEP),
        CAPACITY_STEP,
    )?;
    if min.is_none() && holds > upper {
        // A policy whose decisions depend on the device's size (ours' fine pages past a
        // fraction of it) may not fit on a device of exactly the peak it reached on a larger
        // one; it fits on `holds` (the capacity asked for, or an unconstrained device where it
        // did not fit that), so the bisection starts there.
        min = min_capacity(trace, candidate.policy, &quiet, holds, CAPACITY_STEP)?;
    }
    Ok(Verdict {
        candidate: candidate.clone(),
        at_capacity,
        min_capacity: min.map(|(c, _)| c as u64),
    })
}

/// Evaluates every candidate on `threads` threads (results in the candidates' order, whatever
/// the scheduling), calling `done` after each. One trace is shared; each run holds only its own
/// allocator and a bounded timeline, so memory grows with the trace, not with the sweep.
pub fn sweep(
    trace: &Trace,
    candidates: &[Candidate],
    capacity: usize,
    threads: usize,
    done: &(dyn Fn() + Sync),
) -> Result<Vec<Verdict>, String> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Verdict, ReplayError>>>> =
        Mutex::new(vec![None; candidates.len()].into_iter().collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, candidates.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = candidates.get(i) else { break };
                let r = evaluate(trace, c, capacity);
                if let Ok(mut all) = results.lock() {
                    all[i] = Some(r);
                }
                done();
            });
        }
    });
    let all = results
        .into_inner()
        .map_err(|_| "a sweep thread panicked".to_string())?;
    all.into_iter()
        .zip(candidates)
        .map(|(r, c)| match r {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(format!("{}: {e}", c.name())),
            None => Err(format!("{}: not run", c.name())),
        })
        .collect()
}

/// The capacity `advise` assumes without `--capacity`: the smallest common GPU that held what
/// the traced program reserved (or, without a record, its peak live memory); and the sentence
/// that says so.
pub fn default_capacity(trace: &Trace) -> (u64, String) {
    let (need, what) = match trace.recorded {
        Some(r) if r.peak_reserved_bytes > 0 => (r.peak_reserved_bytes, "reserved at its peak"),
        _ => (
            trace.peak_live_bytes(),
            "live at its peak (no record of reserved memory)",
        ),
    };
    let gib = GPU_SIZES_GIB
        .into_iter()
        .find(|&g| g << 30 >= need)
        .unwrap_or(need.div_ceil(1 << 30));
    (
        gib << 30,
        format!(
            "capacity {gib} GiB: the smallest common GPU that holds the {} the traced program {what}; pass --capacity for yours",
            human_bytes(need)
        ),
    )
}

/// The moment the trace needed the most live memory: its event index, the bytes, and the
/// largest allocations live then (event index and size, largest first, at most `top`).
pub fn peak_live_moment(trace: &Trace, top: usize) -> (u64, u64, Vec<(u64, u64)>) {
    let mut live: std::collections::HashMap<u64, (u64, u64)> =
        trace.initial.iter().map(|b| (b.id, (0, b.size))).collect();
    let mut bytes: u64 = live.values().map(|v| v.1).sum();
    let (mut peak, mut at) = (bytes, 0u64);
    let largest = |live: &std::collections::HashMap<u64, (u64, u64)>| {
        let mut v: Vec<(u64, u64)> = live.values().copied().collect();
        v.sort_by_key(|&(e, s)| (std::cmp::Reverse(s), e));
        v.truncate(top);
        v
    };
    let mut held = largest(&live);
    let base = trace.initial.len() as u64;
    for (i, e) in trace.events.iter().enumerate() {
        let index = base + i as u64;
        match *e {
            Event::Alloc { id, size, .. } => {
                live.insert(id, (index, size));
                bytes += size;
            }
            Event::Free { id } => bytes -= live.remove(&id).map_or(0, |v| v.1),
            Event::EmptyCache => {}
            Event::FailedAlloc { size, .. } => {
                if bytes + size > peak {
                    peak = bytes + size;
                    at = index;
                    held = largest(&live);
                    held.insert(0, (index, size));
                    held.truncate(top);
                }
                continue;
            }
        }
        if bytes > peak {
            peak = bytes;
            at = index;
            held = largest(&live);
        }
    }
    (at, peak, held)
}

/// The advice: one verdict line and what to paste.
pub fn recommend(trace: &Trace, capacity: u64, verdicts: &[Verdict]) -> String {
    let recorded = trace.alloc_conf.as_deref().filter(|c| !c.is_empty());
    let env = |c: &Candidate| format!("PYTORCH_CUDA_ALLOC_CONF={}", c.pytorch_conf(recorded));
    let cap = human_bytes(capacity);
    let pytorch_fit = verdicts
        .iter()
        .filter(|v| v.candidate.policy != Policy::Expandable && v.fits())
        .min_by_key(|v| {
            (
                v.candidate.keys_changed(),
                v.min_capacity.unwrap_or(u64::MAX),
            )
        });
    if let Some(v) = pytorch_fit {
        if v.candidate.keys_changed() == 0 {
            return format!(
                "your current settings fit in {cap} (peak reserved {}): no change needed",
                human_bytes(v.at_capacity.peak_reserved_bytes)
            );
        }
        return format!(
            "the smallest change that fits in {cap} ({}, peak reserved {}):\n\n    export {}\n",
            v.candidate.name(),
            human_bytes(v.at_capacity.peak_reserved_bytes),
            env(&v.candidate)
        );
    }
    if let Some(v) = verdicts
        .iter()
        .find(|v| v.candidate.policy == Policy::Expandable && v.fits())
    {
        // Ours' own settings go in VMM_ALLOC_CONF, read by `install()`.
        let conf = v.candidate.change.as_deref().map_or(String::new(), |c| {
            format!("    export VMM_ALLOC_CONF={c}   # in the shell that starts the program\n")
        });
        let mut advice = format!(
            "no PYTORCH_CUDA_ALLOC_CONF setting fits in {cap}; {} does (peak reserved {}): switch to it, before the first CUDA allocation:\n\n{conf}    import vmm_alloc\n    vmm_alloc.install()\n",
            v.candidate.name(),
            human_bytes(v.at_capacity.peak_reserved_bytes)
        );
        if v.candidate.change.as_deref() == Some(SMALLEST_SETTING) {
            // The smallest footprint's price, said where it is recommended: a page costs the
            // driver about the same whatever its size (GPU.md).
            let defaults = verdicts
                .iter()
                .find(|d| d.candidate.policy == Policy::Expandable && d.candidate.change.is_none());
            if let Some(d) = defaults {
                advice.push_str(&format!(
                    "\n2 MiB pages cost driver calls: {} in this run against {} with vmm-alloc's defaults (each page is mapped on its own, so growing takes longer)\n",
                    v.at_capacity.driver_calls, d.at_capacity.driver_calls
                ));
            }
        }
        return advice;
    }
    let (at, live, held) = peak_live_moment(trace, 5);
    let list: Vec<String> = held
        .iter()
        .map(|&(e, s)| format!("{} (event {e})", human_bytes(s)))
        .collect();
    format!(
        "no setting fits in {cap}: you need {} of live memory at event {at} (the largest allocations then: {}); the closest, {}, needs {}",
        human_bytes(live),
        list.join(", "),
        verdicts
            .iter()
            .min_by_key(|v| v.min_capacity.unwrap_or(u64::MAX))
            .map_or("none".into(), |v| v.candidate.name()),
        verdicts
            .iter()
            .filter_map(|v| v.min_capacity)
            .min()
            .map_or("more than was tried".into(), human_bytes)
    )
}
