//! `readers`: the trace readers (pickle and PyTorch snapshot, native format, RMM CSV) on
//! arbitrary bytes, on pickle opcode soups, and on valid inputs mutated.
//!
//! Must hold for every input: the reader returns `Ok` or an error, never panics, stays under a
//! heap cap ([`crate::heap`]) and finishes within a time limit. For what it accepts: a trace
//! survives the native format's round trip unchanged and replays through every allocator
//! policy without a panic (traces of a few thousand events, to keep cases quick); a pickled
//! value of bounded size is written back and read again to the same bytes.

mod corpus;
mod mutate;

use std::time::{Duration, Instant};

use proptest::prelude::*;
use vmm_replay::dump::pickle_writer::dumps;
use vmm_replay::native::{read_native, write_native};
use vmm_replay::pickle::{parse, Value};
use vmm_replay::replay::{replay, Policy, ReplayOptions};
use vmm_replay::rmm_csv::read_rmm_csv;
use vmm_replay::snapshot::{analyse_snapshot, read_snapshot};
use vmm_replay::Trace;

use crate::heap::{capped, BlackBox};
use crate::runner::{shorten, Campaign, Tally};
use corpus::Corpus;
use mutate::Mutation;

/// A reader may take this long on one input (a mutated recorded snapshot of 400 KB reads in a few
/// milliseconds; the limit leaves room for a loaded 2-core machine).
const TIME_LIMIT: Duration = Duration::from_secs(2);

/// Heap a reader may use beyond what is allocated already: a fixed allowance and a multiple of
/// the input (a pickle's values take several times its bytes).
fn heap_budget(len: usize) -> usize {
    (256 << 20) + len.saturating_mul(256)
}

/// Traces replayed after reading: at most this many events (a mutated count can make a valid
/// trace long, and replay time is not what this campaign measures).
const REPLAY_EVENTS: usize = 3000;

/// Which reader an input is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// `pickle::parse`, `read_snapshot`, `analyse_snapshot`.
    Pickle,
    /// `read_native`.
    Native,
    /// `read_rmm_csv` (on the bytes decoded as UTF-8, lossily, as a file reader would refuse).
    Csv,
}

/// Where an input's bytes come from.
#[derive(Clone, Debug)]
pub enum Input {
    /// These bytes.
    Raw(Vec<u8>),
    /// The `base`-th valid input of the reader's corpus, mutated.
    Mutated { base: usize, edits: Vec<Mutation> },
}

/// One case: an input for a reader; `fix_checksum` (native only) rewrites the checksum after
/// mutating, so the mutation reaches the decoder instead of being refused by the checksum.
#[derive(Clone, Debug)]
pub struct Case {
    reader: Reader,
    input: Input,
    fix_checksum: bool,
}

/// The campaign, with its valid inputs and the file that keeps the current input.
pub struct Readers {
    corpus: Corpus,
    black_box: BlackBox,
}

impl Readers {
    /// Builds the corpus and announces where the current input is kept.
    pub fn new() -> Self {
        let corpus = Corpus::build();
        let black_box = BlackBox::new("readers");
        println!(
            "readers: {} pickles ({} from ../shared/traces), {} native traces, {} RMM logs to mutate; the input being read is kept in {} (the reproducer if the process aborts on the heap cap)",
            corpus.pickles.len(),
            corpus.shared,
            corpus.native.len(),
            corpus.csv.len(),
            black_box.path.display()
        );
        for dir in &corpus.shared_missing {
            println!(
                "readers: NOT mutating the recorded PyTorch snapshots of {}: that folder cannot be read (absent outside the project's checkout), so only the built-in inputs are in the corpus",
                dir.display()
            );
        }
        Self { corpus, black_box }
    }

    fn valid(&self, reader: Reader) -> &[Vec<u8>] {
        match reader {
            Reader::Pickle => &self.corpus.pickles,
            Reader::Native => &self.corpus.native,
            Reader::Csv => &self.corpus.csv,
        }
    }

