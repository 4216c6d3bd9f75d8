//! `PYTORCH_CUDA_ALLOC_CONF`: PyTorch's allocator configuration grammar, with its validation rules.
//!
//! Grammar (PyTorch's `ConfigTokenizer`): `,` `:` `[` `]` are one-character tokens, whitespace is
//! dropped, anything else accumulates into a word. A setting is `key:value`; settings are separated
//! by `,`; `roundup_power2_divisions` also takes a list `[MB:divisions, ..., >:divisions]`.
//!
//! Every key PyTorch knows is accepted and validated with PyTorch's rules and messages, so a string
//! copied from a real job parses here exactly when it parses there; keys that configure something
//! this crate does not have (pinned host memory, the `cudaMallocAsync` backend) are validated and
//! then ignored. Unknown keys are an error, as in PyTorch. Unlike PyTorch (which ignores it), a
//! wrong separator is reported.

use std::fmt;

const MB: usize = 1 << 20;

/// The number of `roundup_power2_divisions` intervals: 1 MiB … 32 GiB and above.
pub const ROUNDUP_INTERVALS: usize = 16;

/// The settings a `PYTORCH_CUDA_ALLOC_CONF` string can carry that matter to an allocator.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocConf {
    /// `expandable_segments` (default false).
    pub expandable_segments: bool,
    /// `max_split_size_mb` in bytes: cached blocks at least this large are never split
    /// (default: unlimited).
    pub max_split_size: Option<usize>,
    /// `max_non_split_rounding_mb` in bytes: how much larger than a request an unsplittable cached
    /// block may be (default = `large_segment_size`).
    pub max_non_split_rounding: usize,
    /// `large_segment_size_mb` in bytes: the large pool's segment (and expandable page) size
    /// (default 20 MiB).
    pub large_segment_size: usize,
    /// `roundup_power2_divisions` per interval `[2^(20+i), 2^(21+i))` bytes (0 or 1 = none).
    pub roundup_power2_divisions: [usize; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` in (0, 1); 0 = off (default).
    pub garbage_collection_threshold: f64,
    /// `per_process_memory_fraction` in [0, 1] (default 1).
    pub per_process_memory_fraction: f64,
    /// Keys that were valid but have no effect in this crate, in the order given.
    pub ignored: Vec<String>,
    /// Every key the string set, in the order given (a key given twice appears twice): tells a
    /// value set to its default from one left out, so a caller can apply only what was given.
    pub given: Vec<String>,
}

impl AllocConf {
    /// Whether the string set `key`.
    pub fn was_given(&self, key: &str) -> bool {
        self.given.iter().any(|k| k == key)
    }
}

impl Default for AllocConf {
    fn default() -> Self {
        Self {
            expandable_segments: false,
            max_split_size: None,
            max_non_split_rounding: 20 * MB,
            large_segment_size: 20 * MB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            per_process_memory_fraction: 1.0,
            ignored: Vec::new(),
            given: Vec::new(),
        }
    }
}

/// A malformed configuration string: what was wrong, where, and PyTorch's words for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// What is wrong.
    pub message: String,
    /// Index of the offending token in the string's token list, when known.
    pub token: Option<usize>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.token {
            Some(i) => write!(f, "{} (at token {i} of the allocator config)", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

fn err(message: impl Into<String>, token: usize) -> ConfigError {
    ConfigError {
        message: message.into(),
        token: Some(token),
    }
}

/// Every key PyTorch's parsers know.
pub(super) const KNOWN_KEYS: [&str; 16] = [
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "large_segment_size_mb",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "roundup_power2_divisions",
    "backend",
    "pinned_use_background_threads",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "graph_capture_record_stream_reuse",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
];

fn tokenize(s: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in s.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !word.is_empty() {
                    tokens.push(std::mem::take(&mut word));
                }
                tokens.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

struct Cursor {
    tokens: Vec<String>,
    i: usize,
}

impl Cursor {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.i).map(String::as_str)
    }

    fn next(&mut self, what: &str) -> Result<(usize, String), ConfigError> {
        let i = self.i;
        match self.tokens.get(i) {
            Some(t) => {
                self.i += 1;
                Ok((i, t.clone()))
            }
            None => Err(err(
                format!("expected {what} but the config string ended"),
                i,
            )),
        }
    }

    fn expect(&mut self, sep: &str) -> Result<(), ConfigError> {
        let (i, t) = self.next(&format!("'{sep}'"))?;
        if t != sep {
            return Err(err(
                format!("Error parsing CachingAllocator::AllocatorConfig settings, expected {sep} but got '{t}'"),
                i,
            ));
        }
        Ok(())
    }

    fn number(&mut self, key: &str) -> Result<(usize, usize), ConfigError> {
        let (i, t) = self.next(&format!("a number for {key}"))?;
        t.parse::<usize>().map(|v| (i, v)).map_err(|_| {
            err(
                format!("{key} expects a non-negative integer, got '{t}'"),
                i,
            )
        })
    }

    fn float(&mut self, key: &str) -> Result<(usize, f64), ConfigError> {
        let (i, t) = self.next(&format!("a number for {key}"))?;
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok((i, v)),
            _ => Err(err(format!("{key} expects a number, got '{t}'"), i)),
        }
    }

    fn boolean(&mut self) -> Result<bool, ConfigError> {
        let (i, t) = self.next("True or False")?;
        match t.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(err(
                format!("Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{t}'"),
                i,
            )),
        }
    }
}

/// Parses a `PYTORCH_CUDA_ALLOC_CONF` string (an empty string gives the defaults).
///
/// ```
/// use vmm_alloc::config::parse_alloc_conf;
/// let conf = parse_alloc_conf("expandable_segments:True,max_split_size_mb:128").unwrap();
/// assert!(conf.expandable_segments);
/// assert_eq!(conf.max_split_size, Some(128 << 20));
/// assert!(parse_alloc_conf("foo:1").unwrap_err().to_string().contains("Unrecognized key 'foo'"));
/// ```
pub fn parse_alloc_conf(s: &str) -> Result<AllocConf, ConfigError> {
    let tokens = tokenize(s);
    let mut conf = AllocConf::default();
    // PyTorch parses large_segment_size_mb first: the limits of two other keys depend on it.
    if let Some(pos) = tokens.iter().position(|t| t == "large_segment_size_mb") {
        let mut c = Cursor {
            tokens: tokens.clone(),
            i: pos + 1,
        };
        c.expect(":")?;
        let (i, mb) = c.number("large_segment_size_mb")?;
        if mb <= 10 {
            return Err(err(
                "CachingAllocator option large_segment_size_mb must be > 10 MB",
                i,
            ));
        }
        conf.large_segment_size = mb
            .checked_mul(MB)
            .ok_or_else(|| err("large_segment_size_mb is too large", i))?;
        conf.max_non_split_rounding = conf.large_segment_size;
    }
    let mut c = Cursor { tokens, i: 0 };
    while c.peek().is_some() {
        let (key_at, key) = c.next("a key")?;
        if !KNOWN_KEYS.contains(&key.as_str()) {
            return Err(err(
                format!("Unrecognized key '{key}' in CUDA allocator config."),
                key_at,
            ));
        }
        c.expect(":")?;
        conf.given.push(key.clone());
        match key.as_str() {
            "expandable_segments" => conf.expandable_segments = c.boolean()?,
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                let (i, mb) = c.number(&key)?;
                let min_mb = conf.large_segment_size / MB;
                if mb < min_mb {
                    return Err(err(
                        format!("CachingAllocator option {key} too small, must be >= {min_mb}"),
                        i,
                    ));
                }
                let bytes = mb.min(usize::MAX / MB) * MB;
                if key == "max_split_size_mb" {
                    conf.max_split_size = Some(bytes);
                } else {
                    conf.max_non_split_rounding = bytes;
                }
            }
            "large_segment_size_mb" => {
                c.number(&key)?; // validated above
            }
            "garbage_collection_threshold" => {
                let (i, v) = c.float(&key)?;
                if v <= 0.0 || v >= 1.0 {
                    return Err(err(
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                        i,
                    ));
                }
                conf.garbage_collection_threshold = v;
            }
            "per_process_memory_fraction" => {
                let (i, v) = c.float(&key)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(err(
                        "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                        i,
                    ));
                }
                conf.per_process_memory_fraction = v;
            }
            "roundup_power2_divisions" => {
                parse_roundup(&mut c, &mut conf.roundup_power2_divisions)?
            }
            "backend" => {
                let (i, v) = c.next("an allocator backend")?;
                if v != "native" && v != "cudaMallocAsync" {
                    return Err(err(
                        "Unknown allocator backend, options are native and cudaMallocAsync",
                        i,
                    ));
                }
                conf.ignored.push(key);
            }
            "pinned_use_background_threads"
            | "release_lock_on_cudamalloc"
            | "release_lock_on_hipmalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_use_hip_host_register"
            | "graph_capture_record_stream_reuse" => {
                c.boolean()?;
                conf.ignored.push(key);
            }
            "pinned_num_register_threads" => {
                let (i, n) = c.number(&key)?;
                if !n.is_power_of_two() {
                    return Err(err(
                        format!("Number of register threads has to be power of 2, got {n}"),
                        i,
                    ));
                }
                if n > 128 {
                    return Err(err(
                        format!("Number of register threads should be less than or equal to 128, got {n}"),
                        i,
                    ));
                }
                conf.ignored.push(key);
            }
            "pinned_reserve_segment_size_mb" => {
                let (i, n) = c.number(&key)?;
                if n == 0 {
                    return Err(err(
                        "Pinned reserve segment size has to be greater than 0",
                        i,
                    ));
                }
                conf.ignored.push(key);
            }
            _ => {
                return Err(err(
                    format!("Unrecognized key '{key}' in CUDA allocator config."),
                    key_at,
                ))
            }
        }
        match c.peek() {
            None => {}
            Some(",") => c.i += 1,
            Some(other) => {
                return Err(err(
                    format!("expected ',' between settings but got '{other}'"),
                    c.i,
                ));
            }
        }
    }
    Ok(conf)
}

