//! Deterministic ports of what PyTorch's own tests pin (reference §6) that need no GPU:
//! rounding, the config parser's rules and messages, stats deltas, the 1 EB guard.

use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::config::{
    get_allocation_size, parse_alloc_conf, round_size, ExpandableConfig, ROUNDUP_INTERVALS,
};
use vmm_alloc::{AllocError, Allocator, ExpandableAllocator, StreamId};

const MB: usize = 1 << 20;

#[test]
fn round_size_ports_the_code_not_the_comment() {
    let none = [0; ROUNDUP_INTERVALS];
    let four = [4; ROUNDUP_INTERVALS];
    assert_eq!(round_size(0, &none), Some(512));
    assert_eq!(round_size(511, &none), Some(512));
    assert_eq!(round_size(513, &none), Some(1024));
    // The doc says 1200 -> 1280 with 4 divisions; the code (512 x d rule) gives 1536.
    assert_eq!(round_size(1200, &four), Some(1536));
    assert_eq!(round_size(2049, &four), Some(2560));
    assert_eq!(round_size(5000, &four), Some(5120));
    assert_eq!(round_size(4096, &four), Some(4096), "powers of two stay");
    assert_eq!(
        round_size(usize::MAX, &none),
        None,
        "overflow is reported, not wrapped"
    );
}

#[test]
fn roundup_list_form_as_in_test_allocator_settings() {
    let conf =
        parse_alloc_conf("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]").unwrap();
    let d = conf.roundup_power2_divisions;
    // An 84 MB tensor gets 8-division rounding, a 400 MB one 2.
    let mb84 = 84 * MB;
    assert_eq!(
        round_size(mb84, &d),
        Some(mb84.next_multiple_of(64 * MB / 8))
    );
    let mb400 = 400 * MB;
    assert_eq!(
        round_size(mb400, &d),
        Some(mb400.next_multiple_of(256 * MB / 2))
    );
    // The first entry also fills every smaller interval.
    assert_eq!(d[0], 8);
    assert_eq!(d[15], 1);
}

#[test]
fn allocation_sizes_of_classic_segments() {
    assert_eq!(get_allocation_size(512, 20 * MB), Some(2 * MB));
    assert_eq!(get_allocation_size(MB, 20 * MB), Some(2 * MB));
    assert_eq!(get_allocation_size(MB + 512, 20 * MB), Some(20 * MB));
    assert_eq!(get_allocation_size(10 * MB, 20 * MB), Some(10 * MB));
    assert_eq!(get_allocation_size(11 * MB + 1, 20 * MB), Some(12 * MB));
}

#[test]
fn config_errors_match_pytorch() {
    let cases = [
        (
            "foo:1,bar:2",
            "Unrecognized key 'foo' in CUDA allocator config.",
        ),
        (
            "garbage_collection_threshold:1.2",
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
        ),
        (
            "garbage_collection_threshold:0",
            "garbage_collect_threshold is invalid",
        ),
        (
            "max_split_size_mb:2",
            "max_split_size_mb too small, must be >= 20",
        ),
        (
            "release_lock_on_cudamalloc:none",
            "Expected 'True' or 'False'",
        ),
        (
            "pinned_use_cuda_host_register:none",
            "Expected 'True' or 'False'",
        ),
        (
            "pinned_num_register_threads:none",
            "expects a non-negative integer",
        ),
        (
            "pinned_num_register_threads:1024",
            "should be less than or equal to 128, got 1024",
        ),
        (
            "pinned_num_register_threads:3",
            "has to be power of 2, got 3",
        ),
        (
            "per_process_memory_fraction:1.1",
            "per_process_memory_fraction is invalid",
        ),
        (
            "per_process_memory_fraction:-0.1",
            "per_process_memory_fraction is invalid",
        ),
        (
            "roundup_power2_divisions:3",
            "the divisions has to be power of 2",
        ),
        (
            "roundup_power2_divisions:0",
            "the divisions has to be power of 2",
        ),
        (
            "roundup_power2_divisions:[100:2]",
            "the intervals have to be power of 2",
        ),
        ("roundup_power2_divisions:[64:3]", "power of 2 or 0"),
        ("roundup_power2_divisions:[64:2", "ended"),
        ("large_segment_size_mb:10", "must be > 10 MB"),
        ("expandable_segments:true", "Expected 'True' or 'False'"),
        ("expandable_segments", "ended"),
        ("expandable_segments=True", "Unrecognized key"),
        ("expandable_segments:True:False", "expected ','"),
        ("backend:magic", "Unknown allocator backend"),
    ];
    for (input, expected) in cases {
        let err = parse_alloc_conf(input).expect_err(input).to_string();
        assert!(
            err.contains(expected),
            "{input:?}: got {err:?}, expected {expected:?}"
        );
    }
}

