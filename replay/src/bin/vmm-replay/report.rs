//! The comparison: a table for people, JSON for machines (field names are stable: see the README).

use serde_json::{json, Map, Value};
use vmm_alloc::backend::CallKind;
use vmm_alloc::units::human_bytes;
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
                o.allocator,
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
                Some(None) => out.push_str(" over capacity | - | - | - |"),
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
    out
}

/// Stream synchronizations: on a GPU each one stalls the pipeline.
fn syncs(o: &ReplayOutcome) -> u64 {
    o.calls.calls(CallKind::Synchronize)
}

/// One line per allocator: sums over every trace.
fn summary(reports: &[TraceReport]) -> String {
    let mut out = String::new();
    let names: Vec<&str> = reports
        .first()
        .map(|r| r.outcomes.iter().map(|a| a.outcome.allocator).collect())
        .unwrap_or_default();
    for name in names {
        let runs = reports
            .iter()
            .flat_map(|r| &r.outcomes)
            .filter(|a| a.outcome.allocator == name);
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
            "{name}: {} traces, peak reserved {} for peak live {} (utilization {utilization:.3}), {calls} driver calls, {} created, {ooms} OOMs, {events} events at {rate:.2} Mevents/s",
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
        "capacity_bytes": o.capacity_bytes,
        "peak_live_bytes": o.peak_live_bytes,
        "peak_reserved_bytes": o.peak_reserved_bytes,
        "utilization": o.utilization,
        "ooms": o.ooms,
        "driver_calls": o.driver_calls,
        "driver_calls_by_kind": by_kind(o),
        "bytes_created": o.bytes_created,
        "events": o.events,
        "seconds": o.seconds,
        "events_per_second": o.events_per_second,
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
                "recorded_peak_reserved_bytes": r.trace.recorded.map(|x| x.peak_reserved_bytes),
                "recorded_segment_allocs": r.trace.recorded.map(|x| x.segment_allocs),
                "recorded_segment_frees": r.trace.recorded.map(|x| x.segment_frees),
                "allocators": allocators,
            })
        })
        .collect();
    json!({ "traces": traces })
}
