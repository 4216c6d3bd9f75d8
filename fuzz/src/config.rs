//! `config`: the `PYTORCH_CUDA_ALLOC_CONF` parser on arbitrary strings, token soups in its
//! grammar, and valid strings mutated character by character.
//!
//! Must hold: parsing returns quickly, never panics, and is deterministic; a string it accepts
//! has values in their documented ranges, gives a `ExpandableConfig` that validates, and both allocators
//! that accept it allocate, free and empty their cache without panicking (a rounding or segment
//! size taken from the string must not overflow anywhere downstream).

use std::time::{Duration, Instant};

use proptest::prelude::*;
use vmm_alloc::backend::{SimBackend, SimConfig};
use vmm_alloc::classic::ClassicAllocator;
use vmm_alloc::config::{parse_alloc_conf, AllocConf, ExpandableConfig};
use vmm_alloc::{AllocError, Allocator, ExpandableAllocator, StreamId};

use crate::runner::{shorten, Campaign, Tally};

/// Strings PyTorch's documentation and real jobs use: the seeds of the mutations.
const VALID: [&str; 10] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,4:4,16:8,>:1]",
    "garbage_collection_threshold:0.6,max_split_size_mb:64",
    "per_process_memory_fraction:0.5,large_segment_size_mb:64",
    "backend:native,pinned_num_register_threads:8,pinned_use_background_threads:True",
    "max_non_split_rounding_mb:40,large_segment_size_mb:32,max_split_size_mb:32",
    "expandable_segments:False, roundup_power2_divisions:[256:1,512:2,>:8]",
];

/// Words of the grammar: the keys with limits and lists (the boolean-only ones parse alike),
/// and the words values take.
const KEYS: [&str; 12] = [
    "roundup_power2_divisions",
    "max_split_size_mb",
    "large_segment_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "pinned_num_register_threads",
    "expandable_segments",
    "backend",
    "True",
    "False",
    "native",
];

/// Numbers at the edges: zero, powers of two and their neighbours, the largest integers, floats
/// that overflow, underflow or are not numbers.
const NUMBERS: [&str; 24] = [
    "0",
    "1",
    "2",
    "3",
    "10",
    "11",
    "20",
    "64",
    "128",
    "1024",
    "4294967296",
    "17592186044416",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "0.5",
    "0.999999999999999999",
    "1e308",
    "1e309",
    "1e-320",
    "NaN",
    "inf",
    "-0.0",
    "0x10",
];

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS.to_vec()).prop_map(String::from),
        4 => prop::sample::select(vec![":", ",", "[", "]", ">", " ", "\t"]).prop_map(String::from),
        3 => prop::sample::select(NUMBERS.to_vec()).prop_map(String::from),
        1 => "[a-zA-Z_>0-9.é\u{2028}]{1,6}",
    ]
}

/// One edit of a valid string.
#[derive(Clone, Debug)]
enum Edit {
    Delete(usize),
    Insert(usize, char),
    Replace(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>()).prop_map(Edit::Delete),
        (
            any::<usize>(),
            prop::sample::select(vec![':', ',', '[', ']', '>', '0', '9', ' ', '.', '-'])
        )
            .prop_map(|(at, c)| Edit::Insert(at, c)),
        (any::<usize>(), token()).prop_map(|(at, t)| Edit::Replace(at, t)),
    ]
}

fn mutate(base: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = base.chars().collect();
    for e in edits {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match e {
            Edit::Delete(i) if !chars.is_empty() => {
                let i = i % chars.len();
                chars.remove(i);
            }
            Edit::Delete(_) => {}
            Edit::Insert(i, c) => chars.insert(at(*i, chars.len()), *c),
            Edit::Replace(i, t) => {
                // Replaces the word at `i` (up to the next separator) with `t`.
                let start = at(*i, chars.len()).min(chars.len());
                let end = (start..chars.len())
                    .find(|&j| matches!(chars[j], ':' | ',' | '[' | ']'))
                    .unwrap_or(chars.len());
                chars.splice(start..end, t.chars());
            }
        }
    }
    chars.into_iter().collect()
}

/// The campaign.
pub struct ConfigStrings;

impl ConfigStrings {
    /// The campaign (no state: kept a constructor to match the readers').
    pub fn new() -> Self {
        Self
    }
}

