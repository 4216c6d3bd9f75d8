//! Issue 19's comparison, kept honest: on every shared trace, our expandable policy must not
//! need more device capacity than either of PyTorch's policies (its classic caching allocator and
//! its expandable segments with PyTorch's defaults), measured as `vmm-replay --min-capacity` does
//! (bisection to 2 MiB at 80 GiB's settings); and ours with 2 MiB pages (`large_page_mb:2`, the
//! other side of the goal-1/goal-3 conflict) must not either, but on the listed trace. The
//! per-trace table prints with
//! `cargo test --release --test shared_traces capacity -- --nocapture`.

use libtest_mimic::{Completion, Failed};
use vmm_replay::advise::SMALLEST_SETTING;
use vmm_replay::replay::{min_capacity, replay, Policy, ReplayOptions};
use vmm_replay::snapshot::read_snapshot;
use vmm_replay::Trace;

use crate::{Shared, SharedTest};

/// The tests of this file.
pub const TESTS: &[(&str, SharedTest)] = &[
    (
        "capacity::ours_never_needs_more_than_either_pytorch_policy",
        ours_never_needs_more_than_either_pytorch_policy,
    ),
    (
        "capacity::under_recorded_settings_ours_never_needs_more_than_pytorch_expandable",
        under_recorded_settings_ours_never_needs_more_than_pytorch_expandable,
    ),
    (
        "capacity::reusing_the_last_free_fits_a_training_loop_in_less",
        reusing_the_last_free_fits_a_training_loop_in_less,
    ),
    (
        "capacity::advise_finds_a_minimum_for_every_configuration_that_fits",
        advise_finds_a_minimum_for_every_configuration_that_fits,
    ),
    (
        "capacity::ours_decides_alike_wherever_reservations_are_placed",
        ours_decides_alike_wherever_reservations_are_placed,
    ),
];

/// The bisection's step, as `vmm-replay --min-capacity`.
const STEP: usize = 2 << 20;

/// Issue 19, open: the traces where PyTorch's *classic* allocator still needs less capacity than
/// ours (ours, classic, in MiB, measured 2026-11-28, after the alias rescue took
/// `cs336-medium-ctx128-train` and `nca2d-wholeslide-inference` off it). Ours must not lose more
/// than this on them, nor lose on any other trace (or to pytorch-expandable on any trace); a
/// trace that stops losing must leave this list. Each is a place the policy still has to win.
const CLASSIC_STILL_WINS: &[(&str, usize, usize)] = &[
    ("bert-validate", 2314, 2304),
    ("cs336-2.7b-ctx128-fullstep", 52896, 52694),
];

/// The other side of the goal-1/goal-3 conflict (POLICY.md, "The other side of the conflict: 2
/// MiB pages"): ours with `large_page_mb:2` needs no more than classic on any shared trace, nor
/// more than pytorch-expandable but on these (ours with 2 MiB pages, pytorch-expandable, in MiB,
/// measured 2026-11-28), by at most that much.
const TWO_MIB_PAGES_STILL_LOSE: &[(&str, usize, usize)] = &[("cs336-forward-bf16-b", 41890, 41874)];

fn ours_never_needs_more_than_either_pytorch_policy(shared: &Shared) -> Result<Completion, Failed> {
    let opts = ReplayOptions::default();
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let two_mib = ReplayOptions {
        settings: Some(SMALLEST_SETTING.to_string()),
        ..ReplayOptions::default()
    };
    eprintln!(
        "{:<34} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "trace (MiB)", "peak live", "classic", "pytorch-exp", "ours", "ours 2 MiB"
    );
    let traces = shared_device_traces(shared)?;
    let mut losses = Vec::new();
    for trace in &traces {
        let mut min = [0usize; 3];
        for (i, policy) in Policy::ALL.into_iter().enumerate() {
            min[i] = min_of(trace, policy, &opts)?;
        }
        let [classic, pytorch, ours] = min;
        let fine = min_capacity(trace, Policy::Expandable, &two_mib, 1 << 40, STEP)
            .map_err(|e| format!("{}: {e}", trace.name))?
            .ok_or_else(|| format!("{}: {SMALLEST_SETTING} does not fit", trace.name))?
            .0;
        eprintln!(
            "{:<34} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>12.0}",
            trace.name,
            mib(trace.peak_live_bytes() as usize),
            mib(classic),
            mib(pytorch),
            mib(ours),
            mib(fine)
        );
        let fine_allowed = allowed_excess(
            TWO_MIB_PAGES_STILL_LOSE,
            "TWO_MIB_PAGES_STILL_LOSE",
            &trace.name,
            fine > pytorch,
            &mut losses,
        );
        if fine > classic || mib(fine) - mib(pytorch) > fine_allowed {
            losses.push(format!(
                "{}: ours with {SMALLEST_SETTING} {:.0} MiB, classic {:.0}, pytorch-expandable {:.0}",
                trace.name,
                mib(fine),
                mib(classic),
                mib(pytorch)
            ));
        }
        let allowed_mib = allowed_excess(
            CLASSIC_STILL_WINS,
            "CLASSIC_STILL_WINS",
            &trace.name,
            ours > classic,
            &mut losses,
        );
        if ours > pytorch || mib(ours) - mib(classic) > allowed_mib {
            losses.push(format!(
                "{}: ours {:.0} MiB, classic {:.0}, pytorch-expandable {:.0}",
                trace.name,
                mib(ours),
                mib(classic),
                mib(pytorch)
            ));
        }
    }
    if traces.len() != 23 {
        return Err(format!(
            "{} shared traces with events checked, expected 23",
            traces.len()
        )
        .into());
    }
    if !losses.is_empty() {
        return Err(format!(
            "ours needs more capacity than a PyTorch policy on {} trace(s):\n{}",
            losses.len(),
            losses.join("\n")
        )
        .into());
    }
    Ok(Completion::Completed)
}

