//! Our own trace format: compact, exact, and quick to read.
//!
//! # Layout (version 1)
//!
//! Every integer is an unsigned LEB128 varint (7 bits a byte, low bits first) unless said
//! otherwise; a string is a varint byte length followed by UTF-8.
//!
//! ```text
//! magic            8 bytes  "VMMTRACE"
//! version          varint   1
//! name             string
//! start            1 byte   0 empty, 1 near-empty, 2 warm
//! skipped_frees    varint
//! flags            1 byte   bit 0: recorded follows, bit 1: alloc_conf follows, bit 2: failed
//!                           requests follow, bit 3: skipped counts follow (others 0)
//! [recorded]       varint ×3  peak_reserved_bytes, segment_allocs, segment_frees
//! [alloc_conf]     string
//! [skipped]        varint count, then per kind: its name (string, in increasing byte order),
//!                  its count (varint): `Trace::skipped`
//! [failed]         varint count, then per request: its position among the events (varint,
//!                  increasing), size varint, stream varint (`FailedAlloc` events; the ops
//!                  and the event count below leave them out)
//! initial count    varint   then per block: size varint, stream varint
//! event count      varint   events that follow
//! alloc count      varint   Alloc events among them
//! ops              until `event count` events are decoded
//! checksum         8 bytes  FNV-1a 64 of every byte before it, little-endian
//! ```
//!
//! **Ids are implicit.** Initial blocks are ids `0..k` in order, and each `Alloc` takes the next id
//! (`k`, `k + 1`, ...), so allocations are never given an id on disk. A `Free` of an id that no
//! earlier block or allocation holds (a "foreign" free) gets id `k + allocs + j`, where `j`
//! numbers the distinct foreign ids in order of first appearance. [`write_native`] renumbers any
//! trace this way; a trace already numbered so (every reader here, every workload) keeps its ids,
//! and `read(write(t))` writes back byte for byte.
//!
//! **Ops.** Each op is one varint `v = payload << 2 | tag` (up to 128 bits, so any u64 payload
//! fits):
//!
//! | tag | op | payload |
//! |---|---|---|
//! | 0 | `Alloc` of a size seen before | index in the size table (sizes in order of first use) |
//! | 1 | `Free` | `next_id - 1 - id`: 0 frees the latest allocation |
//! | 2 | `Alloc` of a size, appended to the size table (the writer uses it for a new size, or for a known one whose index would not be shorter) | the size |
//! | 3 | other | 0 `EmptyCache`; 1 foreign `Free`, varint `j` follows; 2 new stream, varint stream follows, appended to the stream table; `3 + i` switch to stream table entry `i` |
//!
//! An `Alloc` is on the current stream, which starts at 0 (the stream table starts as `[0]`);
//! stream ops are not events. An allocation of one of the trace's first 32 distinct sizes, or a
//! free of one of the 32 latest allocations, takes one byte. The recorded PyTorch traces take 1.1
//! to 2.3 bytes an event (1.5 overall, about 1/230 of their snapshot pickles), the built-in
//! training and inference workloads 1.2 to 1.5, and RMM-style uniformly random sizes 3.
//!
//! Every size (initial block, allocation, failed request) is at least 1 byte: a file holding a
//! size of 0 is refused, since no allocator replays an empty request.
//!
//! Reading is bounded: a count that the remaining bytes could not hold, a table index out of
//! range, a truncated file (the error names the offset), an unknown version, or a bad checksum is
//! an error, never a panic or an oversized allocation.

use std::collections::HashMap;
use std::path::Path;

use crate::{Event, InitialBlock, Recorded, StartState, Trace, TraceError};

/// The first bytes of every native trace file.
pub const MAGIC: &[u8; 8] = b"VMMTRACE";

/// The format version [`write_native`] writes and [`read_native`] reads.
pub const VERSION: u64 = 1;

const TAG_ALLOC_SEEN: u128 = 0;
const TAG_FREE: u128 = 1;
const TAG_ALLOC_NEW: u128 = 2;
const TAG_OTHER: u128 = 3;
const OTHER_EMPTY_CACHE: u128 = 0;
const OTHER_FOREIGN_FREE: u128 = 1;
const OTHER_NEW_STREAM: u128 = 2;
const OTHER_STREAM_BASE: u128 = 3;

