//! The traced allocator's segments when recording began, rebuilt from the dump (reference
//! `pytorch-allocator.md` §8): take the segments at the dump, undo the trace's `segment_alloc`
//! and `segment_free` entries backwards, and place the blocks live at the start inside them. A
//! classic replay seeded with them starts where the program's allocator was, cached free memory
//! included, instead of from an empty device.

use std::collections::{BTreeMap, HashMap, HashSet};

/// A segment of the traced allocator when recording began.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StartSegment {
    /// Its address in the traced program (for ordering; a replay places it elsewhere).
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Its stream.
    pub stream: u64,
    /// Whether it belongs to the small pool (2 MiB segments of requests ≤ 1 MiB).
    pub small: bool,
    /// The blocks live in it at the start, by offset; the rest of it was free (cached).
    pub blocks: Vec<StartBlock>,
}

/// A block live when recording began, inside its segment.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StartBlock {
    /// Bytes from the segment's start.
    pub offset: u64,
    /// The block's size (rounded, as the allocator holds it).
    pub size: u64,
    /// The id of the [`InitialBlock`](crate::InitialBlock) it is.
    pub id: u64,
}

/// A segment at the dump, as the reader found it.
pub(crate) struct DumpSegment {
    pub(crate) address: i128,
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) small: bool,
    /// Sizes of the blocks live at the dump, by address.
    pub(crate) live: HashMap<i128, u64>,
}

/// A segment event of the trace: (allocated (true) or freed, address, size, stream).
pub(crate) type SegmentEvent = (bool, i128, u64, u64);

/// A block live at the start: (address, id, requested bytes, whether it is still live at the
/// dump, where its size is recorded).
pub(crate) type LiveAtStart = (i128, u64, u64, bool);

/// Rebuilds the start: `round` gives the size of a block from its request where the dump does not
/// record it (a block freed during the trace), widened where PyTorch cannot have split the
/// block (see `widen`); `max_split` is the recorded `max_split_size`. Blocks that fall in no
/// segment are left out (the replay allocates them normally).
pub(crate) fn start_segments(
    dump: &[DumpSegment],
    events: &[SegmentEvent],
    live: &[LiveAtStart],
    round: impl Fn(u64) -> u64,
    max_split: Option<u64>,
) -> Vec<StartSegment> {
    let mut segs: BTreeMap<i128, (u64, u64, bool)> = dump
        .iter()
        .map(|s| (s.address, (s.size, s.stream, s.small)))
        .collect();
    for &(allocated, addr, size, stream) in events.iter().rev() {
        if allocated {
            segs.remove(&addr);
        } else {
            // A freed segment's pool: small segments are 2 MiB (kSmallBuffer).
            segs.insert(addr, (size, stream, size == 2 << 20));
        }
    }
    let dump_sizes: HashMap<i128, u64> = dump.iter().flat_map(|s| s.live.clone()).collect();
    // Blocks whose size is guessed from their request, by (segment index, offset).
    let mut guessed = HashSet::new();
    let mut out: Vec<StartSegment> = segs
        .iter()
        .map(|(&addr, &(size, stream, small))| StartSegment {
            address: u64::try_from(addr).unwrap_or(0),
            size,
            stream,
            small,
            blocks: Vec::new(),
        })
        .collect();
    for &(addr, id, requested, live_at_dump) in live {
        let Some((&base, &(size, _, _))) = segs.range(..=addr).next_back() else {
            continue;
        };
        let offset = (addr - base) as u64;
        if offset >= size {
            continue;
        }
        let (block, known) = match dump_sizes.get(&addr) {
            Some(&s) if live_at_dump => (s, true),
            _ => (round(requested), false),
        };
        let index = segs.range(..base).count();
        out[index].blocks.push(StartBlock {
            offset,
            size: block.min(size - offset),
            id,
        });
        if !known {
            guessed.insert((index, offset));
        }
    }
    for (index, s) in out.iter_mut().enumerate() {
        s.blocks.sort_unstable_by_key(|b| b.offset);
        if !s.small {
            widen(s, index, &guessed, max_split);
        }
    }
    out
}

/// Gives a large-pool block whose size was guessed from its request the bytes PyTorch cannot
/// have split off it (reference §1.7): an oversize block (at least `max_split_size`) is never
/// split, so it runs to the next live block (the end of its segment, as it was served whole);
/// and every large-pool block is larger than 1 MiB (requests there are, and a split leaves more
/// than 1 MiB), so free bytes of at most 1 MiB up to the next live block are the tail of this
/// one, not a block of their own. Left as free blocks, such bytes could serve a request that
/// PyTorch served from a new segment.
fn widen(
    s: &mut StartSegment,
    index: usize,
    guessed: &HashSet<(usize, u64)>,
    max_split: Option<u64>,
) {
    for k in 0..s.blocks.len() {
        let b = s.blocks[k];
        if !guessed.contains(&(index, b.offset)) {
            continue;
        }
        let next = s.blocks.get(k + 1).map_or(s.size, |n| n.offset);
        let gap = next.saturating_sub(b.offset + b.size);
        let oversize = max_split.is_some_and(|m| b.size >= m);
        if oversize || gap <= 1 << 20 {
            s.blocks[k].size += gap;
        }
    }
}
