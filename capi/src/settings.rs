//! What the library runs with: the backend (`VMM_ALLOC_BACKEND`), PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` and our own options (`VMM_ALLOC_CONF`), validated once, before the
//! first device is opened.

use vmm_alloc::config::{ExpandableConfig, OWN_KEYS};

/// Which backend every device uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BackendKind {
    /// The GPU, through the CUDA driver (the default).
    Cuda,
    /// Real bytes in host memory (memfd + mmap): runs and can be tested without a GPU.
    Host,
    /// Bookkeeping only: addresses that must never be dereferenced (benchmarks).
    Sim,
}

impl BackendKind {
    /// The name `VMM_ALLOC_BACKEND` uses.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Host => "host",
            BackendKind::Sim => "sim",
        }
    }
}

/// The settings in force.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The backend.
    pub backend: BackendKind,
    /// The allocator configuration, `PYTORCH_CUDA_ALLOC_CONF` and ours applied.
    pub config: ExpandableConfig,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string applied, if any.
    pub pytorch_conf: Option<String>,
    /// The `VMM_ALLOC_CONF` string applied, if any.
    pub ours: Option<String>,
    /// Device capacity of the Host and Sim backends, in bytes (`capacity_mb`).
    pub capacity: Option<usize>,
}

/// Help appended to every configuration error.
const OURS_HELP: &str = "VMM_ALLOC_CONF takes comma-separated key:value pairs: \
policy:expandable|pytorch-expandable, handle_cache:True|False, handle_cache_limit_mb:N, \
remap_defrag:True|False, remap_before_create:True|False, sync_only_after_frees:True|False, \
pressure_tail:True|False, borrow_across_pools:True|False, headroom_fraction:F, headroom_mb:N, \
va_factor:F, small_page_mb:N, large_page_mb:N, park_remaps:True|False, front_cache:True|False|auto, best_fit_growth:True|False, reuse_last_free:True|False, drain_after_sync:True|False, harvest_lowest_first:True|False, give_back_before_foreign_sync:True|False, give_back_below_free_pages:F, give_back_below_all_free_pages:F, fine_pages_above:F, reuse_last_free_above:F, tail_takes_rest:True|False, alias_rescue:True|False, rescue_after_oom:True|False, skip_hopeless_growth:True|False, put_back_after_retry:True|False, keep_after_retry:True|False, va_fallback:True|False, stream_page_share:F, stream_page_floor_mb:N, capacity_mb:N (host and sim backends only)";

impl Settings {
    /// Reads `VMM_ALLOC_BACKEND`, `PYTORCH_CUDA_ALLOC_CONF` and `VMM_ALLOC_CONF`.
    pub fn from_env() -> Result<Settings, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Settings::parse(
            var("VMM_ALLOC_BACKEND").as_deref(),
            var("PYTORCH_CUDA_ALLOC_CONF").as_deref(),
            var("VMM_ALLOC_CONF").as_deref(),
        )
    }

    /// Builds settings from the three strings (absent = defaults), or says what is wrong.
    pub fn parse(
        backend: Option<&str>,
        pytorch_conf: Option<&str>,
        ours: Option<&str>,
    ) -> Result<Settings, String> {
        let backend = match backend.map(str::trim) {
            None | Some("cuda") => BackendKind::Cuda,
            Some("host") => BackendKind::Host,
            Some("sim") => BackendKind::Sim,
            Some(other) => {
                return Err(format!(
                    "VMM_ALLOC_BACKEND={other:?} is not a backend: use cuda (the GPU), host (real \
                     bytes in host memory, no GPU needed) or sim (bookkeeping only)"
                ))
            }
        };
        let mut config = ExpandableConfig::default();
        let mut capacity = None;
        if let Some(ours) = ours {
            apply_ours(&mut config, &mut capacity, ours)
                .map_err(|e| format!("VMM_ALLOC_CONF={ours:?}: {e}. {OURS_HELP}"))?;
        }
        if let Some(conf) = pytorch_conf {
            config = config
                .with_alloc_conf(conf)
                .map_err(|e| format!("PYTORCH_CUDA_ALLOC_CONF={conf:?}: {e}"))?;
        }
        config
            .validate()
            .map_err(|e| format!("invalid configuration: {e}"))?;
        if capacity.is_some() && backend == BackendKind::Cuda {
            return Err(format!(
                "VMM_ALLOC_CONF: capacity_mb applies to the host and sim backends only, the \
                 backend is cuda. {OURS_HELP}"
            ));
        }
        Ok(Settings {
            backend,
            config,
            pytorch_conf: pytorch_conf.map(str::to_owned),
            ours: ours.map(str::to_owned),
            capacity,
        })
    }
}

