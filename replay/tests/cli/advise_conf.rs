//! `--conf`, recorded OOMs and their diagnosis, and `vmm-replay advise`.

use super::*;
use vmm_replay::native::write_native;
use vmm_replay::{Event, Trace};

/// Classic's fragmentation: 100 MiB cached, a 30 MiB request splits it, the next 100 MiB needs
/// a second segment (200 MiB reserved for 130 MiB live). `max_split_size_mb:64` keeps the
/// 100 MiB block whole for the second request.
fn split_log() -> Vec<u8> {
    rmm_csv(&[
        ("allocate", 0x1000_0000, 100 * MIB, 0),
        ("free", 0x1000_0000, 100 * MIB, 0),
        ("allocate", 0x2000_0000, 30 * MIB, 0),
        ("allocate", 0x3000_0000, 100 * MIB, 0),
    ])
}

#[test]
fn conf_applies_settings_per_allocator_and_shows_them() {
    let path = file("conf", "split.csv", &split_log());
    let report = replay_json(&[
        path.to_str().unwrap(),
        "--allocators",
        "classic",
        "--conf",
        "classic=max_split_size_mb:64",
    ]);
    let runs = report["traces"][0]["allocators"].as_array().unwrap();
    assert_eq!(
        runs.len(),
        1,
        "one classic run, with the settings: {report}"
    );
    assert_eq!(runs[0]["settings"], "max_split_size_mb:64");
    assert_eq!(runs[0]["peak_reserved_bytes"], 130 * MIB);
    // Given twice, the allocator runs once with each; the table shows both.
    let o = vmm_replay(&[
        path.to_str().unwrap(),
        "--conf",
        "classic=max_split_size_mb:64",
        "--conf",
        "classic=roundup_power2_divisions:4",
        "--allocators",
        "classic",
    ]);
    let out = stdout(&o);
    assert!(out.contains("classic (max_split_size_mb:64)"), "{out}");
    assert!(
        out.contains("classic (roundup_power2_divisions:4)"),
        "{out}"
    );
    let plain = replay_json(&[path.to_str().unwrap(), "--allocators", "classic"]);
    assert_eq!(
        allocator(&plain, 0, "classic")["peak_reserved_bytes"],
        200 * MIB
    );
}