#[test]
fn config_accepts_what_pytorch_accepts() {
    for ok in [
        "",
        "expandable_segments:True",
        " max_split_size_mb : 128 , garbage_collection_threshold:0.6 ",
        "per_process_memory_fraction:0.0",
        "per_process_memory_fraction:0.5",
        "per_process_memory_fraction:1.0",
        "backend:native,pinned_num_register_threads:8",
        "large_segment_size_mb:64,max_split_size_mb:64",
    ] {
        parse_alloc_conf(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
    // large_segment_size_mb is parsed first, whatever its position.
    assert!(parse_alloc_conf("max_split_size_mb:30,large_segment_size_mb:40").is_err());
    let c = parse_alloc_conf("large_segment_size_mb:40").unwrap();
    assert_eq!(c.max_non_split_rounding, 40 * MB);
}

#[test]
fn stats_deltas_of_a_small_allocation() {
    // test_memory_stats: 256 floats add exactly 1024 to active_bytes; freed after del + empty_cache.
    let alloc = ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
    let a = alloc.allocate(1024, StreamId::DEFAULT).unwrap();
    assert_eq!(alloc.stats().active_bytes.all.current, 1024);
    assert_eq!(alloc.stats().requested_bytes.all.current, 1024);
    alloc.deallocate(a).unwrap();
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(s.active_bytes.all.freed, 1024);
    assert_eq!(s.active_bytes.all.peak, 1024);
    let mut reset = s;
    reset.reset_peak();
    assert_eq!(reset.active_bytes.all.peak, 0);
    alloc.reset_peak_stats();
    assert_eq!(alloc.stats().active_bytes.all.peak, 0);
}

#[test]
fn more_than_one_exabyte() {
    let alloc = ExpandableAllocator::new(SimBackend::new(), ExpandableConfig::default()).unwrap();
    let err = alloc.allocate(1 << 61, StreamId::DEFAULT).unwrap_err();
    assert!(matches!(err, AllocError::TooLarge { .. }));
    assert_eq!(
        err.to_string(),
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
}

#[test]
fn out_of_memory_retry_after_free() {
    // test_out_of_memory_retry: half the device, a second half fails, after del it succeeds.
    let sim = SimBackend::with_config(SimConfig {
        capacity: 1 << 30,
        ..SimConfig::default()
    })
    .unwrap();
    let alloc = ExpandableAllocator::new(sim, ExpandableConfig::default()).unwrap();
    let a = alloc.allocate(600 * MB, StreamId::DEFAULT).unwrap();
    assert!(alloc
        .allocate(600 * MB, StreamId::DEFAULT)
        .unwrap_err()
        .is_out_of_memory());
    alloc.deallocate(a).unwrap();
    let b = alloc.allocate(600 * MB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(b).unwrap();
}

#[test]
fn memory_fraction_limits_the_allocator() {
    // test_max_split_expandable: fraction = 120 MB; 3 x 40 MB fit, a 4th does not; after freeing, 120 MB does.
    let sim = SimBackend::with_config(SimConfig {
        capacity: 1200 * MB,
        ..SimConfig::default()
    })
    .unwrap();
    let config = ExpandableConfig {
        large_page: 2 * MB,
        ..ExpandableConfig::default()
    }
    .with_alloc_conf("per_process_memory_fraction:0.1,max_split_size_mb:40")
    .unwrap();
    let alloc = ExpandableAllocator::new(sim, config).unwrap();
    let v: Vec<_> = (0..3)
        .map(|_| alloc.allocate(40 * MB, StreamId::DEFAULT).unwrap())
        .collect();
    let err = alloc.allocate(40 * MB, StreamId::DEFAULT).unwrap_err();
    assert!(
        err.to_string()
            .contains("This process is allowed 120.00 MiB"),
        "{err}"
    );
    for a in v {
        alloc.deallocate(a).unwrap();
    }
    let big = alloc.allocate(120 * MB, StreamId::DEFAULT).unwrap();
    alloc.deallocate(big).unwrap();
}

/// `with_alloc_conf` changes only what the string mentions.
#[test]
fn alloc_conf_changes_only_the_keys_given() {
    let base = ExpandableConfig {
        large_page: 64 * MB,
        memory_fraction: 0.5,
        max_non_split_rounding: 64 * MB,
        roundup_power2_divisions: [4; vmm_alloc::config::ROUNDUP_INTERVALS],
        max_split_size: Some(256 * MB),
        ..ExpandableConfig::default()
    };
    let same = base
        .clone()
        .with_alloc_conf("expandable_segments:True,garbage_collection_threshold:0.5,backend:native")
        .unwrap();
    assert_eq!(same, base, "keys that do not apply change nothing");
    let c = base
        .clone()
        .with_alloc_conf("max_split_size_mb:128")
        .unwrap();
    assert_eq!(
        c,
        ExpandableConfig {
            max_split_size: Some(128 * MB),
            ..base.clone()
        }
    );
    // large_segment_size_mb also sets max_non_split_rounding, as in PyTorch, unless given.
    let d = base
        .clone()
        .with_alloc_conf("large_segment_size_mb:32")
        .unwrap();
    assert_eq!((d.large_page, d.max_non_split_rounding), (32 * MB, 32 * MB));
    assert_eq!((d.memory_fraction, d.max_split_size), (0.5, Some(256 * MB)));
    let e = base
        .with_alloc_conf("large_segment_size_mb:32,max_non_split_rounding_mb:40,per_process_memory_fraction:0.25,roundup_power2_divisions:2")
        .unwrap();
    assert_eq!(
        (e.large_page, e.max_non_split_rounding, e.memory_fraction),
        (32 * MB, 40 * MB, 0.25)
    );
    assert_eq!(e.roundup_power2_divisions[0], 2);
}

/// A peer the backend does not have is an invalid config, not a failure at the first map.
#[test]
fn peers_must_exist() {
    let two = || {
        SimBackend::with_config(SimConfig {
            devices: 2,
            ..SimConfig::default()
        })
        .unwrap()
    };
    let with_peers = |peers: Vec<u32>| ExpandableConfig {
        peers,
        ..ExpandableConfig::default()
    };
    assert!(ExpandableAllocator::new(two(), with_peers(vec![1])).is_ok());
    for peers in [vec![2], vec![1, 7], vec![u32::MAX]] {
        let err = ExpandableAllocator::new(two(), with_peers(peers.clone())).err();
        assert!(
            matches!(err, Some(AllocError::InvalidConfig(_))),
            "peers {peers:?}: {err:?}"
        );
    }
}
