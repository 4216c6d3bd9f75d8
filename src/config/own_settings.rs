//! Our policy's own settings in `PYTORCH_CUDA_ALLOC_CONF`'s grammar (`key:value,...`), beside
//! PyTorch's keys: what `vmm-replay --conf expandable=...` and [`ExpandableConfig::with_settings`]
//! accept, so every switch that makes our policy differ from PyTorch's can be turned and measured
//! without writing Rust.

use super::alloc_conf::{parse_alloc_conf, ConfigError, KNOWN_KEYS};
use super::{ExpandableConfig, FrontCacheMode};

const MB: f64 = (1u64 << 20) as f64;

/// Our keys, each with what it sets (for the error that lists them).
pub const OWN_KEYS: [(&str, &str); 32] = [
    (
        "headroom_fraction",
        "ExpandableConfig::headroom_fraction, in [0, 1]",
    ),
    ("headroom_mb", "ExpandableConfig::headroom_bytes, in MiB"),
    ("handle_cache", "ExpandableConfig::handle_cache, true/false"),
    (
        "handle_cache_limit_mb",
        "ExpandableConfig::handle_cache_limit, in MiB",
    ),
    ("remap_defrag", "ExpandableConfig::remap_defrag, true/false"),
    (
        "remap_before_create",
        "ExpandableConfig::remap_before_create, true/false",
    ),
    (
        "sync_only_after_frees",
        "ExpandableConfig::sync_only_after_frees, true/false",
    ),
    (
        "pressure_tail",
        "ExpandableConfig::pressure_tail, true/false",
    ),
    (
        "borrow_across_pools",
        "ExpandableConfig::borrow_across_pools, true/false",
    ),
    ("va_factor", "ExpandableConfig::va_factor, in [1, 64]"),
    ("small_page_mb", "ExpandableConfig::small_page, in MiB"),
    ("large_page_mb", "ExpandableConfig::large_page, in MiB"),
    ("park_remaps", "ExpandableConfig::park_remaps, true/false"),
    (
        "front_cache",
        "ExpandableConfig::front_cache, true/false/auto",
    ),
    (
        "best_fit_growth",
        "ExpandableConfig::best_fit_growth, true/false",
    ),
    (
        "reuse_last_free",
        "ExpandableConfig::reuse_last_free, true/false",
    ),
    (
        "drain_after_sync",
        "ExpandableConfig::drain_after_sync, true/false",
    ),
    (
        "harvest_lowest_first",
        "ExpandableConfig::harvest_lowest_first, true/false",
    ),
    (
        "give_back_before_foreign_sync",
        "ExpandableConfig::give_back_before_foreign_sync, true/false",
    ),
    (
        "give_back_below_free_pages",
        "ExpandableConfig::give_back_below_free_pages, in [0, 1]",
    ),
    (
        "give_back_below_all_free_pages",
        "ExpandableConfig::give_back_below_all_free_pages, in [0, 1]",
    ),
    (
        "fine_pages_above",
        "ExpandableConfig::fine_pages_above, in [0, 1]",
    ),
    (
        "reuse_last_free_above",
        "ExpandableConfig::reuse_last_free_above, in [0, 1]",
    ),
    (
        "tail_takes_rest",
        "ExpandableConfig::tail_takes_rest, true/false",
    ),
    ("alias_rescue", "ExpandableConfig::alias_rescue, true/false"),
    (
        "rescue_after_oom",
        "ExpandableConfig::rescue_after_oom, true/false",
    ),
    (
        "skip_hopeless_growth",
        "ExpandableConfig::skip_hopeless_growth, true/false",
    ),
    (
        "put_back_after_retry",
        "ExpandableConfig::put_back_after_retry, true/false",
    ),
    (
        "keep_after_retry",
        "ExpandableConfig::keep_after_retry, true/false",
    ),
    ("va_fallback", "ExpandableConfig::va_fallback, true/false"),
    (
        "stream_page_share",
        "ExpandableConfig::stream_page_share, in [0, 1]",
    ),
    (
        "stream_page_floor_mb",
        "ExpandableConfig::stream_page_floor, in MiB",
    ),
];