    /// The bytes a case feeds its reader.
    fn bytes(&self, case: &Case) -> Vec<u8> {
        let mut bytes = match &case.input {
            Input::Raw(b) => b.clone(),
            Input::Mutated { base, edits } => {
                let valid = self.valid(case.reader);
                let mut b = valid[base % valid.len()].clone();
                for m in edits {
                    mutate::apply(&mut b, m, valid);
                }
                b
            }
        };
        if case.fix_checksum {
            fix_checksum(&mut bytes);
        }
        bytes
    }
}

/// Rewrites the last 8 bytes as the FNV-1a 64 of those before them (the native format's check).
fn fix_checksum(bytes: &mut [u8]) {
    if let Some(body) = bytes.len().checked_sub(8) {
        let sum = bytes[..body]
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        bytes[body..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Pickle opcodes with arguments of plausible shape, so that the pickle machine runs many
/// instructions instead of stopping at the first byte.
fn opcode_soup() -> impl Strategy<Value = Vec<u8>> {
    const OPS: &[u8] = b"(.0123456789BCFGIJKLMNPQRSTUVX]abcdeghijlopqrstuz}\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x90\x91\x92\x93\x94\x95\x96\x97\x98";
    let op = (
        prop::sample::select(OPS.to_vec()),
        prop::collection::vec(any::<u8>(), 0..6),
    )
        .prop_map(|(op, mut arg)| {
            arg.insert(0, op);
            arg
        });
    prop::collection::vec(op, 0..60).prop_map(|ops| {
        let mut out = vec![0x80, 4];
        out.extend(ops.concat());
        out.push(b'.');
        out
    })
}

/// Counts the nodes of `v`, visiting shared values once per reference, up to `limit`: `None`
/// beyond it (a pickle's memo can make a small input a huge tree).
fn tree_size(v: &Value, limit: usize) -> Option<usize> {
    let mut todo = vec![v];
    let mut n = 0;
    while let Some(v) = todo.pop() {
        n += 1;
        if n > limit {
            return None;
        }
        match v {
            Value::List(xs) | Value::Tuple(xs) => todo.extend(xs.iter()),
            Value::Dict(kv) => todo.extend(kv.iter().flat_map(|(k, v)| [k, v])),
            _ => {}
        }
    }
    Some(n)
}

/// A parsed value of bounded size is written back and re-read to the same bytes.
fn value_round_trip(v: &Value) -> Result<(), String> {
    if tree_size(v, 100_000).is_none() {
        return Ok(());
    }
    let Ok(bytes) = dumps(v) else { return Ok(()) };
    let again = parse(&bytes).map_err(|e| format!("a written value does not read back: {e}"))?;
    match dumps(&again) {
        Ok(b) if b == bytes => Ok(()),
        _ => Err("a value written and read back is written differently".into()),
    }
}

/// What every trace a reader accepts must survive.
fn trace_ok(t: &Trace, tally: &mut Tally) -> Result<(), String> {
    let back = read_native(&write_native(t), "round trip")
        .map_err(|e| format!("write_native's output does not read back: {e}"))?;
    if &back != t {
        return Err("the trace changed through the native format's round trip".into());
    }
    if t.events.len() + t.initial.len() <= REPLAY_EVENTS {
        let opts = ReplayOptions {
            capacity: 8 << 30,
            timeline_points: 16,
            ..ReplayOptions::default()
        };
        for policy in Policy::ALL {
            // An error (a size no device holds, say) is an answer; only a panic is not.
            let _ = replay(t, policy, &opts);
            tally.ops += (t.events.len() + t.initial.len()) as u64;
        }
    }
    Ok(())
}

/// Runs `reader` on `bytes` and checks what it accepted.
fn read(reader: Reader, bytes: &[u8], tally: &mut Tally) -> Result<(), String> {
    match reader {
        Reader::Pickle => {
            if let Ok(v) = parse(bytes) {
                value_round_trip(&v)?;
            }
            if let Ok(traces) = read_snapshot(bytes, "fuzz") {
                for t in &traces {
                    trace_ok(t, tally)?;
                }
            }
            let _ = analyse_snapshot(bytes, "fuzz");
        }
        Reader::Native => {
            if let Ok(t) = read_native(bytes, "fuzz") {
                trace_ok(&t, tally)?;
            }
        }
        Reader::Csv => {
            if let Ok(t) = read_rmm_csv(&String::from_utf8_lossy(bytes), "fuzz") {
                trace_ok(&t, tally)?;
            }
        }
    }
    Ok(())
}

/// Every reader on one input, bounded as in the campaign.
fn read_bounded(reader: Reader, bytes: &[u8], tally: &mut Tally) -> Result<(), String> {
    let start = Instant::now();
    capped(heap_budget(bytes.len()), || read(reader, bytes, tally))?;
    let took = start.elapsed();
    if took > TIME_LIMIT {
        return Err(format!("reading {} bytes took {took:?}", bytes.len()));
    }
    Ok(())
}

/// `campaign check-input FILE`: every reader on the file, with the campaign's checks.
pub fn check_file(path: &str) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    for reader in [Reader::Pickle, Reader::Native, Reader::Csv] {
        crate::runner::guarded(|| read_bounded(reader, &bytes, &mut Tally::default()))
            .map_err(|e| format!("{reader:?} reader: {e}"))?;
    }
    Ok(format!(
        "{path}: {} bytes, every reader returned",
        bytes.len()
    ))
}

impl Campaign for Readers {
    type Case = Case;

    fn name(&self) -> &'static str {
        "readers"
    }

    fn strategy(&self) -> BoxedStrategy<Case> {
        let reader = prop::sample::select(vec![Reader::Pickle, Reader::Native, Reader::Csv]);
        let raw = (reader.clone(), prop::collection::vec(any::<u8>(), 0..2048)).prop_map(
            |(reader, bytes)| Case {
                reader,
                input: Input::Raw(bytes),
                fix_checksum: false,
            },
        );
        let soup = opcode_soup().prop_map(|bytes| Case {
            reader: Reader::Pickle,
            input: Input::Raw(bytes),
            fix_checksum: false,
        });
        let mutated = (
            reader,
            any::<usize>(),
            prop::collection::vec(mutate::mutation(), 1..8),
            any::<bool>(),
        )
            .prop_map(|(reader, base, edits, fix)| Case {
                reader,
                input: Input::Mutated { base, edits },
                fix_checksum: fix && reader == Reader::Native,
            });
        prop_oneof![2 => raw, 2 => soup, 6 => mutated].boxed()
    }

    fn run(&self, case: &Case, tally: &mut Tally) -> Result<(), String> {
        let bytes = self.bytes(case);
        self.black_box.keep(&bytes);
        tally.inputs += 1;
        read_bounded(case.reader, &bytes, tally)
    }

    fn minimize(&self, case: Case, fails: &dyn Fn(&Case) -> bool, deadline: Instant) -> Case {
        let raw = |bytes: &[u8]| Case {
            reader: case.reader,
            input: Input::Raw(bytes.to_vec()),
            fix_checksum: case.fix_checksum,
        };
        let bytes = shorten(self.bytes(&case), |b| fails(&raw(b)), deadline);
        raw(&bytes)
    }

    fn show(&self, case: &Case) -> String {
        let bytes = self.bytes(case);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "    {:?} reader, {} bytes{}\n    hex: {hex}\n    escaped: b\"{}\"",
            case.reader,
            bytes.len(),
            if case.fix_checksum {
                " (checksum rewritten)"
            } else {
                ""
            },
            bytes.escape_ascii()
        )
    }
}
