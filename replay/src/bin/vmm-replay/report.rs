//! The comparison: a table for people, JSON for machines (field names are stable: see the README).

use serde_json::{json, Map, Value};
use vmm_alloc::backend::CallKind;
use vmm_alloc::units::human_bytes;
use vmm_replay::diagnosis::OomMoment;
use vmm_replay::replay::ReplayOutcome;
use vmm_replay::Trace;

/// Everything measured for one trace.
pub struct TraceReport {
    pub trace: Trace,
    pub outcomes: Vec<AllocatorReport>,
}

/// One allocator's figures on one trace.
pub struct AllocatorReport {
    /// The run at the capacity asked for.
    pub outcome: ReplayOutcome,
    /// With `--min-capacity`: the smallest capacity without OOM and the run at it (`None` inside
    /// when even the capacity asked for, or the allocator's own peak, was not enough).
    pub at_min: Option<Option<(usize, ReplayOutcome)>>,
}

fn start(t: &Trace) -> String {
    if t.skipped_frees == 0 {
        t.start.to_string()
    } else {
        format!("{} ({} frees skipped)", t.start, t.skipped_frees)
    }
}

/// The table, one row per trace and allocator, then a summary line per allocator when there
/// are several traces.
pub fn table(reports: &[TraceReport]) -> String {
    let with_min = reports
        .iter()
        .flat_map(|r| &r.outcomes)
        .any(|a| a.at_min.is_some());
    let mut out = String::from(
        "| trace | start | events | allocator | peak live | peak reserved | utilization | OOMs | driver calls | syncs | created | Mevents/s | recorded reserved |",
    );
    let mut rule = String::from("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    if with_min {
        out.push_str(" min capacity | calls at min | syncs at min | created at min |");
        rule.push_str("--:|--:|--:|--:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    for r in reports {
        let recorded = r
            .trace
            .recorded
            .map_or("-".into(), |x| human_bytes(x.peak_reserved_bytes));
        for a in &r.outcomes {
            let o = &a.outcome;
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {:.2} | {} |",
                r.trace.name,
                start(&r.trace),
                o.events,
                label(o),
                human_bytes(o.peak_live_bytes),
                human_bytes(o.peak_reserved_bytes),
                o.utilization,
                o.ooms,
                o.driver_calls,
                syncs(o),
                human_bytes(o.bytes_created),
                o.events_per_second / 1e6,
                recorded
            ));
            match &a.at_min {
                None => {}
                Some(None) => out.push_str(&format!(
                    " over {} (raise --capacity) | - | - | - |",
                    human_bytes(o.capacity_bytes.max(o.peak_reserved_bytes))
                )),
                Some(Some((c, at))) => out.push_str(&format!(
                    " {} | {} | {} | {} |",
                    human_bytes(*c as u64),
                    at.driver_calls,
                    syncs(at),
                    human_bytes(at.bytes_created)
                )),
            }
            out.push('\n');
        }
    }
    if reports.len() > 1 {
        out.push('\n');
        out.push_str(&summary(reports));
    }
    out.push_str(&skipped(reports));
    out.push_str(&ooms(reports));
    out
}

/// What the readers skipped on purpose, per trace that skipped anything.
fn skipped(reports: &[TraceReport]) -> String {
    let mut out = String::new();
    for r in reports.iter().filter(|r| !r.trace.skipped.is_empty()) {
        if out.is_empty() {
            out.push_str("\nSkipped on purpose (understood, not needed to replay):\n");
        }
        let kinds: Vec<String> = r
            .trace
            .skipped
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        out.push_str(&format!("  {}: {}\n", r.trace.name, kinds.join(", ")));
    }
    out
}

/// The allocator and the settings it ran with: `classic (max_split_size_mb:128)`.
pub fn label(o: &ReplayOutcome) -> String {
    if o.settings.is_empty() {
        o.allocator.to_string()
    } else {
        format!("{} ({})", o.allocator, o.settings)
    }
}