/// The `key:value` settings of a configuration string, split at the commas outside `[...]`
/// (`roundup_power2_divisions` takes a bracketed list), whitespace dropped, empty ones skipped.
///
/// ```
/// use vmm_alloc::config::split_settings;
/// assert_eq!(split_settings(" a:1, roundup_power2_divisions:[256:4,>:1],,"),
///            ["a:1", "roundup_power2_divisions:[256:4,>:1]"]);
/// ```
pub fn split_settings(conf: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut item = String::new();
    let mut depth = 0usize;
    for c in conf.chars().filter(|c| !c.is_whitespace()) {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.extend((!item.is_empty()).then(|| std::mem::take(&mut item)));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    out.extend((!item.is_empty()).then_some(item));
    out
}

fn bad(message: String) -> ConfigError {
    ConfigError {
        message,
        token: None,
    }
}

fn flag(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" => Ok(false),
        _ => Err(bad(format!(
            "{key} takes True or False (or true/false), not '{value}'"
        ))),
    }
}

fn number(key: &str, value: &str) -> Result<f64, ConfigError> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(bad(format!(
            "{key} takes a non-negative number, not '{value}'"
        ))),
    }
}

fn mebibytes(key: &str, value: &str) -> Result<usize, ConfigError> {
    let v = number(key, value)? * MB;
    if v > (1u64 << 60) as f64 {
        return Err(bad(format!("{key} {value} MiB is larger than any device")));
    }
    Ok(v as usize)
}