/// Ours takes its own switches through `--conf` too: on a 130 MiB device the second 100 MiB
/// request needs 30 MiB more beside the 70 MiB free; a whole 20 MiB page for the last 10 MiB
/// would not fit, so ours cuts that handle to 10 MiB (`pressure_tail`). Turned off, it runs out.
#[test]
fn conf_turns_our_own_switches() {
    let path = file("ownconf", "split.csv", &split_log());
    let run = |extra: &[&str]| {
        let mut args = vec![
            path.to_str().unwrap(),
            "--allocators",
            "expandable",
            "--capacity",
            "130MiB",
        ];
        args.extend_from_slice(extra);
        replay_json(&args)
    };
    let default = run(&[]);
    let runs = default["traces"][0]["allocators"].as_array().unwrap();
    assert_eq!(runs[0]["ooms"], 0, "{default}");
    assert_eq!(runs[0]["peak_reserved_bytes"], 130 * MIB);
    // Without the alias rescue too, which would serve it from the free tail of the page the
    // 30 MiB block ends in (10 MiB) and 90 MiB new (Note [Alias rescue]).
    let off = run(&[
        "--conf",
        "expandable=pressure_tail:false,alias_rescue:false",
    ]);
    let runs = off["traces"][0]["allocators"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{off}");
    assert_eq!(
        runs[0]["settings"],
        "pressure_tail:false,alias_rescue:false"
    );
    assert_eq!(runs[0]["ooms"], 1, "{off}");
    // A bad value of ours is named; ours' key given to PyTorch's policies says where it belongs.
    for (conf, named) in [
        (
            "expandable=pressure_tail:maybe",
            "pressure_tail takes True or False",
        ),
        (
            "classic=headroom_fraction:0.1",
            "give it as expandable=headroom_fraction:0.1",
        ),
        ("expandable=headroom:1", "headroom_fraction"),
    ] {
        let o = vmm_replay(&[path.to_str().unwrap(), "--conf", conf]);
        assert_eq!(o.status.code(), Some(1), "{conf}");
        assert!(stderr(&o).contains(named), "{conf}: {}", stderr(&o));
    }
}

#[test]
fn a_bad_conf_names_the_key_or_value() {
    let path = file("badconf", "split.csv", &split_log());
    for (conf, named) in [
        ("classic=max_split_sise_mb:64", "max_split_sise_mb"),
        ("expandable=max_split_size_mb:abc", "abc"),
        ("nosuch=max_split_size_mb:64", "nosuch"),
        ("classic", "ALLOCATOR=SETTINGS"),
    ] {
        let o = vmm_replay(&[path.to_str().unwrap(), "--conf", conf]);
        assert_eq!(o.status.code(), Some(1), "{conf}");
        assert!(stderr(&o).contains(named), "{conf}: {}", stderr(&o));
    }
}

/// 40 MiB live, then the program's request of 50 MiB failed (a recorded `oom` entry).
fn failed_run() -> Vec<u8> {
    let events = vec![
        Event::Alloc {
            id: 0,
            size: 40 * MIB,
            stream: 7,
        },
        Event::FailedAlloc {
            size: 50 * MIB,
            stream: 7,
        },
    ];
    write_native(&Trace::from_events("failed", events))
}

#[test]
fn a_recorded_oom_is_replayed_and_explained() {
    let path = file("oom", "failed.vmmtrace", &failed_run());
    // On a roomy device every allocator serves the failed request.
    let roomy = replay_json(&[path.to_str().unwrap()]);
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let a = allocator(&roomy, 0, name);
        assert_eq!(
            (
                a["recorded_ooms"].as_u64(),
                a["recorded_ooms_served"].as_u64()
            ),
            (Some(1), Some(1)),
            "{a}"
        );
        assert_eq!(a["ooms"], 0);
        assert_eq!(a["peak_live_bytes"], 90 * MIB);
    }
    // On 80 MiB none can: 90 MiB must be live at once.
    let small = replay_json(&[path.to_str().unwrap(), "--capacity", "80MiB"]);
    for name in ["classic", "pytorch-expandable", "expandable"] {
        let a = allocator(&small, 0, name);
        assert_eq!(a["ooms"], 1, "{a}");
        let m = &a["oom_moments"][0];
        assert_eq!(m["recorded"], true);
        assert_eq!(m["served"], false);
        assert_eq!(m["request_bytes"], 50 * MIB);
        assert_eq!(m["live_bytes"], 40 * MIB);
        assert_eq!(m["stream"], 7);
        assert_eq!(m["impossible"], true);
        assert_eq!(m["needed_live_bytes"], 90 * MIB);
    }
    let text = stdout(&vmm_replay(&[
        path.to_str().unwrap(),
        "--capacity",
        "80MiB",
    ]));
    assert!(
        text.contains(
            "no allocator could have served this: the request needs 90.00 MiB of live memory"
        ),
        "{text}"
    );
}

#[test]
fn a_replayed_oom_shows_the_fragmentation() {
    let path = file("frag", "split.csv", &split_log());
    let r = replay_json(&[
        path.to_str().unwrap(),
        "--allocators",
        "classic",
        "--capacity",
        "140MiB",
    ]);
    let a = allocator(&r, 0, "classic");
    assert_eq!(a["ooms"], 1);
    let m = &a["oom_moments"][0];
    // 30 MiB live, the rest of the split 100 MiB segment free but too small for 100 MiB.
    assert_eq!(m["impossible"], false);
    assert_eq!(m["live_bytes"], 30 * MIB);
    assert_eq!(m["reserved_unallocated_bytes"], 70 * MIB);
    assert_eq!(m["largest_free_bytes"], 70 * MIB);
    assert_eq!(m["free_by_stream"][0]["bytes"], 70 * MIB);
}