/// The OOM moments, explained, per trace and allocator.
fn ooms(reports: &[TraceReport]) -> String {
    let mut out = String::new();
    for r in reports {
        for a in &r.outcomes {
            let o = &a.outcome;
            if o.oom_moments.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "\nOOM diagnosis, {} / {} on {}:\n",
                r.trace.name,
                label(o),
                human_bytes(o.capacity_bytes)
            ));
            if o.recorded_ooms > 0 {
                out.push_str(&format!(
                    "  the trace records {} failed request(s); this allocator served {}\n",
                    o.recorded_ooms, o.recorded_ooms_served
                ));
            }
            // Every recorded moment, and the first replayed one (the rest are in --json).
            let mut shown = 0u64;
            for m in &o.oom_moments {
                if m.recorded || shown == 0 {
                    out.push_str(&m.describe());
                    shown += u64::from(!m.recorded);
                }
            }
            let replayed = o.ooms - (o.recorded_ooms - o.recorded_ooms_served);
            if replayed > shown {
                out.push_str(&format!(
                    "  ... and {} more OOMs in this replay (--json explains the first few)\n",
                    replayed - shown
                ));
            }
        }
    }
    out
}

/// Stream synchronizations: on a GPU each one stalls the pipeline.
fn syncs(o: &ReplayOutcome) -> u64 {
    o.calls.calls(CallKind::Synchronize)
}

/// One line per allocator: sums over every trace.
fn summary(reports: &[TraceReport]) -> String {
    let mut out = String::new();
    let names: Vec<String> = reports
        .first()
        .map(|r| r.outcomes.iter().map(|a| label(&a.outcome)).collect())
        .unwrap_or_default();
    for name in names {
        let runs = reports
            .iter()
            .flat_map(|r| &r.outcomes)
            .filter(|a| label(&a.outcome) == name);
        let (mut live, mut reserved, mut created, mut ooms, mut calls) = (0, 0, 0, 0, 0);
        let (mut events, mut seconds) = (0, 0.0);
        let (mut min_sum, mut min_known) = (0u64, 0usize);
        let (mut min_calls, mut min_syncs, mut min_created) = (0, 0, 0);
        for a in runs {
            live += a.outcome.peak_live_bytes;
            reserved += a.outcome.peak_reserved_bytes;
            created += a.outcome.bytes_created;
            ooms += a.outcome.ooms;
            calls += a.outcome.driver_calls;
            events += a.outcome.events;
            seconds += a.outcome.seconds;
            if let Some(Some((c, at))) = &a.at_min {
                min_sum += *c as u64;
                min_known += 1;
                min_calls += at.driver_calls;
                min_syncs += syncs(at);
                min_created += at.bytes_created;
            }
        }
        let utilization = if reserved == 0 {
            0.0
        } else {
            live as f64 / reserved as f64
        };
        let rate = if seconds > 0.0 {
            events as f64 / seconds / 1e6
        } else {
            0.0
        };
        out.push_str(&format!(
            "{name}: {} traces, per-trace peaks summed (not one device's peak): reserved {} for live {} (utilization {utilization:.3}), {calls} driver calls, {} created, {ooms} OOMs, {events} events at {rate:.2} Mevents/s",
            reports.len(),
            human_bytes(reserved),
            human_bytes(live),
            human_bytes(created),
        ));
        if min_known > 0 {
            out.push_str(&format!(
                "; min capacity {} over {min_known} traces, where it made {min_calls} driver calls, {min_syncs} syncs and created {}",
                human_bytes(min_sum),
                human_bytes(min_created)
            ));
        }
        out.push('\n');
    }
    out
}

