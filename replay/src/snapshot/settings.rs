//! The traced program's `PYTORCH_CUDA_ALLOC_CONF`, from the snapshot's `allocator_settings`.

use crate::pickle::Value;
use vmm_alloc::config::parse_alloc_conf;

/// A `PYTORCH_CUDA_ALLOC_CONF` string for the recorded `allocator_settings`: the recorded string
/// when it is set and parses, else one rebuilt from the settings' fields (only keys that differ
/// from PyTorch's defaults, plus `expandable_segments`). Always accepted by
/// [`parse_alloc_conf`]; `None` when the snapshot has no settings (PyTorch before 2.1).
pub(super) fn alloc_conf(settings: Option<&Value>) -> Option<String> {
    let s = settings.filter(|s| matches!(s, Value::Dict(_)))?;
    if let Some(conf) = s.get("PYTORCH_CUDA_ALLOC_CONF").and_then(Value::as_str) {
        if !conf.trim().is_empty() && parse_alloc_conf(conf).is_ok() {
            return Some(conf.to_string());
        }
    }
    let flag = |key: &str| matches!(s.get(key), Some(Value::Bool(true)));
    let mut parts = Vec::new();
    if let Some(Value::Bool(b)) = s.get("expandable_segments") {
        parts.push(format!(
            "expandable_segments:{}",
            if *b { "True" } else { "False" }
        ));
    }
    if let Some(v) = s.get("max_split_size").and_then(Value::as_int) {
        if v > 0 {
            parts.push(format!(
                "max_split_size_mb:{}",
                v.unsigned_abs().div_ceil(1 << 20)
            ));
        }
    }
    if let Some(t) = s
        .get("garbage_collection_threshold")
        .and_then(|t| match *t {
            Value::Float(f) => Some(f),
            _ => t.as_int().map(|i| i as f64),
        })
    {
        if t > 0.0 {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
    }
    if let Some(r) = s.get("roundup_power2_divisions").and_then(roundup_setting) {
        parts.push(format!("roundup_power2_divisions:{r}"));
    }
    for key in [
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "graph_capture_record_stream_reuse",
        "pinned_use_background_threads",
    ] {
        if flag(key) {
            parts.push(format!("{key}:True"));
        }
    }
    if let Some(n) = s.get("pinned_num_register_threads").and_then(Value::as_int) {
        if n != 1 {
            parts.push(format!("pinned_num_register_threads:{n}"));
        }
    }
    // Keep only settings PyTorch (and so our parser) would accept.
    parts.retain(|p| parse_alloc_conf(p).is_ok());
    let conf = parts.join(",");
    parse_alloc_conf(&conf).is_ok().then_some(conf)
}

/// `roundup_power2_divisions` as recorded (`{"1": d, "2": d, ..., "32768": d}`, keys in MB) as a
/// config value: one number when all intervals agree, a list otherwise; `None` when all are 0.
fn roundup_setting(v: &Value) -> Option<String> {
    let Value::Dict(pairs) = v else {
        return None;
    };
    let mut entries: Vec<(u64, i64)> = pairs
        .iter()
        .filter_map(|(k, d)| {
            let mb = match k {
                Value::Str(s) => s.parse().ok()?,
                other => u64::try_from(other.as_int()?).ok()?,
            };
            Some((mb, d.as_int()?))
        })
        .collect();
    entries.sort_unstable();
    let first = entries.first()?.1;
    if entries.iter().all(|&(_, d)| d == first) {
        return (first > 0).then(|| first.to_string());
    }
    let list: Vec<String> = entries.iter().map(|(mb, d)| format!("{mb}:{d}")).collect();
    Some(format!("[{}]", list.join(",")))
}
