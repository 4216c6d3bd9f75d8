//! `check`: every invariant of the expandable allocator, as equations over the whole state.

use crate::backend::Backend;
use crate::expandable::pieces::{Kind, NIL};
use crate::expandable::state::State;
use crate::stats::PoolKind;

impl<B: Backend> State<B> {
    pub(crate) fn check(&self) -> Result<(), String> {
        let (mut index_entries, mut pieces_total) = (0usize, 0usize);
        let (mut mapped_total, mut live_bytes, mut pending_bytes) = (0usize, 0usize, 0usize);
        for (&key, seg) in &self.segments {
            if key != seg.start() {
                return Err(format!(
                    "segment keyed {key:#x} starts at {:#x}",
                    seg.start()
                ));
            }
            // Chunks: inside the VA, disjoint, summing to mapped_bytes.
            let mut cursor = seg.start();
            let mut sum = 0;
            for (&at, c) in &seg.chunks {
                if at < cursor || at + c.len as u64 > seg.end() || c.len % self.granularity != 0 {
                    return Err(format!(
                        "chunk {at:#x}+{:#x} overlaps or leaves segment {key:#x}",
                        c.len
                    ));
                }
                cursor = at + c.len as u64;
                sum += c.len;
            }
            for (&at, c) in &seg.stuck {
                let end = at + c.len as u64;
                let clash = seg.chunks.range(..end).next_back();
                if clash.is_some_and(|(&s, k)| s + k.len as u64 > at) || end > seg.end() {
                    return Err(format!(
                        "stuck chunk {at:#x} overlaps a chunk or leaves {key:#x}"
                    ));
                }
            }
            if !seg.occupied_is_consistent() {
                return Err(format!(
                    "segment {key:#x}: the mapped runs disagree with its chunks"
                ));
            }
            if sum != seg.mapped_bytes {
                return Err(format!(
                    "segment {key:#x}: chunks sum {sum} != mapped_bytes {}",
                    seg.mapped_bytes
                ));
            }
            mapped_total += sum;
            // The tiling: covers the VA in linked order; free pieces mapped, never touching,
            // indexed; gaps merged, listed, and exactly what no chunk covers; one used piece
            // per block.
            let tiling = self.pieces.tiling(seg.tail);
            pieces_total += tiling.len();
            let (mut cursor, mut prev) = (seg.start(), (NIL, None));
            let (mut free_sum, mut gaps, mut used) = (0, 0, 0);
            for &id in &tiling {
                let p = *self.pieces.get(id);
                if p.start != cursor || p.len == 0 || p.prev != prev.0 {
                    return Err(format!(
                        "segment {key:#x}: piece {id} at {:#x}+{:#x} breaks the tiling at {cursor:#x}",
                        p.start, p.len
                    ));
                }
                if prev.1 == Some(p.kind) && p.kind != Kind::Used {
                    return Err(format!(
                        "segment {key:#x}: two {:?} pieces touch at {:#x}",
                        p.kind, p.start
                    ));
                }
                if p.kind != Kind::Gap && !seg.is_mapped(p.start, p.len) {
                    return Err(format!(
                        "{:?} piece {:#x}+{:#x} is not mapped",
                        p.kind, p.start, p.len
                    ));
                }
                match p.kind {
                    Kind::Free => {
                        free_sum += p.len;
                        index_entries += 1;
                        if !self.index.at(seg.slot).contains((p.len, p.start, id)) {
                            return Err(format!(
                                "free range {:#x}+{:#x} missing from the best-fit index",
                                p.start, p.len
                            ));
                        }
                    }
                    Kind::Gap => {
                        gaps += 1;
                        if seg.gaps.get(&p.start) != Some(&id) {
                            return Err(format!("gap {:#x} missing from the gap map", p.start));
                        }
                    }
                    Kind::Used => used += 1,
                }
                cursor = p.end();
                prev = (id, Some(p.kind));
            }
            if cursor != seg.end() || self.pieces.get(seg.tail).next != NIL {
                return Err(format!("segment {key:#x}: the tiling ends at {cursor:#x}"));
            }
            if gaps != seg.gaps.len() {
                return Err(format!(
                    "segment {key:#x}: {gaps} gap pieces, {} in the gap map",
                    seg.gaps.len()
                ));
            }
            if self.index.find((seg.stream, seg.pool)) != Some(seg.slot) {
                return Err(format!("segment {key:#x} names another index"));
            }
            let inside = |at: u64| seg.start() <= at && at < seg.end();
            let mut blocks = 0;
            let (mut seg_live, mut seg_pending) = (0, 0);
            for (at, b, pending) in self
                .live
                .iter()
                .map(|(&at, b)| (at, b, false))
                .chain(self.pending.iter().map(|p| (p.addr, &p.block, true)))
                .filter(|&(at, _, _)| inside(at))
            {
                let p = self.pieces.get(b.piece);
                if p.kind != Kind::Used || p.start != at || b.slot != seg.slot {
                    return Err(format!(
                        "block {at:#x}: its piece is {:?} {:#x}+{:#x}",
                        p.kind, p.start, p.len
                    ));
                }
                blocks += 1;
                if pending {
                    seg_pending += p.len;
                } else {
                    seg_live += p.len;
                }
            }
            if blocks != used {
                return Err(format!(
                    "segment {key:#x}: {used} used pieces for {blocks} blocks"
                ));
            }
            if free_sum + seg_live + seg_pending != seg.mapped_bytes {
                return Err(format!(
                    "segment {key:#x}: free {free_sum} + live {seg_live} + pending {seg_pending} != mapped {}",
                    seg.mapped_bytes
                ));
            }
            live_bytes += seg_live;
            pending_bytes += seg_pending;
        }
        if pieces_total != self.pieces.in_use() {
            return Err(format!(
                "{} pieces in use, the tilings hold {pieces_total}",
                self.pieces.in_use()
            ));
        }
        let total_index = self.index.len();
        if total_index != index_entries {
            return Err(format!(
                "index holds {total_index} ranges, segments {index_entries}"
            ));
        }
        // Blocks: aligned, mapped, disjoint.
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (&at, b) in &self.live {
            let seg = self
                .segment_of(at)
                .and_then(|k| self.segments.get(&k))
                .ok_or(format!("block {at:#x} in a missing segment"))?;
            let size = self.size_of(b);
            if at % 512 != 0 || !seg.is_mapped(at, size) || size < b.requested {
                return Err(format!(
                    "block {at:#x}+{:#x} misaligned, unmapped or too small",
                    self.size_of(b)
                ));
            }
            spans.push((at, at + self.size_of(b) as u64));
        }
        for p in &self.pending {
            spans.push((p.addr, p.addr + self.size_of(&p.block) as u64));
        }
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[0].1 > w[1].0) {
            return Err("two blocks overlap".into());
        }
        // Stats equal the sums.
        let s = &self.stats;
        let checks = [
            (
                "reserved_bytes",
                s.reserved_bytes.all.current,
                mapped_total as u64,
            ),
            (
                "allocated_bytes",
                s.allocated_bytes.all.current,
                live_bytes as u64,
            ),
            (
                "active_bytes",
                s.active_bytes.all.current,
                (live_bytes + pending_bytes) as u64,
            ),
            (
                "allocation",
                s.allocation.all.current,
                self.live.len() as u64,
            ),
            (
                "active",
                s.active.all.current,
                (self.live.len() + self.pending.len()) as u64,
            ),
            ("segment", s.segment.all.current, self.segments.len() as u64),
        ];
        if !self.cache.consistent() {
            return Err("the handle cache's byte and handle counts disagree with its lists".into());
        }
        for (name, stat, sum) in checks {
            if stat != sum {
                return Err(format!("stat {name} = {stat}, but the state sums to {sum}"));
            }
        }
        for pool in [PoolKind::Small, PoolKind::Large] {
            let a = s.allocated_bytes.pool(pool).current;
            let r = s.reserved_bytes.pool(pool).current;
            if a > r {
                return Err(format!("{pool:?} pool: allocated {a} > reserved {r}"));
            }
        }
        Ok(())
    }
}