/// Values a successful parse must have.
fn in_range(c: &AllocConf) -> Result<(), String> {
    let gc = c.garbage_collection_threshold;
    let f = c.per_process_memory_fraction;
    if !(gc == 0.0 || (gc > 0.0 && gc < 1.0)) || !(0.0..=1.0).contains(&f) {
        return Err(format!("out of range: gc {gc}, fraction {f}"));
    }
    if c.large_segment_size <= 10 << 20 {
        return Err(format!("large_segment_size {}", c.large_segment_size));
    }
    Ok(())
}

/// Requests from one byte to more than any device holds.
const SIZES: [usize; 9] = [
    1,
    512,
    (1 << 20) + 1,
    3 << 20,
    (20 << 20) + 7,
    97 << 20,
    (1 << 30) + 3,
    1 << 40,
    1 << 62,
];

/// Allocates each size, frees, empties the cache: errors allowed, panics not.
fn exercise<A: Allocator>(a: &A) -> Result<u64, String> {
    let mut live = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        match a.allocate(size, StreamId::sim(i as u64 % 2)) {
            Ok(x) => live.push(x),
            Err(AllocError::OutOfMemory(_) | AllocError::TooLarge { .. }) => {}
            Err(e) => return Err(format!("allocate({size}): {e}")),
        }
    }
    for x in live {
        a.deallocate(x).map_err(|e| format!("free: {e}"))?;
    }
    a.empty_cache().map_err(|e| format!("empty_cache: {e}"))?;
    Ok(SIZES.len() as u64)
}

fn sim() -> Result<SimBackend, String> {
    SimBackend::with_config(SimConfig {
        capacity: 2 << 30,
        ..SimConfig::default()
    })
    .map_err(|e| e.to_string())
}

impl Campaign for ConfigStrings {
    type Case = String;

    fn name(&self) -> &'static str {
        "config"
    }

    fn strategy(&self) -> BoxedStrategy<String> {
        let soup = prop::collection::vec(token(), 0..24).prop_map(|t| t.concat());
        let mutated = (
            prop::sample::select(VALID.to_vec()),
            prop::collection::vec(edit(), 1..6),
        )
            .prop_map(|(base, edits)| mutate(base, &edits));
        prop_oneof![3 => soup, 3 => mutated, 1 => any::<String>(), 1 => ".{0,200}"].boxed()
    }

    fn run(&self, s: &String, tally: &mut Tally) -> Result<(), String> {
        tally.inputs += 1;
        let start = Instant::now();
        let first = parse_alloc_conf(s);
        if start.elapsed() > Duration::from_millis(200) {
            return Err(format!("parsing took {:?}", start.elapsed()));
        }
        if parse_alloc_conf(s) != first {
            return Err("two parses of the same string differ".into());
        }
        let Ok(conf) = first else { return Ok(()) };
        in_range(&conf)?;
        let config = ExpandableConfig::default()
            .with_alloc_conf(s)
            .map_err(|e| {
                format!("parsed, but ExpandableConfig::with_alloc_conf refused it: {e}")
            })?;
        config
            .validate()
            .map_err(|e| format!("parsed, but the ExpandableConfig does not validate: {e}"))?;
        // An allocator may refuse a configuration with an error (a page size the device's
        // granularity does not divide, say); what it accepts it must run.
        if let Ok(classic) = ClassicAllocator::new(sim()?, conf) {
            tally.ops += exercise(&classic)?;
        }
        for base in [
            ExpandableConfig::default(),
            ExpandableConfig::pytorch_expandable(),
        ] {
            let config = base
                .with_alloc_conf(s)
                .map_err(|e| format!("with_alloc_conf: {e}"))?;
            if let Ok(alloc) = ExpandableAllocator::new(sim()?, config) {
                tally.ops += exercise(&alloc)?;
            }
        }
        Ok(())
    }

    fn minimize(&self, s: String, fails: &dyn Fn(&String) -> bool, deadline: Instant) -> String {
        let chars: Vec<char> = s.chars().collect();
        let fewer = shorten(chars, |c| fails(&c.iter().collect()), deadline);
        fewer.into_iter().collect()
    }

    fn show(&self, s: &String) -> String {
        format!("    {s:?} ({} bytes)", s.len())
    }
}
