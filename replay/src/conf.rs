//! Settings per allocator: a user's `PYTORCH_CUDA_ALLOC_CONF` change applied on top of the traced
//! program's recorded one, validated, and shown in every output. Ours (`expandable`) also takes
//! vmm-alloc's own keys ([`OWN_KEYS`]: headroom, handle cache, remap, ...), through
//! [`ExpandableConfig::with_settings`]; given to classic or pytorch-expandable they are an error
//! that says where they belong.

use crate::replay::Policy;
use vmm_alloc::config::{parse_alloc_conf, split_settings, AllocConf, ExpandableConfig, OWN_KEYS};

/// An allocator's configuration for one replay, and the settings string that made it.
#[derive(Clone, Debug, PartialEq)]
pub enum Setup {
    /// The classic allocator's settings.
    Classic(AllocConf),
    /// An expandable policy's configuration.
    Expandable(ExpandableConfig),
}

/// The `key:value` settings of a configuration string (the library's
/// [`split_settings`], which `with_settings` reads with).
pub fn settings(conf: &str) -> Vec<String> {
    split_settings(conf)
}

fn key(setting: &str) -> &str {
    setting.split(':').next().unwrap_or(setting)
}

/// `base` with the settings of `change` applied: a key `change` sets replaces the same key of
/// `base`, in place; new keys are appended in `change`'s order.
///
/// ```
/// use vmm_replay::conf::merge;
/// assert_eq!(merge(Some("max_split_size_mb:128,expandable_segments:False"), "max_split_size_mb:256"),
///            "max_split_size_mb:256,expandable_segments:False");
/// assert_eq!(merge(None, "roundup_power2_divisions:[256:4,>:1]"), "roundup_power2_divisions:[256:4,>:1]");
/// ```
pub fn merge(base: Option<&str>, change: &str) -> String {
    let change = settings(change);
    let mut out: Vec<String> = settings(base.unwrap_or(""));
    for c in change {
        match out.iter_mut().find(|s| key(s) == key(&c)) {
            Some(s) => *s = c,
            None => out.push(c),
        }
    }
    out.join(",")
}

/// The settings `policy` replays with: the trace's recorded string (when given and it parses,
/// as PyTorch would have applied it), with the user's `change` on top. The user's part is
/// validated with PyTorch's rules: a bad key or value is an error that names it.
pub fn effective(
    policy: Policy,
    trace_conf: Option<&str>,
    change: Option<&str>,
) -> Result<(String, Setup), String> {
    let base = trace_conf.filter(|c| parse_alloc_conf(c).is_ok());
    if let Some(change) = change {
        let own = settings(change)
            .into_iter()
            .find(|s| OWN_KEYS.iter().any(|(k, _)| *k == key(s)));
        match (policy, own) {
            (Policy::Expandable, _) => {
                ExpandableConfig::default()
                    .with_settings(change)
                    .map_err(|e| format!("{}={change}: {e}", policy.name()))?;
            }
            (_, Some(own)) => {
                return Err(format!(
                    "{}={change}: '{}' is one of vmm-alloc's own settings, which only ours takes:                      give it as expandable={own}",
                    policy.name(),
                    key(&own)
                ))
            }
            (_, None) => {
                parse_alloc_conf(change).map_err(|e| {
                    format!(
                        "{}={change}: {e}; see PYTORCH_CUDA_ALLOC_CONF in PyTorch's CUDA semantics notes",
                        policy.name()
                    )
                })?;
            }
        }
    }
    let text = match change {
        Some(c) => merge(base, c),
        None => base.unwrap_or("").to_string(),
    };
    let setup = match policy.config(None) {
        None => Setup::Classic(parse_alloc_conf(&text).map_err(|e| format!("{text}: {e}"))?),
        Some(base_config) => Setup::Expandable(
            match policy {
                Policy::Expandable => base_config.with_settings(&text),
                _ => base_config.with_alloc_conf(&text),
            }
            .map_err(|e| format!("{}={text}: {e}", policy.name()))?,
        ),
    };
    Ok((text, setup))
}