/// Encodes `trace` in the native format (see the module docs), renumbering its ids densely.
pub fn write_native(trace: &Trace) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + trace.name.len() + 2 * trace.events.len());
    out.extend_from_slice(MAGIC);
    put(&mut out, VERSION.into());
    put_str(&mut out, &trace.name);
    out.push(match trace.start {
        StartState::Empty => 0,
        StartState::NearEmpty => 1,
        StartState::Warm => 2,
    });
    put(&mut out, trace.skipped_frees.into());
    let failed: Vec<(usize, u64, u64)> = trace
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match *e {
            Event::FailedAlloc { size, stream } => Some((i, size, stream)),
            _ => None,
        })
        .collect();
    out.push(
        u8::from(trace.recorded.is_some())
            | u8::from(trace.alloc_conf.is_some()) << 1
            | u8::from(!failed.is_empty()) << 2
            | u8::from(!trace.skipped.is_empty()) << 3,
    );
    if let Some(r) = &trace.recorded {
        put(&mut out, r.peak_reserved_bytes.into());
        put(&mut out, r.segment_allocs.into());
        put(&mut out, r.segment_frees.into());
    }
    if let Some(conf) = &trace.alloc_conf {
        put_str(&mut out, conf);
    }
    if !trace.skipped.is_empty() {
        put(&mut out, trace.skipped.len() as u128);
        for (kind, n) in &trace.skipped {
            put_str(&mut out, kind);
            put(&mut out, (*n).into());
        }
    }
    if !failed.is_empty() {
        put(&mut out, failed.len() as u128);
        for &(i, size, stream) in &failed {
            put(&mut out, i as u128);
            put(&mut out, size.into());
            put(&mut out, stream.into());
        }
    }

    // Old id -> dense id, for initial blocks and allocations seen so far.
    let mut dense: HashMap<u64, u64> = HashMap::new();
    put(&mut out, trace.initial.len() as u128);
    for (i, b) in trace.initial.iter().enumerate() {
        put(&mut out, b.size.into());
        put(&mut out, b.stream.into());
        dense.insert(b.id, i as u64);
    }
    let allocs = trace
        .events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    put(&mut out, (trace.events.len() - failed.len()) as u128);
    put(&mut out, allocs as u128);

    let mut next_id = trace.initial.len() as u64;
    let mut foreign: HashMap<u64, u64> = HashMap::new();
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut size_count: u64 = 0;
    let mut streams: HashMap<u64, u64> = HashMap::from([(0, 0)]);
    let mut current_stream = 0;
    for e in &trace.events {
        match *e {
            Event::Alloc { id, size, stream } => {
                if stream != current_stream {
                    if let Some(&i) = streams.get(&stream) {
                        put_op(&mut out, TAG_OTHER, OTHER_STREAM_BASE + u128::from(i));
                    } else {
                        put_op(&mut out, TAG_OTHER, OTHER_NEW_STREAM);
                        put(&mut out, stream.into());
                        let n = streams.len() as u64;
                        streams.insert(stream, n);
                    }
                    current_stream = stream;
                }
                let new_cost = varint_len(op(TAG_ALLOC_NEW, size.into()));
                match sizes.get(&size) {
                    Some(&i) if varint_len(op(TAG_ALLOC_SEEN, i.into())) <= new_cost => {
                        put_op(&mut out, TAG_ALLOC_SEEN, i.into());
                    }
                    _ => {
                        put_op(&mut out, TAG_ALLOC_NEW, size.into());
                        sizes.insert(size, size_count);
                        size_count += 1;
                    }
                }
                dense.insert(id, next_id);
                next_id += 1;
            }
            Event::Free { id } => match dense.get(&id) {
                Some(&d) => put_op(&mut out, TAG_FREE, u128::from(next_id - 1 - d)),
                None => {
                    let n = foreign.len() as u64;
                    let j = *foreign.entry(id).or_insert(n);
                    put_op(&mut out, TAG_OTHER, OTHER_FOREIGN_FREE);
                    put(&mut out, j.into());
                }
            },
            Event::EmptyCache => put_op(&mut out, TAG_OTHER, OTHER_EMPTY_CACHE),
            // In the header.
            Event::FailedAlloc { .. } => {}
        }
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Writes `trace` to `path` in the native format.
pub fn write_native_file(path: impl AsRef<Path>, trace: &Trace) -> Result<(), TraceError> {
    let path = path.as_ref();
    std::fs::write(path, write_native(trace)).map_err(|e| TraceError {
        file: path.display().to_string(),
        message: format!("cannot write: {e}"),
    })
}

/// Reads a native trace file; errors name the file.
pub fn read_native_file(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TraceError {
        file: file.clone(),
        message: format!("cannot read: {e}"),
    })?;
    read_native(&bytes, &file)
}