/// Settings real programs run with (`max_split_size_mb` is what PyTorch's OOM message suggests),
/// which a replay applies to every allocator as recorded (POLICY.md, "What a recorded setting
/// does to the bars").
const RECORDED_SETTINGS: [&str; 3] = [
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "max_split_size_mb:512,garbage_collection_threshold:0.8,roundup_power2_divisions:8",
];

/// With each of [`RECORDED_SETTINGS`] given to both expandable policies, ours needs no more
/// capacity than PyTorch's on any shared trace: a program run with the setting keeps the
/// comparison. (Classic is not a bar here: `max_split_size_mb` makes it need less than ours on
/// more traces, measured in POLICY.md.) The table prints with `-- --nocapture`.
fn under_recorded_settings_ours_never_needs_more_than_pytorch_expandable(
    shared: &Shared,
) -> Result<Completion, Failed> {
    let traces = shared_device_traces(shared)?;
    let mut losses = Vec::new();
    for trace in &traces {
        for settings in RECORDED_SETTINGS {
            let opts = ReplayOptions {
                settings: Some(settings.to_string()),
                ..ReplayOptions::default()
            };
            let pytorch = min_of(trace, Policy::PytorchExpandable, &opts)?;
            let ours = min_of(trace, Policy::Expandable, &opts)?;
            eprintln!(
                "{:<34} {settings:<70} pytorch-expandable {:>6} MiB, ours {:>6}",
                trace.name,
                pytorch >> 20,
                ours >> 20
            );
            if ours > pytorch {
                losses.push(format!(
                    "{} with {settings}: ours {} MiB, pytorch-expandable {}",
                    trace.name,
                    ours >> 20,
                    pytorch >> 20
                ));
            }
        }
    }
    if traces.len() != 23 {
        return Err(format!("{} shared traces with events, expected 23", traces.len()).into());
    }
    if !losses.is_empty() {
        return Err(format!(
            "ours needs more than pytorch-expandable:\n{}",
            losses.join("\n")
        )
        .into());
    }
    Ok(Completion::Completed)
}

/// Every shared trace with events (one per device a snapshot holds), read once.
fn shared_device_traces(shared: &Shared) -> Result<Vec<Trace>, Failed> {
    let mut out = Vec::new();
    for f in shared.pickles("traces/pytorch")? {
        let bytes = std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let stem = f.file_stem().unwrap_or_default().to_string_lossy();
        let traces = read_snapshot(&bytes, &stem).map_err(|e| format!("{stem}: {e}"))?;
        out.extend(traces.into_iter().filter(|t| !t.events.is_empty()));
    }
    Ok(out)
}

/// `policy`'s smallest capacity for `trace` under `opts`, as `vmm-replay --min-capacity` finds
/// it (bisection from the larger of the device and the 80 GiB run's peak reserved).
fn min_of(trace: &Trace, policy: Policy, opts: &ReplayOptions) -> Result<usize, Failed> {
    let at_80 = replay(trace, policy, opts).map_err(|e| format!("{}: {e}", trace.name))?;
    let upper = (at_80.peak_reserved_bytes as usize).max(opts.capacity);
    let found = min_capacity(trace, policy, opts, upper, STEP)
        .map_err(|e| format!("{}: {e}", trace.name))?;
    Ok(found
        .ok_or_else(|| format!("{}: {} does not fit", trace.name, policy.name()))?
        .0)
}

/// The MiB by which `trace` may still lose, from an allow-list of (trace, ours then, the bar
/// then) named `list_name`; 0 for a trace not listed. A listed trace that no longer `loses` is a
/// failure too (pushed onto `losses`): the list must shrink with the losses.
fn allowed_excess(
    list: &[(&str, usize, usize)],
    list_name: &str,
    trace: &str,
    loses: bool,
    losses: &mut Vec<String>,
) -> f64 {
    match list.iter().find(|k| trace.starts_with(k.0)) {
        Some(&(_, ours_then, bar_then)) if loses => (ours_then - bar_then) as f64,
        Some(&(name, ..)) => {
            losses.push(format!(
                "{name} no longer loses: remove it from {list_name}"
            ));
            0.0
        }
        None => 0.0,
    }
}

