//! Builds the snapshot dict of a [`SnapshotDump`], with the keys and layout of PyTorch's
//! `THCPModule_memorySnapshot` (`shared/reference/pytorch-allocator.md` §4.2).

use std::collections::HashMap;
use std::rc::Rc;

use vmm_alloc::config::ROUNDUP_INTERVALS;
use vmm_alloc::snapshot::{BlockInfo, BlockState, SegmentInfo};
use vmm_alloc::stats::PoolKind;

use super::mapped::{extent, runs};
use super::{Action, SnapshotDump, TraceEntry};
use crate::pickle::Value;

/// The dump as PyTorch's snapshot dict.
pub(super) fn snapshot_value(d: &SnapshotDump) -> Value {
    let mut b = Builder::default();
    let entries: Vec<Value> = d.entries.iter().map(|e| b.entry(e)).collect();
    let mut segments: Vec<(u64, Value)> = d
        .final_state
        .segments
        .iter()
        .flat_map(|seg| runs(seg).map(move |run| (seg, run)))
        .map(|(seg, run)| (extent(run).0, b.segment(seg, run)))
        .collect();
    segments.sort_by_key(|&(address, _)| address);
    let segments = segments.into_iter().map(|(_, v)| v).collect();
    let settings = b.settings(d);
    b.dict(vec![
        ("segments", list(segments)),
        ("device_traces", list(vec![list(entries)])),
        ("allocator_settings", settings),
        ("external_annotations", list(Vec::new())),
    ])
}

/// Shares one string value per distinct text (keys repeat in every entry), and the empty frame
/// list every entry and block carries.
#[derive(Default)]
struct Builder {
    strings: HashMap<&'static str, Value>,
    no_frames: Option<Value>,
}

impl Builder {
    fn str(&mut self, s: &'static str) -> Value {
        self.strings
            .entry(s)
            .or_insert_with(|| Value::Str(Rc::from(s)))
            .clone()
    }

    fn no_frames(&mut self) -> Value {
        self.no_frames
            .get_or_insert_with(|| list(Vec::new()))
            .clone()
    }

    fn dict(&mut self, pairs: Vec<(&'static str, Value)>) -> Value {
        Value::Dict(pairs.into_iter().map(|(k, v)| (self.str(k), v)).collect())
    }

    /// A `device_traces` entry. PyTorch stores an OOM's free device bytes in the address field
    /// and writes it under `device_free`.
    fn entry(&mut self, e: &TraceEntry) -> Value {
        let addr_key = if e.action == Action::Oom {
            "device_free"
        } else {
            "addr"
        };
        let pairs = vec![
            ("action", self.str(e.action.name())),
            (addr_key, uint(e.addr)),
            ("size", uint(e.size)),
            ("stream", uint(e.stream)),
            ("time_us", uint(e.time_us)),
            ("frames", self.no_frames()),
        ];
        self.dict(pairs)
    }

    /// One mapped run of an expandable segment, drawn as a PyTorch segment.
    fn segment(&mut self, seg: &SegmentInfo, run: &[BlockInfo]) -> Value {
        let (start, end) = extent(run);
        let sum = |keep: fn(BlockState) -> bool, size: fn(&BlockInfo) -> usize| -> u64 {
            run.iter()
                .filter(|b| keep(b.state))
                .map(|b| size(b) as u64)
                .sum()
        };
        let allocated = |s| s == BlockState::ActiveAllocated;
        let active = |s| {
            matches!(
                s,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            )
        };
        let blocks = run.iter().map(|blk| self.block(blk)).collect();
        let pool_id = Value::Tuple(Rc::from(vec![Value::Int(0), Value::Int(0)]));
        let pairs = vec![
            ("device", Value::Int(0)),
            ("address", uint(start)),
            ("total_size", uint(end.saturating_sub(start))),
            ("allocated_size", uint(sum(allocated, |b| b.size))),
            ("active_size", uint(sum(active, |b| b.size))),
            ("requested_size", uint(sum(active, |b| b.requested_size))),
            ("stream", uint(seg.stream.raw())),
            ("segment_type", self.str(pool_name(seg.pool))),
            ("segment_pool_id", pool_id),
            ("is_expandable", Value::Bool(true)),
            ("frames", self.no_frames()),
            ("blocks", list(blocks)),
        ];
        self.dict(pairs)
    }

    fn block(&mut self, b: &BlockInfo) -> Value {
        let state = match b.state {
            BlockState::ActiveAllocated => "active_allocated",
            // The name the viewer knows (PyTorch's docstring says `active_awaiting_free`).
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive | BlockState::Unmapped => "inactive",
        };
        let pairs = vec![
            ("address", uint(b.address.get())),
            ("size", uint(b.size as u64)),
            ("requested_size", uint(b.requested_size as u64)),
            ("state", self.str(state)),
            ("frames", self.no_frames()),
        ];
        self.dict(pairs)
    }

    /// `allocator_settings`: what of PyTorch's keys the policy has.
    fn settings(&mut self, d: &SnapshotDump) -> Value {
        let mut pairs = Vec::new();
        if let Some(conf) = &d.alloc_conf {
            pairs.push((
                "PYTORCH_CUDA_ALLOC_CONF",
                Value::Str(Rc::from(conf.as_str())),
            ));
        }
        // -1 when unset: PyTorch writes SIZE_MAX as a signed integer.
        let max_split = d
            .config
            .max_split_size
            .map_or(-1, |m| i64::try_from(m).unwrap_or(-1));
        pairs.push(("max_split_size", Value::Int(max_split)));
        pairs.push(("expandable_segments", Value::Bool(true)));
        // Keys "1", "2", "4", ... (MB, doubling), as PyTorch writes them.
        let divisions = (0..ROUNDUP_INTERVALS)
            .zip(d.config.roundup_power2_divisions)
            .map(|(i, div)| {
                (
                    Value::Str(Rc::from((1u64 << i).to_string())),
                    uint(div as u64),
                )
            })
            .collect();
        pairs.push(("roundup_power2_divisions", Value::Dict(divisions)));
        self.dict(pairs)
    }
}

fn pool_name(pool: PoolKind) -> &'static str {
    match pool {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
    }
}

fn list(items: Vec<Value>) -> Value {
    Value::List(Rc::from(items))
}

/// An unsigned integer: beyond `i64` (a stream pointer, say) as the minimal two's-complement
/// bytes Python would write, a 0 byte keeping it positive.
fn uint(x: u64) -> Value {
    match i64::try_from(x) {
        Ok(i) => Value::Int(i),
        Err(_) => {
            let mut bytes = x.to_le_bytes().to_vec();
            bytes.push(0);
            Value::BigInt(Rc::from(bytes))
        }
    }
}
