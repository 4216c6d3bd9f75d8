//! The built-in workloads: determinism, sanity, documented figures.

use super::*;

/// Checks the invariants every workload keeps and returns (live bytes at the end, allocations
/// live at the end).
pub(super) fn check_sane(t: &Trace) -> (u64, usize) {
    assert!(t.initial.is_empty());
    assert_eq!((t.start, t.skipped_frees), (StartState::Empty, 0));
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut next = 0;
    for (i, e) in t.events.iter().enumerate() {
        match *e {
            Event::Alloc { id, size, .. } => {
                assert_eq!(id, next, "{}: ids are dense", t.name);
                next += 1;
                live.insert(id, size);
            }
            Event::Free { id } => {
                assert!(
                    live.remove(&id).is_some(),
                    "{}: event {i} frees {id}, not live",
                    t.name
                );
            }
            Event::EmptyCache => {}
            Event::FailedAlloc { .. } => panic!("{}: a workload never fails a request", t.name),
        }
    }
    // Long-lived state: exactly the first allocations, none of which is ever freed.
    let n = live.len() as u64;
    assert!(
        live.keys().all(|&id| id < n),
        "{}: live at end is not a prefix",
        t.name
    );
    (live.values().sum(), live.len())
}

#[test]
fn workloads_are_deterministic_per_seed() {
    type Gen = fn(u64) -> Trace;
    let gens: [Gen; 4] = [
        workloads::transformer_training,
        workloads::inference_kv_cache,
        workloads::varying_batch,
        |s| workloads::rmm_random(s, 8 << 20, 20_000),
    ];
    for g in gens {
        let (a, b, c) = (g(7), g(7), g(8));
        assert_eq!(a, b);
        assert_ne!(a.events, c.events, "{}", a.name);
        assert_ne!(a.name, c.name);
    }
}

#[test]
fn builtin_workloads_are_sane_and_within_documented_ranges() {
    let expected = [
        ("transformer-training-s1", 36_666, 3.97),
        ("inference-kv-cache-s1", 136_412, 12.55),
        ("varying-batch-s1", 72_802, 1.22),
        ("rmm-random-s1-max67108864-ops100000", 100_000, 0.0),
    ];
    let all = workloads::builtin();
    assert_eq!(all.len(), expected.len());
    for (t, (name, events, end_gib)) in all.iter().zip(expected) {
        let (end, _) = check_sane(t);
        let peak = t.peak_live_bytes();
        println!(
            "{}: {} events, peak live {:.2} GiB, live at end {:.2} GiB",
            t.name,
            t.events.len(),
            peak as f64 / GIB as f64,
            end as f64 / GIB as f64
        );
        assert_eq!(t.name, name);
        assert_eq!(t.events.len(), events, "{name}");
        assert!((20_000..=200_000).contains(&t.events.len()), "{name}");
        assert!((GIB..=40 * GIB).contains(&peak), "{name}: peak {peak}");
        assert!(
            (end as f64 / GIB as f64 - end_gib).abs() < 0.005,
            "{name}: end {end}"
        );
    }
}

#[test]
fn workloads_stay_in_range_for_other_seeds() {
    for seed in [0, 2, 3, 99, u64::MAX] {
        for (t, events, peak_tenths) in [
            (
                workloads::transformer_training(seed),
                36_000..48_000,
                190..196,
            ),
            (
                workloads::inference_kv_cache(seed),
                40_000..170_000,
                130..270,
            ),
            (workloads::varying_batch(seed), 72_000..86_000, 30..150),
        ] {
            check_sane(&t);
            let peak = t.peak_live_bytes();
            assert!(
                events.contains(&t.events.len()),
                "{}: {} events",
                t.name,
                t.events.len()
            );
            let range = peak_tenths.start * GIB / 10..peak_tenths.end * GIB / 10;
            assert!(range.contains(&peak), "{}: peak {peak}", t.name);
        }
    }
}

#[test]
fn rmm_random_has_rmms_shape() {
    let (max, ops) = (4 << 20, 30_000);
    let t = workloads::rmm_random(5, max, ops);
    let (end, live) = check_sane(&t);
    assert_eq!((end, live), (0, 0));
    let allocs: Vec<u64> = t
        .events
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    assert!(allocs.len() as u64 <= ops / 2 + 100);
    assert!(allocs.iter().all(|&s| (1..=max).contains(&s)));
    let mean = allocs.iter().sum::<u64>() as f64 / allocs.len() as f64;
    assert!(
        (mean - max as f64 / 2.0).abs() < max as f64 * 0.02,
        "mean size {mean}"
    );
    // The first steps allocate about 73 % of the time.
    let is_alloc = |e: &&Event| matches!(e, Event::Alloc { .. });
    let a = t.events[..2_000].iter().filter(is_alloc).count();
    assert!((1_360..=1_560).contains(&a), "{a} of the first 2,000");
    // Degenerate arguments are fine.
    assert!(workloads::rmm_random(1, 0, 0).events.is_empty());
    check_sane(&workloads::rmm_random(1, u64::MAX, 1_000));
    let one = workloads::rmm_random(1, 0, 3);
    // As in RMM, a step with nothing live allocates even past `ops / 2` allocations.
    assert_eq!(
        one.events,
        vec![alloc(0, 1, 0), free(0), alloc(1, 1, 0), free(1)]
    );
}