fn parse_mb(key: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .and_then(|mb| mb.checked_mul(1 << 20))
        .ok_or_else(|| format!("{key} takes a whole number of MiB, not {v:?}"))
}

/// Applies `VMM_ALLOC_CONF`: `policy` picks the base config (replacing what came before it),
/// `capacity_mb` is read here, and every other key must be one of the
/// library's own settings (`vmm_alloc::config::OWN_KEYS`), applied last by
/// `ExpandableConfig::with_settings` with its rules (one parser for the C ABI, Python and
/// `vmm-replay --conf expandable=...`).
fn apply_ours(
    config: &mut ExpandableConfig,
    capacity: &mut Option<usize>,
    s: &str,
) -> Result<(), String> {
    let mut own = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once(':')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| format!("{item:?} is not key:value"))?;
        match key {
            "policy" => match value {
                "expandable" => {}
                "pytorch-expandable" => *config = ExpandableConfig::pytorch_expandable(),
                _ => {
                    return Err(format!(
                        "policy {value:?} is not expandable or pytorch-expandable"
                    ))
                }
            },
            "capacity_mb" => *capacity = Some(parse_mb(key, value)?),
            _ if OWN_KEYS.iter().any(|(k, _)| *k == key) => own.push(format!("{key}:{value}")),
            _ => return Err(format!("unknown key {key:?}")),
        }
    }
    *config = config
        .clone()
        .with_settings(&own.join(","))
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_cuda_and_the_default_config() {
        let s = Settings::parse(None, None, None).unwrap();
        assert_eq!(s.backend, BackendKind::Cuda);
        assert_eq!(s.config, ExpandableConfig::default());
    }

    #[test]
    fn both_strings_apply_and_pytorch_keys_win_where_they_overlap() {
        let s = Settings::parse(
            Some("host"),
            Some("large_segment_size_mb:64,expandable_segments:True"),
            Some("large_page_mb:8,handle_cache:False,capacity_mb:512"),
        )
        .unwrap();
        assert_eq!(s.backend, BackendKind::Host);
        assert_eq!(s.config.large_page, 64 << 20);
        assert!(!s.config.handle_cache);
        assert_eq!(s.capacity, Some(512 << 20));
    }

    #[test]
    fn every_own_setting_of_the_library_is_taken() {
        let s = Settings::parse(
            Some("host"),
            None,
            Some("remap_before_create:True,headroom_mb:128,va_factor:2,borrow_across_pools:False"),
        )
        .unwrap();
        assert!(s.config.remap_before_create && !s.config.borrow_across_pools);
        assert_eq!(
            (s.config.headroom_bytes, s.config.va_factor),
            (128 << 20, 2.0)
        );
        // The policy picks the base; the settings after it apply on top.
        let s = Settings::parse(
            Some("host"),
            None,
            Some("policy:pytorch-expandable,handle_cache:True"),
        )
        .unwrap();
        let pytorch = ExpandableConfig::pytorch_expandable();
        assert!(s.config.handle_cache && !s.config.remap_defrag);
        assert_eq!(s.config.faithful_oversize, pytorch.faithful_oversize);
    }

    #[test]
    fn bad_values_are_refused_with_the_variable_named() {
        let e = Settings::parse(Some("gpu"), None, None).unwrap_err();
        assert!(e.contains("VMM_ALLOC_BACKEND") && e.contains("host"), "{e}");
        let e = Settings::parse(None, Some("max_split_size_mb:2"), None).unwrap_err();
        assert!(e.starts_with("PYTORCH_CUDA_ALLOC_CONF"), "{e}");
        let e = Settings::parse(Some("host"), None, Some("remap_defrag:maybe")).unwrap_err();
        assert!(e.contains("remap_defrag takes True or False"), "{e}");
        let e = Settings::parse(Some("host"), None, Some("colour:blue")).unwrap_err();
        assert!(
            e.contains("unknown key \"colour\"") && e.contains("capacity_mb"),
            "{e}"
        );
        let e = Settings::parse(Some("host"), None, Some("headroom_fraction:1.5")).unwrap_err();
        assert!(e.contains("headroom_fraction 1.5 must be in [0, 1]"), "{e}");
        let e = Settings::parse(None, None, Some("capacity_mb:64")).unwrap_err();
        assert!(e.contains("host and sim backends only"), "{e}");
    }
}
