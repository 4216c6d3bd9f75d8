//! `check`: every invariant of the expandable allocator, as equations over the whole state.

use crate::backend::Backend;
use crate::expandable::state::State;
use crate::stats::PoolKind;

impl<B: Backend> State<B> {
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut index_entries = 0usize;
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
            // Free ranges: mapped, never touching each other, indexed.
            let mut prev_end = None;
            let mut free_sum = 0;
            if !seg.free.consistent() {
                return Err(format!(
                    "segment {key:#x}: free ranges' start and end maps disagree"
                ));
            }
            for (at, len) in seg.free.sorted() {
                if len == 0 || !seg.is_mapped(at, len) {
                    return Err(format!(
                        "free range {at:#x}+{len:#x} is empty or not mapped"
                    ));
                }
                if prev_end.is_some_and(|e| e >= at) {
                    return Err(format!(
                        "free range {at:#x} touches or overlaps the previous one"
                    ));
                }
                prev_end = Some(at + len as u64);
                free_sum += len;
                let indexed = self
                    .index
                    .get((seg.stream, seg.pool))
                    .is_some_and(|s| s.contains(len, at));
                if !indexed {
                    return Err(format!(
                        "free range {at:#x}+{len:#x} missing from the best-fit index"
                    ));
                }
            }
            index_entries += seg.free.len();
            let seg_live: usize = self
                .live
                .values()
                .filter(|b| b.seg == key)
                .map(|b| b.size)
                .sum();
            let seg_pending: usize = self
                .pending
                .iter()
                .filter(|p| p.block.seg == key)
                .map(|p| p.block.size)
                .sum();
            if free_sum + seg_live + seg_pending != seg.mapped_bytes {
                return Err(format!(
                    "segment {key:#x}: free {free_sum} + live {seg_live} + pending {seg_pending} != mapped {}",
                    seg.mapped_bytes
                ));
            }
            live_bytes += seg_live;
            pending_bytes += seg_pending;
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
                .segments
                .get(&b.seg)
                .ok_or(format!("block {at:#x} in a missing segment"))?;
            if at % 512 != 0 || !seg.is_mapped(at, b.size) || b.size < b.requested {
                return Err(format!(
                    "block {at:#x}+{:#x} misaligned, unmapped or too small",
                    b.size
                ));
            }
            spans.push((at, at + b.size as u64));
        }
        for p in &self.pending {
            spans.push((p.addr, p.addr + p.block.size as u64));
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