/// Note [Last free] in vmm-alloc's `expandable/last_free.rs`: `cs336-medium-ctx128-train` frees
/// tensors and asks for the same size at once; giving the request the block just freed (among
/// the exact fits, instead of the lowest) keeps the loop's layout, and the run fits on a smaller
/// device (6778 MiB against 6816 without, measured 2026-11-25).
fn reusing_the_last_free_fits_a_training_loop_in_less(
    shared: &Shared,
) -> Result<Completion, Failed> {
    let trace = &device_trace(shared, "cs336-medium-ctx128-train")?;
    let min = |settings: Option<&str>| -> Result<usize, Failed> {
        let opts = ReplayOptions {
            settings: settings.map(str::to_string),
            ..ReplayOptions::default()
        };
        let found = min_capacity(trace, Policy::Expandable, &opts, opts.capacity, STEP)
            .map_err(|e| format!("{e}"))?;
        Ok(found.ok_or("does not fit in 80 GiB")?.0)
    };
    let with = min(None)?;
    let without = min(Some("reuse_last_free:false"))?;
    eprintln!(
        "cs336-medium-ctx128-train: {} MiB reusing the last free, {} MiB without",
        with >> 20,
        without >> 20
    );
    if with + STEP > without {
        return Err(format!("with {with} B, without {without} B: no gain").into());
    }
    Ok(Completion::Completed)
}

/// `advise` gives every configuration that fits the device a minimum capacity. Ours with fine
/// pages decides by the device's size, so on `cs336-forward-bf16-b` it does not fit on a device
/// of the 40.88 GiB it peaked at on 48 GiB: the bisection must start from the capacity that fits.
fn advise_finds_a_minimum_for_every_configuration_that_fits(
    shared: &Shared,
) -> Result<Completion, Failed> {
    use vmm_replay::advise::{candidates_for, default_capacity, evaluate, NEAR_FULL_SETTING};
    let trace = &device_trace(shared, "cs336-forward-bf16-b")?;
    let (capacity, _) = default_capacity(trace);
    let fine = candidates_for(trace)
        .into_iter()
        .find(|c| c.change.as_deref() == Some(NEAR_FULL_SETTING))
        .ok_or("advise does not try fine pages")?;
    let v = evaluate(trace, &fine, capacity as usize).map_err(|e| format!("{e}"))?;
    if !v.fits() {
        return Err(format!("{} does not fit in {capacity} B", fine.name()).into());
    }
    let min = v
        .min_capacity
        .ok_or("fits, but no minimum capacity found")?;
    if min > v.at_capacity.peak_reserved_bytes.max(capacity) {
        return Err(format!("minimum {min} B above the capacity it fits in").into());
    }
    Ok(Completion::Completed)
}

/// The device trace with events of the shared trace whose file name holds `name`.
fn device_trace(shared: &Shared, name: &str) -> Result<vmm_replay::Trace, Failed> {
    let file = shared
        .pickles("traces/pytorch")?
        .into_iter()
        .find(|f| f.to_string_lossy().contains(name))
        .ok_or(format!("{name} is not among the shared traces"))?;
    let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let traces = read_snapshot(&bytes, name).map_err(|e| format!("{name}: {e}"))?;
    traces
        .into_iter()
        .find(|t| !t.events.is_empty())
        .ok_or_else(|| "no device trace with events".into())
}

/// Note [Segment order] (`src/expandable/growth.rs`): on every shared trace, ours needs the same
/// smallest device, and does the same there, whether the simulated driver places reservations
/// from the bottom of its address space up or from the top down. Six traces run out of a
/// segment's address space near their minimum and reserve more segments there. (PyTorch's
/// expandable policy orders the blocks of those segments by address, as PyTorch does, and
/// decides differently on four of them: it is not compared.)
fn ours_decides_alike_wherever_reservations_are_placed(
    shared: &Shared,
) -> Result<Completion, Failed> {
    let policy = Policy::Expandable;
    let mut differ = Vec::new();
    for trace in &shared_device_traces(shared)? {
        let decided = |from_top: bool| -> Result<String, Failed> {
            let opts = ReplayOptions {
                reserve_from_top: from_top,
                timeline_points: 1,
                diagnose: false,
                ..ReplayOptions::default()
            };
            let at_80 = replay(trace, policy, &opts).map_err(|e| format!("{}: {e}", trace.name))?;
            let upper = (at_80.peak_reserved_bytes as usize).max(opts.capacity);
            let (cap, at) = min_capacity(trace, policy, &opts, upper, STEP)
                .map_err(|e| format!("{}: {e}", trace.name))?
                .ok_or_else(|| format!("{}: fits nowhere", trace.name))?;
            Ok(format!(
                "min {cap}, calls {:?}, created {}, peak {}; at 80 GiB calls {:?}, peak {}",
                at.calls,
                at.bytes_created,
                at.peak_reserved_bytes,
                at_80.calls,
                at_80.peak_reserved_bytes
            ))
        };
        let (up, down) = (decided(false)?, decided(true)?);
        if up != down {
            differ.push(format!(
                "{} {}:\n  bottom up: {up}\n  top down:  {down}",
                trace.name,
                policy.name()
            ));
        }
    }
    if differ.is_empty() {
        Ok(Completion::Completed)
    } else {
        Err(differ.join("\n").into())
    }
}