/// Decodes a native trace. `name` labels errors; the trace's own name comes from the file.
pub fn read_native(bytes: &[u8], name: &str) -> Result<Trace, TraceError> {
    let mut r = Reader {
        bytes,
        pos: 0,
        file: name,
    };
    if bytes.is_empty() {
        return Err(r.error("the file is empty: expected a vmm-alloc trace (VMMTRACE)".into()));
    }
    if !bytes.starts_with(MAGIC) {
        return Err(r.error("not a vmm-alloc trace (no VMMTRACE magic)".into()));
    }
    r.pos = MAGIC.len();
    let version = r.u64("version")?;
    if version != VERSION {
        return Err(r.error(format!(
            "unsupported version {version} (this build reads version {VERSION})"
        )));
    }
    let trace_name = r.string("name")?;
    let start = match r.byte("start state")? {
        0 => StartState::Empty,
        1 => StartState::NearEmpty,
        2 => StartState::Warm,
        b => return Err(r.error(format!("unknown start state {b}"))),
    };
    let skipped_frees = r.u64("skipped_frees")?;
    let flags = r.byte("flags")?;
    if flags & !15 != 0 {
        return Err(r.error(format!("unknown flags {flags:#04x}")));
    }
    let recorded = if flags & 1 != 0 {
        Some(Recorded {
            peak_reserved_bytes: r.u64("recorded peak_reserved_bytes")?,
            segment_allocs: r.u64("recorded segment_allocs")?,
            segment_frees: r.u64("recorded segment_frees")?,
        })
    } else {
        None
    };
    let alloc_conf = if flags & 2 != 0 {
        Some(r.string("alloc_conf")?)
    } else {
        None
    };
    let mut skipped = std::collections::BTreeMap::new();
    if flags & 8 != 0 {
        let n = r.count("skipped kinds", 2)?;
        for _ in 0..n {
            let at = r.pos;
            let kind = r.string("skipped kind")?;
            if skipped
                .keys()
                .next_back()
                .is_some_and(|last: &String| *last >= kind)
            {
                r.pos = at;
                return Err(r.error(format!(
                    "skipped kinds must increase, {} does not",
                    crate::shown(&kind)
                )));
            }
            let count = r.u64("skipped count")?;
            skipped.insert(kind, count);
        }
    }
    let mut failed = Vec::new();
    if flags & 4 != 0 {
        let n = r.count("failed requests", 3)?;
        for _ in 0..n {
            let at = r.u64("failed request position")?;
            if failed.last().is_some_and(|&(prev, _)| at <= prev) {
                return Err(r.error(format!(
                    "failed request positions must increase, {at} does not"
                )));
            }
            let size = r.size("failed request size")?;
            let stream = r.u64("failed request stream")?;
            failed.push((at, Event::FailedAlloc { size, stream }));
        }
    }

    let n_initial = r.count("initial blocks", 2)?;
    let mut initial = Vec::with_capacity(n_initial);
    for i in 0..n_initial {
        let size = r.size("initial block size")?;
        let stream = r.u64("initial block stream")?;
        initial.push(InitialBlock {
            id: i as u64,
            size,
            stream,
        });
    }
    let n_events = r.count("events", 1)?;
    let n_allocs = r.u64("alloc count")?;
    if n_allocs > n_events as u64 {
        return Err(r.error(format!(
            "claims {n_allocs} allocations among {n_events} events"
        )));
    }
    let ops = r.events(n_initial as u64, n_events, n_allocs)?;
    let events = merge_failed(ops, failed).map_err(|m| r.error(m))?;

    let body_end = r.pos;
    let mut sum = [0u8; 8];
    for b in &mut sum {
        *b = r.byte("checksum")?;
    }
    let expected = bytes.get(..body_end).map(fnv1a).unwrap_or(0);
    if u64::from_le_bytes(sum) != expected {
        r.pos = body_end;
        return Err(r.error("checksum mismatch: the file is corrupt".into()));
    }
    if r.pos != bytes.len() {
        return Err(r.error(format!("{} bytes after the end", bytes.len() - r.pos)));
    }
    Ok(Trace {
        name: trace_name,
        initial,
        events,
        start,
        skipped_frees,
        recorded,
        alloc_conf,
        skipped,
    })
}

