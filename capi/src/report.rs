//! Text and JSON for Python: the out-of-memory report and the statistics under PyTorch's names.

use serde_json::{json, Map, Value};
use vmm_alloc::backend::CallKind;
use vmm_alloc::error::format_size;
use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::stats::{Stat, StatArray};
use vmm_alloc::{AllocError, MemoryStats};

use crate::devices::DeviceOps;

/// PyTorch's message plus where the reserved memory is and what to try.
pub fn oom_report(err: &AllocError, dev: &dyn DeviceOps) -> String {
    let s = dev.allocator().stats();
    let snap = dev.allocator().snapshot();
    let largest_free = largest_free_block(&snap);
    let reserved = s.reserved_bytes.all.current;
    let allocated = s.allocated_bytes.all.current;
    let unallocated = reserved.saturating_sub(allocated);
    let sleep = dev.sleep_totals();
    format!(
        "{err}\nvmm_alloc: reserved {} in {} segment(s), allocated {} in {} allocation(s); \
         reserved but unallocated {} (largest free block {}), cached physical handles {}, \
         sleepable allocations {} awake and {} asleep.\n\
         Advice: vmm_alloc already maps free pages where they are needed (remap), so this is \
         real demand: free tensors or lower the batch size. If reserved-but-unallocated memory \
         is large, try a smaller large-pool page (PYTORCH_CUDA_ALLOC_CONF=large_segment_size_mb:2) \
         or release cached memory (torch.cuda.empty_cache()); put idle weights to sleep with \
         vmm_alloc.sleep().",
        format_size(reserved),
        s.segment.all.current,
        format_size(allocated),
        s.allocation.all.current,
        format_size(unallocated),
        format_size(largest_free),
        format_size(s.handle_cache_bytes),
        format_size(sleep.mapped_bytes),
        format_size(sleep.asleep_bytes),
    )
}

fn largest_free_block(snap: &Snapshot) -> u64 {
    snap.segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size as u64)
        .max()
        .unwrap_or(0)
}

fn put_stat(out: &mut Map<String, Value>, name: &str, s: &Stat) {
    for (metric, v) in [
        ("current", s.current),
        ("peak", s.peak),
        ("allocated", s.allocated),
        ("freed", s.freed),
    ] {
        out.insert(format!("{name}.{metric}"), json!(v));
    }
}

fn put_array(out: &mut Map<String, Value>, name: &str, a: &StatArray) {
    for (pool, s) in [
        ("all", &a.all),
        ("small_pool", &a.small_pool),
        ("large_pool", &a.large_pool),
    ] {
        put_stat(out, &format!("{name}.{pool}"), s);
    }
}

/// The statistics as `torch.cuda.memory_stats()` names them (flat keys), plus ours under
/// `vmm.`: driver calls by kind, cached handles, remapped bytes, fragmentation, sleep pool.
pub fn stats_json(s: &MemoryStats, dev: &dyn DeviceOps, max_split_size: Option<usize>) -> String {
    let mut out = Map::new();
    for (name, a) in [
        ("allocation", &s.allocation),
        ("segment", &s.segment),
        ("active", &s.active),
        ("inactive_split", &s.inactive_split),
        ("allocated_bytes", &s.allocated_bytes),
        ("reserved_bytes", &s.reserved_bytes),
        ("active_bytes", &s.active_bytes),
        ("inactive_split_bytes", &s.inactive_split_bytes),
        ("requested_bytes", &s.requested_bytes),
    ] {
        put_array(&mut out, name, a);
    }
    put_stat(&mut out, "oversize_allocations", &Stat::default());
    put_stat(&mut out, "oversize_segments", &Stat::default());
    for (k, v) in [
        ("num_alloc_retries", s.num_alloc_retries),
        ("num_ooms", s.num_ooms),
        ("num_sync_all_streams", 0),
        ("num_device_alloc", s.num_device_alloc),
        ("num_device_free", s.num_device_free),
    ] {
        out.insert(k.into(), json!(v));
    }
    out.insert(
        "max_split_size".into(),
        json!(max_split_size.map_or(-1, |m| m as i64)),
    );
    let reserved = s.reserved_bytes.all.current;
    let fragmentation = if reserved == 0 {
        0.0
    } else {
        1.0 - s.allocated_bytes.all.current as f64 / reserved as f64
    };
    let sleep = dev.sleep_totals();
    for (k, v) in [
        ("handles_cached", s.handles_cached),
        ("handle_cache_bytes", s.handle_cache_bytes),
        ("bytes_created", s.bytes_created),
        ("handle_reuses", s.handle_reuses),
        ("remapped_bytes", s.remapped_bytes),
        ("stuck_bytes", s.stuck_bytes),
        ("parked_bytes", s.parked_bytes),
        ("parked_pages", s.parked_pages),
        ("alias_rescues", s.alias_rescues),
        ("alias_revivals", s.alias_revivals),
        ("alias_bytes", s.alias_bytes),
        ("alias_mappings", s.alias_mappings),
        ("rescues_in_space", s.rescues_in_space),
        ("driver_calls", s.calls.total()),
        ("sleep.allocations", sleep.allocations),
        ("sleep.requested_bytes", sleep.requested_bytes),
        ("sleep.mapped_bytes", sleep.mapped_bytes),
        ("sleep.asleep_bytes", sleep.asleep_bytes),
        ("sleep.saved_bytes", sleep.saved_bytes),
    ] {
        out.insert(format!("vmm.{k}"), json!(v));
    }
    for kind in CallKind::ALL {
        out.insert(
            format!("vmm.driver_calls.{}", kind.driver_name()),
            json!(s.calls.calls(kind)),
        );
    }
    out.insert("vmm.fragmentation".into(), json!(fragmentation));
    out.insert("vmm.backend".into(), json!(dev.backend_name()));
    Value::Object(out).to_string()
}