fn parse_roundup(
    c: &mut Cursor,
    divisions: &mut [usize; ROUNDUP_INTERVALS],
) -> Result<(), ConfigError> {
    if c.peek() != Some("[") {
        let (i, d) = c.number("roundup_power2_divisions")?;
        if !d.is_power_of_two() {
            return Err(err("For roundups, the divisions has to be power of 2 ", i));
        }
        *divisions = [d; ROUNDUP_INTERVALS];
        return Ok(());
    }
    c.i += 1; // '['
    let mut last_index: Option<usize> = None;
    loop {
        let (i, key) = c.next("an interval (MB) or '>'")?;
        c.expect(":")?;
        let (j, d) = c.number("roundup_power2_divisions")?;
        if d != 0 && !d.is_power_of_two() {
            return Err(err(
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup ",
                j,
            ));
        }
        if key == ">" {
            let from = last_index.map_or(0, |l| l + 1);
            for slot in divisions.iter_mut().skip(from) {
                *slot = d;
            }
        } else {
            let mb: usize = key
                .parse()
                .map_err(|_| err(format!("roundup_power2_divisions interval must be a number of MB or '>', got '{key}'"), i))?;
            if !mb.is_power_of_two() {
                return Err(err("For roundups, the intervals have to be power of 2 ", i));
            }
            let index = (mb.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
            if last_index.is_none() {
                // The first entry also covers every smaller interval.
                for slot in divisions.iter_mut().take(index) {
                    *slot = d;
                }
            }
            divisions[index] = d;
            last_index = Some(index);
        }
        let (k, sep) = c.next("',' or ']'")?;
        match sep.as_str() {
            "," => continue,
            "]" => return Ok(()),
            other => {
                return Err(err(
                    format!("expected ',' or ']' in roundup_power2_divisions, got '{other}'"),
                    k,
                ))
            }
        }
    }
}
