//! The dump-time state of a device: its live blocks and reserved bytes from the `segments`
//! list (the anchor the trace is undone from), and its segments for the start-state rebuild.

use std::collections::{BTreeMap, HashMap};

use super::entries::{addr_field, size_field, stream_field, Work};
use crate::pickle::Value;
use crate::start_segments::DumpSegment;

/// Disjoint half-open ranges of 2 MiB granules (expandable-segment mappings), merged on insert.
#[derive(Default)]
pub(super) struct RangeSet(BTreeMap<i128, i128>);

impl RangeSet {
    pub(super) fn covers(&self, lo: i128, hi: i128) -> bool {
        lo >= hi
            || self
                .0
                .range(..=lo)
                .next_back()
                .is_some_and(|(_, &end)| end >= hi)
    }

    pub(super) fn insert(&mut self, mut lo: i128, mut hi: i128) {
        if lo >= hi {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=lo).next_back() {
            if e >= lo {
                lo = s;
                hi = hi.max(e);
            }
        }
        let overlapping: Vec<(i128, i128)> = self.0.range(lo..=hi).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.0.remove(&s);
            hi = hi.max(e);
        }
        self.0.insert(lo, hi);
    }

    pub(super) fn remove(&mut self, lo: i128, hi: i128) {
        let hit: Vec<(i128, i128)> = self
            .0
            .range(..hi)
            .rev()
            .take_while(|&(_, &e)| e > lo)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in hit {
            self.0.remove(&s);
            if s < lo {
                self.0.insert(s, lo);
            }
            if e > hi {
                self.0.insert(hi, e);
            }
        }
    }
}

/// The granules `[addr, addr + size)` touches (2 MiB, the smallest expandable page).
pub(super) fn granules(addr: i128, size: u64) -> (i128, i128) {
    let g = 1i128 << 21;
    let end = addr.saturating_add(i128::from(size)).saturating_add(g - 1);
    (addr >> 21, end >> 21)
}

/// The block states PyTorch writes (`active_awaiting_free` is its docstring's name for
/// `active_pending_free`, pytorch-allocator.md §4.2); every state but `inactive` is live.
const BLOCK_STATES: [&str; 4] = [
    "active_allocated",
    "active_pending_free",
    "active_awaiting_free",
    "inactive",
];

/// Blocks live at dump time on `dev`, by address: (requested size, stream). Also returns the
/// reserved bytes at dump and whether the device has any segment.
pub(super) type DumpState = (HashMap<Option<i128>, (u64, u64)>, i128, bool);

pub(super) fn dump_state(
    dev: u64,
    segments: &[Value],
    work: &mut Work,
) -> Result<DumpState, String> {
    let mut blocks = HashMap::new();
    let mut reserved: i128 = 0;
    let mut any = false;
    for (si, s) in segments.iter().enumerate() {
        work.spend(s)?;
        // A segment without "device" belongs to every device, as in trace_summary.
        if s.get("device")
            .and_then(Value::as_i128)
            .unwrap_or(i128::from(dev))
            != i128::from(dev)
        {
            continue;
        }
        any = true;
        let total = size_field(s, "total_size").map_err(|m| format!("segment {si}: {m}"))?;
        reserved += i128::from(total);
        let stream = stream_field(s);
        let seg_addr = addr_field(s, "address");
        let mut offset: i128 = 0;
        let list = match s.get("blocks") {
            None | Some(Value::None) => None,
            Some(list) if list.as_seq().is_some() => Some(list),
            Some(other) => {
                return Err(format!(
                    "segment {si}: \"blocks\" is a {}, expected a list",
                    other.type_name()
                ))
            }
        };
        if let Some(list) = list {
            work.spend(list)?;
        }
        for (bi, b) in list
            .and_then(Value::as_seq)
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            work.spend(b)?;
            if !matches!(b, Value::Dict(_)) {
                return Err(format!(
                    "segment {si}: block {bi} is a {}, expected a dict",
                    b.type_name()
                ));
            }
            let bsize = size_field(b, "size").map_err(|m| format!("segment {si}: {m}"))?;
            // Blocks sit back to back from the segment's start when no address is recorded.
            let at =
                addr_field(b, "address").or_else(|| seg_addr.map(|a| a.saturating_add(offset)));
            offset = offset.saturating_add(i128::from(bsize));
            let state = match b.get("state") {
                Some(Value::Str(state)) if BLOCK_STATES.contains(&&**state) => &**state,
                Some(Value::Str(other)) => {
                    return Err(format!(
                        "segment {si}: block {bi} has state {}, expected one of {}",
                        crate::shown(other),
                        BLOCK_STATES.join(", ")
                    ))
                }
                _ => {
                    return Err(format!(
                        "segment {si}: block {bi} has no \"state\" string (expected one of {})",
                        BLOCK_STATES.join(", ")
                    ))
                }
            };
            if state != "inactive" {
                let requested = if b.get("requested_size").is_some() {
                    size_field(b, "requested_size")
                } else {
                    Ok(bsize)
                };
                let requested = requested.map_err(|m| format!("segment {si}: {m}"))?;
                // A live block records a request of at least 1 byte; one that says 0 (or null)
                // holds its block's bytes, and a block of 0 bytes holds nothing to replay (a
                // live block of 0 bytes is a request no allocator can place).
                let requested = if requested == 0 { bsize } else { requested };
                if requested > 0 {
                    blocks.insert(at, (requested, stream));
                }
            }
        }
    }
    Ok((blocks, reserved, any))
}

/// The device's segments at the dump, with the sizes of their live blocks. Only what the
/// state-reading pass (`dump_state`) already validated is read here, so nothing fails.
pub(super) fn dump_segments(dev: u64, segments: &[Value]) -> Vec<DumpSegment> {
    let mut out = Vec::new();
    for s in segments {
        let on_dev = s
            .get("device")
            .and_then(Value::as_i128)
            .unwrap_or(i128::from(dev))
            == i128::from(dev);
        let (Some(address), Ok(size)) = (addr_field(s, "address"), size_field(s, "total_size"))
        else {
            continue;
        };
        if !on_dev {
            continue;
        }
        let small = match s.get("segment_type").and_then(Value::as_str) {
            Some(kind) => kind == "small",
            None => size == 2 << 20,
        };
        let mut live = HashMap::new();
        let mut offset: i128 = 0;
        for b in s.get("blocks").and_then(Value::as_seq).unwrap_or(&[]) {
            let bsize = size_field(b, "size").unwrap_or(0);
            let at = addr_field(b, "address").unwrap_or(address.saturating_add(offset));
            offset = offset.saturating_add(i128::from(bsize));
            let state = b.get("state").and_then(Value::as_str).unwrap_or("");
            if state.starts_with("active") {
                live.insert(at, bsize);
            }
        }
        out.push(DumpSegment {
            address,
            size,
            stream: stream_field(s),
            small,
            live,
        });
    }
    out
}
