//! Mapped runs of expandable segments: PyTorch draws each as one segment, and the recorder
//! compares them from one step to the next to find what was mapped and unmapped.

use std::collections::BTreeMap;

use vmm_alloc::snapshot::{BlockInfo, BlockState, SegmentInfo, Snapshot};
use vmm_alloc::stats::PoolKind;

/// A half-open address range `[start, end)`.
pub(super) type Range = (u64, u64);

/// The blocks of `seg` in maximal runs of contiguous mapped blocks (unmapped holes split them).
pub(super) fn runs(seg: &SegmentInfo) -> impl Iterator<Item = &[BlockInfo]> {
    let mapped = |b: &BlockInfo| b.state != BlockState::Unmapped;
    seg.blocks
        .chunk_by(move |a, b| mapped(a) && mapped(b) && end_of(a) == b.address.get())
        .filter(move |run| run.first().is_some_and(mapped))
}

/// The address just past a block.
pub(super) fn end_of(b: &BlockInfo) -> u64 {
    b.address.get().saturating_add(b.size as u64)
}

/// The range a run of contiguous blocks covers.
pub(super) fn extent(run: &[BlockInfo]) -> Range {
    match (run.first(), run.last()) {
        (Some(first), Some(last)) => (first.address.get(), end_of(last)),
        _ => (0, 0),
    }
}

/// Mapped ranges per (stream, pool), each list sorted by address. Keyed so that memory that
/// changes owner between two pictures (a segment released and its addresses reserved again for
/// another stream) shows as unmapped, then mapped again.
pub(super) type MappedRanges = BTreeMap<(u64, PoolKind), Vec<Range>>;

/// The mapped ranges of a snapshot.
pub(super) fn mapped_ranges(s: &Snapshot) -> MappedRanges {
    let mut out = MappedRanges::new();
    for seg in &s.segments {
        let list = out.entry((seg.stream.raw(), seg.pool)).or_default();
        list.extend(runs(seg).map(extent));
    }
    for list in out.values_mut() {
        list.sort_unstable();
    }
    out
}

/// The parts of `a` that `b` does not cover; both sorted and disjoint, and so is the result.
pub(super) fn subtract(a: &[Range], b: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    // b[..skip] ends before every range of `a` still to come.
    let mut skip = 0;
    for &(mut start, end) in a {
        while b.get(skip).is_some_and(|&(_, e)| e <= start) {
            skip += 1;
        }
        for &(s, e) in b.iter().skip(skip).take_while(|&&(s, _)| s < end) {
            if s > start {
                out.push((start, s));
            }
            start = start.max(e);
        }
        if start < end {
            out.push((start, end));
        }
    }
    out
}