/// A cursor over the bytes being decoded.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl Reader<'_> {
    fn error(&self, message: String) -> TraceError {
        TraceError {
            file: self.file.to_string(),
            message: format!("offset {}: {message}", self.pos),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    fn byte(&mut self, what: &str) -> Result<u8, TraceError> {
        match self.bytes.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.error(format!("truncated: expected the {what}"))),
        }
    }

    fn varint(&mut self, what: &str) -> Result<u128, TraceError> {
        let start = self.pos;
        let mut value: u128 = 0;
        let mut shift = 0u32;
        loop {
            let b = self.byte(what)?;
            let bits = u128::from(b & 0x7f);
            if shift >= 128 || bits > (u128::MAX >> shift) {
                self.pos = start;
                return Err(self.error(format!("the {what} overflows 128 bits")));
            }
            value |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
        }
    }

    fn u64(&mut self, what: &str) -> Result<u64, TraceError> {
        let start = self.pos;
        let v = self.varint(what)?;
        u64::try_from(v).map_err(|_| {
            self.pos = start;
            self.error(format!("the {what} ({v}) does not fit in 64 bits"))
        })
    }

    /// A size: a u64 of at least 1.
    fn size(&mut self, what: &str) -> Result<u64, TraceError> {
        let start = self.pos;
        let v = self.u64(what)?;
        if v == 0 {
            self.pos = start;
            return Err(self.error(format!(
                "the {what} is 0 (every request is at least 1 byte)"
            )));
        }
        Ok(v)
    }

    /// A count of items that take at least `min_bytes` each: no more than the rest could hold.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize, TraceError> {
        let start = self.pos;
        let n = self.u64(what)?;
        let room = self.remaining() / min_bytes;
        match usize::try_from(n) {
            Ok(n) if n <= room => Ok(n),
            _ => {
                self.pos = start;
                Err(self.error(format!(
                    "claims {n} {what}, but only {} bytes remain (truncated or corrupt)",
                    self.remaining()
                )))
            }
        }
    }

    fn string(&mut self, what: &str) -> Result<String, TraceError> {
        let len = self.count(&format!("bytes of {what}"), 1)?;
        let start = self.pos;
        let raw = self
            .bytes
            .get(start..start + len)
            .ok_or_else(|| self.error(format!("truncated: expected the {what}")))?;
        let s = std::str::from_utf8(raw)
            .map_err(|_| self.error(format!("the {what} is not UTF-8")))?
            .to_string();
        self.pos += len;
        Ok(s)
    }

    fn events(
        &mut self,
        n_initial: u64,
        n_events: usize,
        n_allocs: u64,
    ) -> Result<Vec<Event>, TraceError> {
        let mut events = Vec::with_capacity(n_events);
        let foreign_base = n_initial
            .checked_add(n_allocs)
            .ok_or_else(|| self.error("id space overflows".into()))?;
        let mut next_id = n_initial;
        // Distinct foreign ids so far: a foreign free names one of them or the next (the ids
        // number them in order of first appearance), so a trace read back writes the same.
        let mut foreign_seen: u64 = 0;
        let mut sizes: Vec<u64> = Vec::new();
        let mut streams: Vec<u64> = vec![0];
        let mut stream = 0;
        while events.len() < n_events {
            let at = self.pos;
            let what = format!("event {} of {n_events}", events.len());
            let v = self.varint(&what)?;
            let payload = v >> 2;
            let bad = |r: &mut Self, m: String| {
                r.pos = at;
                r.error(format!("{what}: {m}"))
            };
            let size = match v & 3 {
                TAG_ALLOC_SEEN => {
                    let size = usize::try_from(payload)
                        .ok()
                        .and_then(|i| sizes.get(i).copied());
                    match size {
                        Some(s) => Some(s),
                        None => {
                            let m = format!("size index {payload} of {}", sizes.len());
                            return Err(bad(self, m));
                        }
                    }
                }
                TAG_ALLOC_NEW => match u64::try_from(payload) {
                    Ok(s) => {
                        sizes.push(s);
                        Some(s)
                    }
                    Err(_) => return Err(bad(self, format!("size {payload} overflows"))),
                },
                TAG_FREE => {
                    let Some(id) = u64::try_from(payload)
                        .ok()
                        .filter(|&d| d < next_id)
                        .map(|d| next_id - 1 - d)
                    else {
                        let m = format!("frees {payload} back, only {next_id} allocated");
                        return Err(bad(self, m));
                    };
                    events.push(Event::Free { id });
                    None
                }
                _ => match payload {
                    OTHER_EMPTY_CACHE => {
                        events.push(Event::EmptyCache);
                        None
                    }
                    OTHER_FOREIGN_FREE => {
                        let j = self.u64("foreign free index")?;
                        if j > foreign_seen {
                            let m = format!("foreign index {j} skips ahead of {foreign_seen}");
                            return Err(bad(self, m));
                        }
                        foreign_seen = foreign_seen.max(j + 1);
                        let Some(id) = foreign_base.checked_add(j) else {
                            return Err(bad(self, format!("foreign index {j} overflows")));
                        };
                        events.push(Event::Free { id });
                        None
                    }
                    OTHER_NEW_STREAM => {
                        stream = self.u64("stream")?;
                        streams.push(stream);
                        None
                    }
                    p => {
                        let i = p - OTHER_STREAM_BASE;
                        match usize::try_from(i).ok().and_then(|i| streams.get(i)) {
                            Some(&s) => stream = s,
                            None => {
                                let m = format!("stream index {i} of {}", streams.len());
                                return Err(bad(self, m));
                            }
                        }
                        None
                    }
                },
            };
            if let Some(size) = size {
                if size == 0 {
                    return Err(bad(self, "an allocation of 0 bytes".into()));
                }
                if next_id >= foreign_base {
                    return Err(bad(self, format!("more than {n_allocs} allocations")));
                }
                events.push(Event::Alloc {
                    id: next_id,
                    size,
                    stream,
                });
                next_id += 1;
            }
        }
        if next_id != foreign_base {
            return Err(self.error(format!(
                "{} allocations, but the header claims {n_allocs}",
                next_id - n_initial
            )));
        }
        Ok(events)
    }
}

/// The ops' events with the header's failed requests put back at their positions.
fn merge_failed(ops: Vec<Event>, failed: Vec<(u64, Event)>) -> Result<Vec<Event>, String> {
    if failed.is_empty() {
        return Ok(ops);
    }
    let total = ops.len() + failed.len();
    let mut events = Vec::with_capacity(total);
    let mut ops = ops.into_iter();
    for (at, e) in failed {
        if at >= total as u64 {
            return Err(format!("failed request at {at}, past the {total} events"));
        }
        while (events.len() as u64) < at {
            events.extend(ops.next());
        }
        events.push(e);
    }
    events.extend(ops);
    Ok(events)
}

fn op(tag: u128, payload: u128) -> u128 {
    payload << 2 | tag
}

fn put_op(out: &mut Vec<u8>, tag: u128, payload: u128) {
    put(out, op(tag, payload));
}

fn put(out: &mut Vec<u8>, mut v: u128) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put(out, s.len() as u128);
    out.extend_from_slice(s.as_bytes());
}

fn varint_len(v: u128) -> u32 {
    (128 - v.leading_zeros()).max(1).div_ceil(7)
}

/// FNV-1a, 64-bit: any change of a single byte changes it.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