fn outcome_json(o: &ReplayOutcome) -> Value {
    json!({
        "allocator": o.allocator,
        "settings": o.settings,
        "capacity_bytes": o.capacity_bytes,
        "peak_live_bytes": o.peak_live_bytes,
        "peak_reserved_bytes": o.peak_reserved_bytes,
        "utilization": o.utilization,
        "ooms": o.ooms,
        "recorded_ooms": o.recorded_ooms,
        "recorded_ooms_served": o.recorded_ooms_served,
        "alloc_retries": o.alloc_retries,
        "oom_moments": o.oom_moments.iter().map(moment_json).collect::<Vec<_>>(),
        "driver_calls": o.driver_calls,
        "driver_calls_by_kind": by_kind(o),
        "bytes_created": o.bytes_created,
        "events": o.events,
        "seconds": o.seconds,
        "events_per_second": o.events_per_second,
    })
}

/// One OOM moment, every figure of its description.
pub fn moment_json(m: &OomMoment) -> Value {
    json!({
        "event": m.event,
        "request_bytes": m.request,
        "stream": m.stream,
        "recorded": m.recorded,
        "served": m.served,
        "live_bytes": m.live_bytes,
        "reserved_bytes": m.reserved_bytes,
        "reserved_unallocated_bytes": m.reserved_unallocated_bytes,
        "largest_free_bytes": m.largest_free_bytes,
        "largest_free_on_stream_bytes": m.largest_free_on_stream_bytes,
        "needed_live_bytes": m.needed_live_bytes(),
        "impossible": m.impossible(),
        "address_space_exhausted": m.address_space_exhausted,
        "capacity_bytes": m.capacity_bytes,
        "free_by_size": m.free_by_size.iter().map(|c| json!({
            "min_bytes": c.min_bytes, "below_bytes": c.below_bytes, "count": c.count, "bytes": c.bytes,
        })).collect::<Vec<_>>(),
        "free_by_stream": m.free_by_stream.iter().map(|s| json!({
            "stream": s.stream, "count": s.count, "bytes": s.bytes, "largest_bytes": s.largest,
        })).collect::<Vec<_>>(),
        "free_other_streams": json!({
            "streams": m.free_other_streams.0, "bytes": m.free_other_streams.1,
        }),
    })
}

/// Calls of each kind made at least once, by driver function name.
fn by_kind(o: &ReplayOutcome) -> Value {
    let mut m = Map::new();
    for kind in CallKind::ALL {
        let n = o.calls.calls(kind);
        if n > 0 {
            m.insert(kind.driver_name().to_string(), json!(n));
        }
    }
    Value::Object(m)
}

/// The same, as JSON.
pub fn json(reports: &[TraceReport]) -> Value {
    let traces: Vec<Value> = reports
        .iter()
        .map(|r| {
            let allocators: Vec<Value> = r
                .outcomes
                .iter()
                .map(|a| {
                    let mut v = outcome_json(&a.outcome);
                    if let Some(min) = &a.at_min {
                        v["min_capacity_bytes"] =
                            min.as_ref().map_or(Value::Null, |(c, _)| json!(c));
                        if min.is_none() {
                            v["min_capacity_note"] = json!(format!(
                                "does not fit in {}: the bisection searches up to the larger of --capacity and this run's peak reserved; raise --capacity",
                                human_bytes(a.outcome.capacity_bytes.max(a.outcome.peak_reserved_bytes))
                            ));
                        }
                        v["at_min_capacity"] =
                            min.as_ref().map_or(Value::Null, |(_, at)| outcome_json(at));
                    }
                    v
                })
                .collect();
            json!({
                "trace": r.trace.name,
                "start_state": r.trace.start.to_string(),
                "events": r.trace.events.len() + r.trace.initial.len(),
                "initial_blocks": r.trace.initial.len(),
                "skipped_frees": r.trace.skipped_frees,
                "skipped": r.trace.skipped,
                "recorded_peak_reserved_bytes": r.trace.recorded.map(|x| x.peak_reserved_bytes),
                "recorded_segment_allocs": r.trace.recorded.map(|x| x.segment_allocs),
                "recorded_segment_frees": r.trace.recorded.map(|x| x.segment_frees),
                "allocators": allocators,
            })
        })
        .collect();
    json!({ "traces": traces })
}
