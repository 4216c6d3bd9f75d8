//! PyTorch's request rounding and segment sizes written out again from its source
//! (`round_size`, `roundup_power2_divisions`, `roundup_power2_next_division`,
//! `get_allocation_size` in `CUDACachingAllocator.cpp`), apart from the crate's own port
//! (`config::round_size`, `config::get_allocation_size`): a test comparing the crate with this
//! rule compares two independent statements of it. The reference models predict sizes and
//! segments with it; the crate's tests check both statements against a table of values worked by
//! hand (`tests/all/pytorch_rounding.rs`).
//!
//! ```
//! use vmm_alloc::testkit::pytorch_rounding::{round_size, segment_size, INTERVALS};
//! assert_eq!(round_size(513, &[0; INTERVALS]), 1024); // multiples of 512
//! assert_eq!(round_size(5 * (1 << 20) + 1, &[4; INTERVALS]), 6 << 20); // 4 divisions
//! assert_eq!(segment_size(1 << 20, 20 << 20), 2 << 20); // small requests: a 2 MiB segment
//! ```

/// `kMinBlockSize`: every size is a multiple of 512 bytes, at least 512.
pub const MIN_BLOCK_SIZE: usize = 512;
/// `kSmallSize`: requests of at most 1 MiB are small.
pub const SMALL_SIZE: usize = 1 << 20;
/// `kRoundUpPowerOfTwoIntervals`: the length of a divisions array, one entry per power-of-two
/// interval of sizes (below 2 MiB, 2–4 MiB, … , 32 GiB and above).
pub const INTERVALS: usize = 16;

const MB: usize = 1 << 20;

/// `roundup_power2_divisions(size)`'s interval: interval `i` covers `[2^(20+i), 2^(21+i))`
/// bytes, sizes below 1 MiB fall in 0 and sizes of 32 GiB and more in 15. Walked up interval by
/// interval rather than with a logarithm, to stay apart from the crate's arithmetic.
fn interval(size: usize) -> usize {
    let mut i = 0;
    while i + 1 < INTERVALS && size >= 1usize << (21 + i) {
        i += 1;
    }
    i
}

/// `round_size(size)`: below 512 → 512; with `d > 1` divisions for `size`'s interval and
/// `size > 512 × d`, `size` rounded up to the next of `d` equal steps between the powers of two
/// around it (a power of two stays); otherwise up to a multiple of 512.
pub fn round_size(size: usize, divisions: &[usize; INTERVALS]) -> usize {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = divisions[interval(size)];
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        if size.is_power_of_two() {
            return size;
        }
        let mut floor = 1usize;
        while floor <= size / 2 {
            floor *= 2;
        }
        // `floor >> log2(d)`: the divisions are powers of two (the grammar refuses others).
        let step = match floor / d {
            0 => floor * 2,
            s => s,
        };
        return size.div_ceil(step) * step;
    }
    size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// `get_allocation_size(rounded)`: small → a 2 MiB segment; below 10 MiB → one
/// `large_segment_size` segment; else the request rounded up to 2 MiB.
pub fn segment_size(rounded: usize, large_segment_size: usize) -> usize {
    if rounded <= SMALL_SIZE {
        2 * MB
    } else if rounded < 10 * MB {
        large_segment_size
    } else {
        rounded.div_ceil(2 * MB) * 2 * MB
    }
}
