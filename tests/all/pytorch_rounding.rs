//! PyTorch's rounding rule against a table of known values, worked by hand from PyTorch's
//! formula and its tests: both the test kit's statement of the rule
//! (`vmm_alloc::testkit::pytorch_rounding`, which the reference models predict with) and the
//! crate's own port (`vmm_alloc::config::round_size`, `get_allocation_size`) must give them.

use vmm_alloc::config::{get_allocation_size as crate_segment, round_size as crate_round};
use vmm_alloc::testkit::pytorch_rounding::{round_size, segment_size, INTERVALS};

const MB: usize = 1 << 20;
const KB: usize = 1 << 10;
const GB: usize = 1 << 30;

/// Divisions arrays the table uses, each written entry by entry.
fn uniform(d: usize) -> [usize; INTERVALS] {
    [d; INTERVALS]
}
fn only(index: usize, d: usize) -> [usize; INTERVALS] {
    let mut a = [0; INTERVALS];
    a[index] = d;
    a
}
/// PyTorch's `test_allocator_settings` string `[64:8,128:2,256:2,512:2,1024:1,>:1]`: the first
/// key (64 MB, interval 6) also fills intervals 0–5; `>` fills 11–15.
fn pytorch_test_list() -> [usize; INTERVALS] {
    [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1]
}

/// (size, divisions, rounded), each worked by hand from §1.4's formula; the comment says how.
fn round_table() -> Vec<(usize, [usize; INTERVALS], usize)> {
    vec![
        (1, uniform(0), 512),                        // below kMinBlockSize
        (513, uniform(0), 1024),                     // next multiple of 512
        (1200, uniform(4), 1536), // 1200 ≤ 512×4: plain 512 rounding (code, not doc)
        (2049, uniform(4), 2560), // floor 2048, step 512
        (5000, uniform(4), 5120), // floor 4096, step 1024
        (4 * MB, uniform(4), 4 * MB), // a power of two stays
        (5 * MB + 1, uniform(4), 6 * MB), // floor 4 MiB, step 1 MiB
        (700 * KB + 1, only(0, 2), 768 * KB), // below 1 MiB: interval 0; floor 512 KiB, step 256 KiB
        (700 * KB + 1, only(1, 2), 700 * KB + 512), // interval 1 does not reach below 2 MiB
        (3 * MB + 1, only(1, 4), 3 * MB + 512 * KB), // [2, 4) MiB is interval 1: floor 2 MiB, step 512 KiB
        (3 * MB + 1, only(2, 8), 3 * MB + 512),      // interval 2 starts at 4 MiB
        (5 * MB + 1, only(2, 8), 5 * MB + 512 * KB), // floor 4 MiB, step 512 KiB
        (8 * MB - 1, only(2, 8), 8 * MB),            // last byte of interval 2
        (8 * MB + 1, only(2, 8), 8 * MB + 512),      // first bytes of interval 3: no divisions
        (9 * MB + 1, only(3, 2), 12 * MB), // [8, 16) MiB is interval 3: floor 8 MiB, step 4 MiB
        (48 * GB + 1, only(15, 2), 64 * GB), // ≥ 32 GiB: interval 15; floor 32 GiB, step 16 GiB
        (100 * GB + 1, only(15, 2), 128 * GB), // clamped at 15 above 64 GiB too
        (84 * MB, pytorch_test_list(), 88 * MB), // PyTorch's test: 84 MB gets 8 divisions (step 8 MiB)
        (400 * MB, pytorch_test_list(), 512 * MB), // and 400 MB gets 2 (floor 256 MiB, step 128 MiB)
        (1500 * MB, pytorch_test_list(), 1500 * MB), // 1 division above 1 GB: 512 rounding only
    ]
}

/// (rounded, new segment) with the default 20 MiB `large_segment_size`, from §1.5.
const SEGMENT_TABLE: [(usize, usize); 6] = [
    (512, 2 * MB),
    (MB, 2 * MB),
    (MB + 512, 20 * MB),
    (10 * MB - 512, 20 * MB),
    (10 * MB, 10 * MB),
    (11 * MB, 12 * MB),
];

#[test]
fn model_rounding_gives_the_known_values() {
    for (size, divisions, want) in round_table() {
        assert_eq!(
            round_size(size, &divisions),
            want,
            "model: {size} with {divisions:?}"
        );
    }
    for (rounded, want) in SEGMENT_TABLE {
        assert_eq!(
            segment_size(rounded, 20 * MB),
            want,
            "model: segment for {rounded}"
        );
    }
}

#[test]
fn crate_rounding_gives_the_known_values() {
    for (size, divisions, want) in round_table() {
        assert_eq!(
            crate_round(size, &divisions),
            Some(want),
            "{size} with {divisions:?}"
        );
    }
    for (rounded, want) in SEGMENT_TABLE {
        assert_eq!(
            crate_segment(rounded, 20 * MB),
            Some(want),
            "segment for {rounded}"
        );
    }
}