#[test]
fn advise_recommends_the_smallest_change_that_fits() {
    let path = file("advise", "split.csv", &split_log());
    let o = vmm_replay(&["advise", path.to_str().unwrap(), "--capacity", "140MiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("| classic (as recorded) | no |"), "{out}");
    assert!(
        out.contains("export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:"),
        "{out}"
    );
    // The same answer on one thread as on all (deterministic output).
    let one = vmm_replay(&[
        "advise",
        path.to_str().unwrap(),
        "--capacity",
        "140MiB",
        "--threads",
        "1",
    ]);
    assert_eq!(stdout(&one), out);
}

/// A program recorded under `expandable_segments:True`: PyTorch's expandable policy is its setting
/// as recorded, and classic is a change (`expandable_segments:False`), which the advice's export
/// line must make: merging `max_split_size_mb` into the recorded string would have kept the
/// expandable policy.
#[test]
fn advise_after_a_recording_with_expandable_segments_counts_classic_as_the_change() {
    use vmm_replay::advise::{candidates_for, recorded_expandable};
    use vmm_replay::replay::Policy;
    let events = vec![
        on_default_stream(0, 100 * MIB),
        Event::Free { id: 0 },
        on_default_stream(1, 30 * MIB),
        on_default_stream(2, 100 * MIB),
    ];
    let mut trace = Trace::from_events("split-expandable", events);
    trace.alloc_conf = Some("expandable_segments:True".into());
    assert!(recorded_expandable(&trace));
    let list = candidates_for(&trace);
    let pick = |policy, change: Option<&str>| {
        list.iter()
            .find(|c| c.policy == policy && c.change.as_deref() == change)
            .unwrap()
    };
    let expandable = pick(Policy::PytorchExpandable, None);
    assert_eq!(
        (expandable.name().as_str(), expandable.keys_changed()),
        ("expandable_segments:True (as recorded)", 0)
    );
    let classic = pick(Policy::Classic, Some("max_split_size_mb:64"));
    assert_eq!(classic.keys_changed(), 2);
    assert_eq!(
        classic.pytorch_conf(trace.alloc_conf.as_deref()),
        "expandable_segments:False,max_split_size_mb:64"
    );
    // PyTorch's expandable policy fits the split in 140 MiB: the recorded settings need no change.
    let path = file("advise-exp", "split.vmmtrace", &write_native(&trace));
    let o = vmm_replay(&["advise", path.to_str().unwrap(), "--capacity", "140MiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("| expandable_segments:True (as recorded) | yes |"),
        "{out}"
    );
    assert!(
        out.contains("your current settings fit in 140.00 MiB"),
        "{out}"
    );
}

#[test]
fn advise_says_when_no_setting_can_fit() {
    let path = file("advise-none", "split.csv", &split_log());
    let o = vmm_replay(&[
        "advise",
        path.to_str().unwrap(),
        "--capacity",
        "100MiB",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let advice = v["recommendation"].as_str().unwrap();
    assert!(
        advice.starts_with(
            "no setting fits in 100.00 MiB: you need 130.00 MiB of live memory at event 3"
        ),
        "{advice}"
    );
    assert!(v["configurations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["fits"] == false));
}

/// The give-back scenario of `tests/all/give_back_before_foreign_sync.rs` as a trace: stream 9
/// holds four 20 MiB blocks and the default stream one (100 MiB), stream 9 frees two, the
/// default stream asks for 20 MiB more.
fn two_stream_trace() -> Trace {
    let alloc = |id, stream| Event::Alloc {
        id,
        size: 20 * MIB,
        stream,
    };
    let mut events: Vec<Event> = (0..4).map(|id| alloc(id, 9)).collect();
    events.extend([
        alloc(4, 0),
        Event::Free { id: 0 },
        Event::Free { id: 1 },
        alloc(5, 0),
    ]);
    Trace::from_events("two-streams", events)
}

#[test]
fn advise_tries_fine_pages_everywhere_and_the_several_streams_setting_only_with_several_streams() {
    use vmm_replay::advise::{
        candidates, candidates_for, evaluate, Candidate, NEAR_FULL_SETTING, SEVERAL_STREAMS_SETTING,
    };
    use vmm_replay::replay::Policy;
    let two = two_stream_trace();
    let mut one = two.clone();
    for e in &mut one.events {
        if let Event::Alloc { stream, .. } = e {
            *stream = 0;
        }
    }
    // Ours with fine pages near the device's end is tried on every trace.
    let near_full = |list: &[Candidate]| {
        let fine = |c: &&Candidate| c.change.as_deref() == Some(NEAR_FULL_SETTING);
        list.iter()
            .filter(|c| c.policy == Policy::Expandable)
            .filter(fine)
            .count()
    };
    let single = candidates_for(&one);
    assert_eq!(
        single.len(),
        candidates().len() + 2,
        "one stream: fine pages and 2 MiB pages only"
    );
    assert_eq!(near_full(&single), 1);
    let list = candidates_for(&two);
    assert_eq!(list.len(), candidates().len() + 4);
    assert_eq!(near_full(&list), 1);
    let both = &list[list.len() - 2];
    assert_eq!(
        both.name(),
        "vmm-alloc (ours) fine_pages_above:0.85,give_back_before_foreign_sync:true"
    );
    let extra = &list[list.len() - 3];
    assert_eq!(extra.policy, Policy::Expandable);
    assert_eq!(extra.change.as_deref(), Some(SEVERAL_STREAMS_SETTING));
    assert_eq!(
        extra.name(),
        "vmm-alloc (ours) give_back_before_foreign_sync:true"
    );
    // The setting reaches the allocator: on a 100 MiB device ours remaps one of stream 9's
    // free pages; with it, ours gives both back and retries once, as PyTorch does.
    let ours = list
        .iter()
        .find(|c| c.policy == Policy::Expandable && c.change.is_none())
        .unwrap();
    let plain = evaluate(&two, ours, 100 * MIB as usize).unwrap();
    let given = evaluate(&two, extra, 100 * MIB as usize).unwrap();
    assert_eq!((plain.at_capacity.ooms, given.at_capacity.ooms), (0, 0));
    assert_eq!(plain.at_capacity.alloc_retries, 0);
    assert_eq!(given.at_capacity.alloc_retries, 1);
    assert_eq!(given.at_capacity.settings, SEVERAL_STREAMS_SETTING);
}

/// An allocation of `size` bytes on the default stream.
fn on_default_stream(id: u64, size: u64) -> Event {
    Event::Alloc {
        id,
        size,
        stream: 0,
    }
}

/// One stream: blocks of 2, 16 and 2 MiB, the middle one freed, then 20 MiB. With 20 MiB pages
/// the two 2 MiB blocks pin the page the freed 16 MiB lie in, at both ends (so no alias rescue
/// can lend them either: Note [Alias rescue]), and the 20 MiB need a second page: 40 MiB.
/// Classic carves the three from one 20 MiB segment and needs a second one: 40 MiB too.
fn pinned_page_trace() -> Trace {
    let events = vec![
        on_default_stream(0, 2 * MIB),
        on_default_stream(1, 16 * MIB),
        on_default_stream(2, 2 * MIB),
        Event::Free { id: 1 },
        on_default_stream(3, 20 * MIB),
    ];
    Trace::from_events("pinned-page", events)
}

#[test]
fn advise_tries_two_mib_pages_last_and_recommends_them_only_where_nothing_cheaper_fits() {
    use vmm_replay::advise::{candidates_for, evaluate, recommend, SMALLEST_SETTING};
    use vmm_replay::replay::Policy;
    let trace = pinned_page_trace();
    let list = candidates_for(&trace);
    let last = list.last().unwrap();
    assert_eq!(last.policy, Policy::Expandable);
    assert_eq!(last.change.as_deref(), Some(SMALLEST_SETTING));
    assert_eq!(last.name(), "vmm-alloc (ours) large_page_mb:2");
    let sweep = |capacity: u64| -> Vec<_> {
        list.iter()
            .map(|c| evaluate(&trace, c, capacity as usize).unwrap())
            .collect()
    };
    // On 26 MiB only 2 MiB pages fit: the freed 16 MiB are eight whole pages, mapped again
    // after the last 2 MiB block's page, with two new ones, for the 20 MiB. Its minimum is the
    // peak live (24 MiB), where every other configuration needs 40 MiB, and it pays in driver
    // calls.
    let tight = sweep(26 * MIB);
    let fitting: Vec<String> = tight
        .iter()
        .filter(|v| v.fits())
        .map(|v| v.candidate.name())
        .collect();
    assert_eq!(fitting, ["vmm-alloc (ours) large_page_mb:2"]);
    let small = tight.last().unwrap();
    assert_eq!(small.min_capacity, Some(24 * MIB));
    let ours = tight
        .iter()
        .find(|v| v.candidate.policy == Policy::Expandable && v.candidate.change.is_none())
        .unwrap();
    assert_eq!(ours.min_capacity, Some(40 * MIB));
    assert!(small.at_capacity.driver_calls > ours.at_capacity.driver_calls);
    let advice = recommend(&trace, 26 * MIB, &tight);
    assert!(
        advice.contains("export VMM_ALLOC_CONF=large_page_mb:2"),
        "{advice}"
    );
    // ... and says what it costs.
    let price = format!(
        "2 MiB pages cost driver calls: {} in this run against {} with vmm-alloc's defaults",
        small.at_capacity.driver_calls, ours.at_capacity.driver_calls
    );
    assert!(advice.contains(&price), "{advice}");
    // On 40 MiB ours' defaults fit, and nothing of ours is recommended before PyTorch's own
    // settings; 2 MiB pages are never what a roomier device is told to use.
    let roomy = sweep(40 * MIB);
    assert!(roomy
        .iter()
        .filter(|v| v.candidate.policy == Policy::Expandable)
        .all(|v| v.fits()));
    let advice = recommend(&trace, 40 * MIB, &roomy);
    assert!(!advice.contains("large_page_mb"), "{advice}");
}