impl ExpandableConfig {
    /// Applies a settings string on top of `self`: PyTorch's keys as
    /// [`with_alloc_conf`](Self::with_alloc_conf) does, and our own (one per switch of this type,
    /// listed in [`OWN_KEYS`]): `headroom_fraction`, `headroom_mb`, `handle_cache`,
    /// `handle_cache_limit_mb`, `remap_defrag`, `remap_before_create`, `sync_only_after_frees`,
    /// `pressure_tail`, `borrow_across_pools`, `va_factor`, `small_page_mb`, `large_page_mb`,
    /// `park_remaps`, `front_cache`, `best_fit_growth`, `reuse_last_free`, `drain_after_sync`,
    /// `harvest_lowest_first`, `give_back_before_foreign_sync`, `give_back_below_free_pages`, `give_back_below_all_free_pages`, `fine_pages_above`, `reuse_last_free_above`, `tail_takes_rest`, `alias_rescue`, `va_fallback`, `stream_page_share`, `stream_page_floor_mb` (booleans are `true`/`false`, sizes in MiB). A key neither PyTorch nor this crate knows is an error that
    /// lists ours; the result is [validated](Self::validate). Only the keys given change.
    ///
    /// ```
    /// use vmm_alloc::config::ExpandableConfig;
    /// let c = ExpandableConfig::default()
    ///     .with_settings("headroom_fraction:0.05,remap_before_create:true,large_segment_size_mb:32")
    ///     .unwrap();
    /// assert_eq!((c.headroom_fraction, c.remap_before_create, c.large_page), (0.05, true, 32 << 20));
    /// let e = ExpandableConfig::default().with_settings("headroom:5").unwrap_err();
    /// assert!(e.to_string().contains("headroom_fraction"), "{e}");
    /// ```
    pub fn with_settings(self, conf: &str) -> Result<Self, ConfigError> {
        let mut pytorch = Vec::new();
        let mut own = Vec::new();
        for item in split_settings(conf) {
            let (key, value) = item.split_once(':').unwrap_or((item.as_str(), ""));
            if OWN_KEYS.iter().any(|(k, _)| *k == key) {
                own.push((key.to_string(), value.to_string()));
            } else if KNOWN_KEYS.contains(&key) {
                pytorch.push(item.clone());
            } else {
                let ours: Vec<&str> = OWN_KEYS.iter().map(|(k, _)| *k).collect();
                return Err(bad(format!(
                    "unknown setting '{key}': not one of PyTorch's PYTORCH_CUDA_ALLOC_CONF keys \
                     ({}) nor one of vmm-alloc's ({})",
                    KNOWN_KEYS.join(", "),
                    ours.join(", ")
                )));
            }
        }
        // PyTorch's part with PyTorch's rules (and its messages).
        let pytorch = pytorch.join(",");
        parse_alloc_conf(&pytorch)?;
        let mut c = self.with_alloc_conf(&pytorch)?;
        for (key, value) in own {
            let (key, value) = (key.as_str(), value.as_str());
            match key {
                "headroom_fraction" => c.headroom_fraction = number(key, value)?,
                "headroom_mb" => c.headroom_bytes = mebibytes(key, value)?,
                "handle_cache" => c.handle_cache = flag(key, value)?,
                "handle_cache_limit_mb" => c.handle_cache_limit = mebibytes(key, value)?,
                "remap_defrag" => c.remap_defrag = flag(key, value)?,
                "remap_before_create" => c.remap_before_create = flag(key, value)?,
                "sync_only_after_frees" => c.sync_only_after_frees = flag(key, value)?,
                "pressure_tail" => c.pressure_tail = flag(key, value)?,
                "borrow_across_pools" => c.borrow_across_pools = flag(key, value)?,
                "va_factor" => c.va_factor = number(key, value)?,
                "small_page_mb" => c.small_page = mebibytes(key, value)?,
                "large_page_mb" => c.large_page = mebibytes(key, value)?,
                "park_remaps" => c.park_remaps = flag(key, value)?,
                "front_cache" => {
                    c.front_cache = match value {
                        "auto" | "Auto" => FrontCacheMode::OnContention,
                        "true" | "True" | "1" => FrontCacheMode::Always,
                        "false" | "False" | "0" => FrontCacheMode::Off,
                        _ => {
                            return Err(bad(format!(
                                "front_cache takes True, False or auto, not '{value}'"
                            )))
                        }
                    }
                }
                "best_fit_growth" => c.best_fit_growth = flag(key, value)?,
                "reuse_last_free" => c.reuse_last_free = flag(key, value)?,
                "drain_after_sync" => c.drain_after_sync = flag(key, value)?,
                "harvest_lowest_first" => c.harvest_lowest_first = flag(key, value)?,
                "give_back_before_foreign_sync" => {
                    c.give_back_before_foreign_sync = flag(key, value)?
                }
                "give_back_below_free_pages" => c.give_back_below_free_pages = number(key, value)?,
                "give_back_below_all_free_pages" => {
                    c.give_back_below_all_free_pages = number(key, value)?
                }
                "fine_pages_above" => c.fine_pages_above = number(key, value)?,
                "reuse_last_free_above" => c.reuse_last_free_above = number(key, value)?,
                "tail_takes_rest" => c.tail_takes_rest = flag(key, value)?,
                "alias_rescue" => c.alias_rescue = flag(key, value)?,
                "rescue_after_oom" => c.rescue_after_oom = flag(key, value)?,
                "skip_hopeless_growth" => c.skip_hopeless_growth = flag(key, value)?,
                "put_back_after_retry" => c.put_back_after_retry = flag(key, value)?,
                "keep_after_retry" => c.keep_after_retry = flag(key, value)?,
                "va_fallback" => c.va_fallback = flag(key, value)?,
                "stream_page_share" => c.stream_page_share = number(key, value)?,
                "stream_page_floor_mb" => c.stream_page_floor = mebibytes(key, value)?,
                _ => unreachable!("every key of OWN_KEYS is matched above"),
            }
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_own_key_sets_its_field_and_only_given_keys_change() {
        let all = "headroom_fraction:0.03,headroom_mb:256,handle_cache:false,\
                   handle_cache_limit_mb:64,remap_defrag:false,remap_before_create:true,\
                   sync_only_after_frees:false,pressure_tail:false,borrow_across_pools:false,\
                   va_factor:2,small_page_mb:4,large_page_mb:8,park_remaps:false,front_cache:true,\
                   best_fit_growth:false,reuse_last_free:false,\
                   drain_after_sync:true,harvest_lowest_first:false,\
                   give_back_before_foreign_sync:true,give_back_below_free_pages:0.2,\
                   give_back_below_all_free_pages:0.3,\
                   fine_pages_above:0.75,reuse_last_free_above:0.5,tail_takes_rest:false,\
                   alias_rescue:false,rescue_after_oom:true,skip_hopeless_growth:false,\
                   put_back_after_retry:false,keep_after_retry:true,va_fallback:false,stream_page_share:0.1,stream_page_floor_mb:4";
        let c = ExpandableConfig::default().with_settings(all).unwrap();
        let expected = ExpandableConfig {
            headroom_fraction: 0.03,
            headroom_bytes: 256 << 20,
            handle_cache: false,
            handle_cache_limit: 64 << 20,
            remap_defrag: false,
            remap_before_create: true,
            sync_only_after_frees: false,
            pressure_tail: false,
            borrow_across_pools: false,
            va_factor: 2.0,
            small_page: 4 << 20,
            large_page: 8 << 20,
            park_remaps: false,
            front_cache: FrontCacheMode::Always,
            best_fit_growth: false,
            reuse_last_free: false,
            drain_after_sync: true,
            harvest_lowest_first: false,
            give_back_before_foreign_sync: true,
            give_back_below_free_pages: 0.2,
            give_back_below_all_free_pages: 0.3,
            fine_pages_above: 0.75,
            reuse_last_free_above: 0.5,
            tail_takes_rest: false,
            alias_rescue: false,
            rescue_after_oom: true,
            skip_hopeless_growth: false,
            put_back_after_retry: false,
            keep_after_retry: true,
            va_fallback: false,
            stream_page_share: 0.1,
            stream_page_floor: 4 << 20,
            ..ExpandableConfig::default()
        };
        assert_eq!(c, expected);
        assert_eq!(
            split_settings(all).len(),
            OWN_KEYS.len(),
            "the test sets every key"
        );
        // Nothing given, nothing changed; PyTorch's keys mixed in, brackets kept whole.
        let base = ExpandableConfig::pytorch_expandable();
        assert_eq!(base.clone().with_settings("").unwrap(), base);
        let mixed = base
            .clone()
            .with_settings("roundup_power2_divisions:[256:4,>:1], va_factor:1.5")
            .unwrap();
        assert_eq!(mixed.va_factor, 1.5);
        assert_eq!(mixed.roundup_power2_divisions[0], 4);
        assert!(!mixed.handle_cache, "the preset's other fields stay");
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        let e = |s: &str| ExpandableConfig::default().with_settings(s).unwrap_err();
        assert!(e("handle_cache:maybe")
            .message
            .contains("handle_cache takes True or False"));
        assert!(e("headroom_mb:-1")
            .message
            .contains("headroom_mb takes a non-negative"));
        assert!(e("va_factor:100")
            .message
            .contains("va_factor 100 must be in [1, 64]"));
        assert!(e("headroom_fraction:2")
            .message
            .contains("headroom_fraction 2 must be in [0, 1]"));
        let unknown = e("remap:true").message;
        assert!(unknown.contains("'remap'") && unknown.contains("remap_before_create"));
        // PyTorch's keys keep PyTorch's rules.
        assert!(e("max_split_size_mb:2")
            .message
            .contains("max_split_size_mb"));
    }
}
