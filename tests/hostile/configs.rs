//! Configuration input: `PYTORCH_CUDA_ALLOC_CONF` strings with every kind of malformation (the
//! PyTorch error messages themselves are in `tests/all/pytorch_parity.rs`), `ExpandableConfig` fields set
//! by hand to absurd values, and backend constructors with absurd parameters.

use vmm_alloc::backend::{Backend, CallKind, HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{parse_alloc_conf, ExpandableConfig};
use vmm_alloc::{AllocError, Allocator, BackendErrorKind, ExpandableAllocator, StreamId};

use crate::{sim, MB};

/// Every entry point that takes a config string refuses `input` with a message containing `want`.
fn refused(input: &str, want: &str) {
    let e = parse_alloc_conf(input).expect_err(input).to_string();
    assert!(e.contains(want), "{input:?}: {e:?} does not say {want:?}");
    let e = ExpandableConfig::default()
        .with_alloc_conf(input)
        .unwrap_err()
        .to_string();
    assert!(e.contains(want), "{input:?} (ExpandableConfig): {e}");
    match ClassicAllocator::with_alloc_conf(sim(64 * MB), input) {
        Err(AllocError::InvalidConfig(c)) => assert!(c.to_string().contains(want)),
        Err(other) => panic!("{input:?} (classic): {other:?}"),
        Ok(_) => panic!("{input:?} (classic): accepted"),
    }
}

#[test]
fn malformed_config_strings_are_errors_naming_the_problem() {
    let cases = [
        // Unknown keys, also disguised.
        ("max_split_size:128", "Unrecognized key 'max_split_size'"),
        ("Max_Split_Size_MB:128", "Unrecognized key"),
        ("max_split_size_mb\u{200b}:128", "Unrecognized key"),
        (
            "mäx_split_size_mb:128",
            "Unrecognized key 'mäx_split_size_mb'",
        ),
        ("🦀:1", "Unrecognized key '🦀'"),
        (
            "expandable_segments;True",
            "Unrecognized key 'expandable_segments;True'",
        ),
        // Bad, negative and overflowing numbers.
        (
            "max_split_size_mb:-1",
            "expects a non-negative integer, got '-1'",
        ),
        ("max_split_size_mb:12.5", "got '12.5'"),
        ("max_split_size_mb:0x80", "got '0x80'"),
        ("max_split_size_mb:1e3", "got '1e3'"),
        ("max_split_size_mb:١٢٨", "expects a non-negative integer"),
        (
            "max_split_size_mb:99999999999999999999999",
            "expects a non-negative integer",
        ),
        (
            "large_segment_size_mb:18446744073709551615",
            "large_segment_size_mb is too large",
        ),
        (
            "pinned_num_register_threads:18446744073709551616",
            "expects a non-negative integer",
        ),
        (
            "per_process_memory_fraction:1e400",
            "expects a number, got '1e400'",
        ),
        ("per_process_memory_fraction:NaN", "expects a number"),
        ("per_process_memory_fraction:inf", "expects a number"),
        (
            "per_process_memory_fraction:-0.5",
            "per_process_memory_fraction is invalid",
        ),
        (
            "garbage_collection_threshold:1e-400",
            "garbage_collect_threshold is invalid",
        ),
        ("garbage_collection_threshold:", "ended"),
        // Empty items and missing parts.
        (",", "Unrecognized key ','"),
        ("max_split_size_mb:128,,", "Unrecognized key ','"),
        (",max_split_size_mb:128", "Unrecognized key ','"),
        (":128", "Unrecognized key ':'"),
        ("max_split_size_mb:", "ended"),
        ("max_split_size_mb::128", "got ':'"),
        ("max_split_size_mb", "ended"),
        (
            "max_split_size_mb 128",
            "Unrecognized key 'max_split_size_mb128'",
        ),
        (
            "expandable_segments:True expandable_segments:False",
            "got 'Trueexpandable_segments'",
        ),
        // Brackets where they do not belong, nested, unbalanced, empty.
        (
            "roundup_power2_divisions:[[64:2]]",
            "expected : but got '64'",
        ),
        ("roundup_power2_divisions:[64:[2]]", "got '['"),
        (
            "roundup_power2_divisions:[]",
            "expected ':' but the config string ended",
        ),
        (
            "roundup_power2_divisions:[64:2,]",
            "expected ':' but the config string ended",
        ),
        (
            "roundup_power2_divisions:[64:2]]",
            "expected ',' between settings but got ']'",
        ),
        (
            "roundup_power2_divisions:64:2]",
            "expected ',' between settings but got ':'",
        ),
        ("roundup_power2_divisions:[64:2,>:4,", "ended"),
        (
            "roundup_power2_divisions:[0:2]",
            "the intervals have to be power of 2",
        ),
        ("roundup_power2_divisions:[-64:2]", "got '-64'"),
        ("roundup_power2_divisions:[64:-2]", "got '-2'"),
        ("roundup_power2_divisions:[64;2]", "expected : but got ']'"),
        (
            "roundup_power2_divisions:[18446744073709551616:2]",
            "got '18446744073709551616'",
        ),
        ("max_split_size_mb:[128]", "got '['"),
        ("expandable_segments:[True]", "Expected 'True' or 'False'"),
        ("[", "Unrecognized key '['"),
        ("]", "Unrecognized key ']'"),
        ("backend:", "ended"),
        ("backend:native:cudaMallocAsync", "expected ','"),
    ];
    let mut wrong = Vec::new();
    for (input, want) in cases {
        let got = parse_alloc_conf(input)
            .map(|_| ())
            .map_err(|e| e.to_string());
        if !got.as_ref().is_err_and(|e| e.contains(want)) {
            wrong.push(format!("{input:?}: {got:?}, expected {want:?}"));
            continue;
        }
        refused(input, want);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Inputs far longer than any real setting: refused (or read) with work and messages that stay
/// proportional to the input, never a panic.
#[test]
fn very_long_and_repetitive_strings() {
    let key = "k".repeat(1 << 20);
    let e = parse_alloc_conf(&format!("{key}:1")).unwrap_err();
    assert!(
        e.message.starts_with("Unrecognized key 'kkk"),
        "{}",
        &e.message[..40]
    );
    assert!(e.message.len() < (1 << 20) + 100);
    let e = parse_alloc_conf(&",".repeat(100_000)).unwrap_err();
    assert!(e.to_string().contains("Unrecognized key ','"), "{e}");
    assert_eq!(e.token, Some(0));
    let deep = format!("roundup_power2_divisions:{}", "[".repeat(100_000));
    assert!(parse_alloc_conf(&deep)
        .unwrap_err()
        .to_string()
        .contains("got '['"));
    let number = format!("max_split_size_mb:{}", "9".repeat(100_000));
    assert!(parse_alloc_conf(&number).is_err());
    // 100,000 repetitions of a valid setting are valid: the last one wins.
    let mut many = "max_split_size_mb:128,".repeat(100_000);
    many.push_str("max_split_size_mb:256");
    let c = parse_alloc_conf(&many).unwrap();
    assert_eq!(c.max_split_size, Some(256 * MB));
    assert_eq!(c.given.len(), 100_001);
    // A list of 100,000 intervals (all clamped to the last one) still parses.
    let list = format!("roundup_power2_divisions:[{}>:4]", "1:2,".repeat(100_000));
    assert_eq!(
        parse_alloc_conf(&list).unwrap().roundup_power2_divisions[15],
        4
    );
}

#[test]
fn duplicated_keys_last_one_wins_everywhere() {
    let c = parse_alloc_conf("expandable_segments:True,expandable_segments:False").unwrap();
    assert!(!c.expandable_segments);
    let c = ExpandableConfig::default()
        .with_alloc_conf("per_process_memory_fraction:0.5,per_process_memory_fraction:0.25")
        .unwrap();
    assert_eq!(c.memory_fraction, 0.25);
    // The minimum of max_split_size_mb follows the string's own large_segment_size_mb, whichever
    // comes first and however often it is given (PyTorch reads it first).
    assert!(parse_alloc_conf("max_split_size_mb:30,large_segment_size_mb:40").is_err());
    assert!(parse_alloc_conf(
        "large_segment_size_mb:64,large_segment_size_mb:11,max_split_size_mb:30"
    )
    .is_err());
}

/// `ExpandableConfig` fields set by hand: refused at construction, never a panic or a hang later.
#[test]
fn absurd_config_fields() {
    let bad = [
        (
            "small_page",
            ExpandableConfig {
                small_page: 0,
                ..ExpandableConfig::default()
            },
            "page sizes",
        ),
        (
            "large_page",
            ExpandableConfig {
                large_page: 0,
                ..ExpandableConfig::default()
            },
            "page sizes",
        ),
        (
            "va_factor NaN",
            ExpandableConfig {
                va_factor: f64::NAN,
                ..ExpandableConfig::default()
            },
            "va_factor",
        ),
        (
            "va_factor inf",
            ExpandableConfig {
                va_factor: f64::INFINITY,
                ..ExpandableConfig::default()
            },
            "va_factor",
        ),
        (
            "va_factor 0.5",
            ExpandableConfig {
                va_factor: 0.5,
                ..ExpandableConfig::default()
            },
            "va_factor",
        ),
        (
            "fraction NaN",
            ExpandableConfig {
                memory_fraction: f64::NAN,
                ..ExpandableConfig::default()
            },
            "per_process_memory_fraction",
        ),
        (
            "fraction 1+",
            ExpandableConfig {
                memory_fraction: 1.000_001,
                ..ExpandableConfig::default()
            },
            "per_process_memory_fraction",
        ),
        (
            "fraction -inf",
            ExpandableConfig {
                memory_fraction: f64::NEG_INFINITY,
                ..ExpandableConfig::default()
            },
            "per_process_memory_fraction",
        ),
    ];
    for (what, config, want) in bad {
        match ExpandableAllocator::new(sim(64 * MB), config) {
            Err(AllocError::InvalidConfig(e)) => {
                assert!(e.to_string().contains(want), "{what}: {e}")
            }
            Err(e) => panic!("{what}: {e:?}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    // Huge pages and limits are legal values; requests then fail cleanly (a page beyond the
    // device is out of memory) and nothing is left behind.
    for config in [
        ExpandableConfig {
            large_page: usize::MAX,
            ..ExpandableConfig::default()
        },
        ExpandableConfig {
            small_page: usize::MAX,
            ..ExpandableConfig::default()
        },
        ExpandableConfig {
            large_page: 1 << 62,
            small_page: 1 << 62,
            ..ExpandableConfig::default()
        },
        ExpandableConfig {
            handle_cache_limit: usize::MAX,
            max_split_size: Some(usize::MAX),
            faithful_oversize: true,
            max_non_split_rounding: usize::MAX,
            ..ExpandableConfig::default()
        },
        ExpandableConfig {
            va_factor: 64.0,
            ..ExpandableConfig::default()
        },
        ExpandableConfig {
            memory_fraction: 0.0,
            ..ExpandableConfig::default()
        },
    ] {
        let what = format!("{config:?}");
        let backend = sim(64 * MB);
        let a = ExpandableAllocator::new(backend.clone(), config).unwrap();
        for size in [1, 3 * MB, 30 * MB] {
            match a.allocate(size, StreamId::DEFAULT) {
                Ok(x) => a.deallocate(x).unwrap(),
                Err(e) => assert!(e.is_out_of_memory(), "{what}, {size}: {e:?}"),
            }
            a.check_invariants().unwrap();
        }
        a.empty_cache().unwrap();
        drop(a);
        assert!(backend.live().is_empty(), "{what}: {}", backend.live());
    }
}

/// Backend constructors: absurd settings are `BadConfig` errors naming the setting; odd but
/// valid ones (a device of 0 bytes, of nearly 2^64 bytes, with a 2^62-byte granule) give
/// allocators that answer every request with a value, not a panic, and leak nothing.
#[test]
fn absurd_backend_parameters() {
    let d = SimConfig::default();
    let not_a_multiple = usize::MAX;
    for (config, want) in [
        (
            SimConfig {
                granularity: 1,
                ..d
            },
            "granularity",
        ),
        (
            SimConfig {
                granularity: usize::MAX,
                ..d
            },
            "granularity",
        ),
        (
            SimConfig {
                granularity: (1 << 21) + 512,
                ..d
            },
            "granularity",
        ),
        (
            SimConfig {
                capacity: not_a_multiple,
                ..d
            },
            "capacity",
        ),
        (
            SimConfig {
                va_limit: u64::MAX - 1,
                ..d
            },
            "va_limit",
        ),
    ] {
        let e = SimBackend::with_config(config).expect_err("refused");
        assert_eq!(e.op, CallKind::Init);
        assert!(
            matches!(&e.kind, BackendErrorKind::BadConfig(m) if m.contains(want)),
            "{config:?}: {e}"
        );
    }
    let h = HostConfig::default();
    for (config, want) in [
        (
            HostConfig {
                granularity: 0,
                ..h
            },
            "granularity",
        ),
        (
            HostConfig {
                granularity: 1,
                ..h
            },
            "granularity",
        ),
        (
            HostConfig {
                granularity: usize::MAX,
                ..h
            },
            "granularity",
        ),
        (
            HostConfig {
                capacity: usize::MAX,
                ..h
            },
            "capacity",
        ),
    ] {
        let e = HostBackend::with_config(config).expect_err("refused");
        assert!(
            matches!(&e.kind, BackendErrorKind::BadConfig(m) if m.contains(want)),
            "{config:?}: {e}"
        );
    }
    let granule = 2 * MB;
    for config in [
        SimConfig { capacity: 0, ..d },
        SimConfig {
            capacity: usize::MAX / granule * granule,
            ..d
        },
        SimConfig {
            granularity: 1 << 62,
            capacity: 1 << 62,
            ..d
        },
        SimConfig {
            granularity: 1 << 63,
            capacity: 0,
            ..d
        },
    ] {
        let backend = SimBackend::with_config(config).unwrap();
        let allocs: Vec<(&str, Box<dyn Allocator>)> = vec![
            (
                "expandable",
                Box::new(
                    ExpandableAllocator::new(backend.clone(), ExpandableConfig::default()).unwrap(),
                ),
            ),
            (
                "pytorch-expandable",
                Box::new(
                    ExpandableAllocator::new(
                        backend.clone(),
                        ExpandableConfig::pytorch_expandable(),
                    )
                    .unwrap(),
                ),
            ),
            (
                "classic",
                Box::new(ClassicAllocator::with_alloc_conf(backend.clone(), "").unwrap()),
            ),
        ];
        for (name, a) in allocs {
            for size in [1, 3 * MB, 1 << 40, 1 << 60] {
                match a.allocate(size, StreamId::DEFAULT) {
                    Ok(x) => a.deallocate(x).unwrap(),
                    Err(e) => assert!(e.is_out_of_memory(), "{name} on {config:?}, {size}: {e:?}"),
                }
            }
            a.empty_cache().unwrap();
            assert_eq!(a.stats().reserved_bytes.all.current, 0);
        }
        assert!(backend.live().is_empty(), "{config:?}: {}", backend.live());
    }
}
