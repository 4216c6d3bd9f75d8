//! A pickle writer for [`Value`]s that pytorch.org/memory_viz can read: protocol 4, and only the
//! opcodes its JavaScript unpickler knows (`PROTO`, `MARK`, `EMPTY_DICT`, `SETITEMS`,
//! `EMPTY_LIST`, `APPENDS`, `EMPTY_TUPLE`, `TUPLE`, `TUPLE1`-`3`, `BININT`, `BININT1`,
//! `BININT2`, `LONG1`, `BINFLOAT`, `NONE`, `NEWTRUE`, `NEWFALSE`, `SHORT_BINUNICODE`,
//! `BINUNICODE`, `STOP`; see `shared/reference/pytorch-allocator.md` §4.3). No `FRAME` (framing
//! is optional for unpicklers) and no memo: a value shared through an `Rc` is written once per
//! reference.
//!
//! The output is deterministic (the same value gives the same bytes) and CPython's
//! `pickle.load` reads it back as the same value. Writing never panics and never recurses, so a
//! value nested a million levels deep is written as well as a flat one; what the viewer has no
//! opcode for is an error ([`PickleWriteError`]).

use super::super::pickle::Value;

/// The protocol written in the `PROTO` header: the newest the viewer accepts (it refuses 5).
pub const PROTOCOL: u8 = 4;

/// Items per `MARK ... APPENDS` (or `SETITEMS`) batch, as CPython's pickler writes them: an
/// unpickler then never holds more than this many loose items of one container on its stack.
const BATCH: usize = 1000;

/// A value the viewer's unpickler could not read back.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PickleWriteError {
    /// `bytes` have no opcode the viewer knows (`BINBYTES` is not among them).
    #[error("bytes values cannot be written: memory_viz's unpickler has no bytes opcode")]
    Bytes,
    /// A string of 4 GiB or more would need `BINUNICODE8`, which the viewer does not know.
    #[error("a string of {len} bytes is too long: BINUNICODE holds at most 4 GiB")]
    StrTooLong {
        /// The string's length in bytes.
        len: usize,
    },
    /// An integer of more than 255 bytes would need `LONG4`, which the viewer does not know.
    #[error("an integer of {len} bytes is too long: LONG1 holds at most 255 bytes")]
    IntTooLong {
        /// The integer's length in bytes.
        len: usize,
    },
}

/// Pickles `v` (protocol 4, viewer opcodes only).
///
/// ```
/// use vmm_replay::dump::pickle_writer::dumps;
/// use vmm_replay::pickle::{parse, Value};
/// let v = Value::List(vec![Value::Int(1), Value::Str("a".into())].into());
/// // The bytes CPython's pickle.dumps([1, "a"], protocol=4) writes, less its FRAME and memo.
/// assert_eq!(dumps(&v).unwrap(), b"\x80\x04](K\x01\x8c\x01ae.");
/// assert_eq!(parse(&dumps(&v).unwrap()).unwrap(), v);
/// ```
pub fn dumps(v: &Value) -> Result<Vec<u8>, PickleWriteError> {
    let mut out = vec![0x80, PROTOCOL];
    // Work still to do, last first: a container pushes its closing opcodes and its items.
    let mut todo = vec![Task::Value(v)];
    while let Some(task) = todo.pop() {
        match task {
            Task::Op(op) => out.push(op),
            Task::Value(v) => write_value(v, &mut out, &mut todo)?,
        }
    }
    out.push(b'.');
    Ok(out)
}

enum Task<'a> {
    /// Write this value.
    Value(&'a Value),
    /// Write this one-byte opcode.
    Op(u8),
}

fn write_value<'a>(
    v: &'a Value,
    out: &mut Vec<u8>,
    todo: &mut Vec<Task<'a>>,
) -> Result<(), PickleWriteError> {
    match v {
        Value::None => out.push(b'N'),
        Value::Bool(true) => out.push(0x88),
        Value::Bool(false) => out.push(0x89),
        Value::Int(i) => write_int(*i, out),
        Value::BigInt(b) => write_long1(b, out)?,
        Value::Float(f) => {
            out.push(b'G');
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::Str(s) => write_str(s, out)?,
        Value::Bytes(_) => return Err(PickleWriteError::Bytes),
        Value::List(items) => {
            out.push(b']');
            for batch in items.chunks(BATCH).rev() {
                todo.push(Task::Op(b'e'));
                todo.extend(batch.iter().rev().map(Task::Value));
                todo.push(Task::Op(b'('));
            }
        }
        Value::Tuple(items) => match items.len() {
            0 => out.push(b')'),
            n @ 1..=3 => {
                // TUPLE1..TUPLE3 are 0x85..0x87.
                todo.push(Task::Op(0x84 + n as u8));
                todo.extend(items.iter().rev().map(Task::Value));
            }
            _ => {
                todo.push(Task::Op(b't'));
                todo.extend(items.iter().rev().map(Task::Value));
                out.push(b'(');
            }
        },
        Value::Dict(pairs) => {
            out.push(b'}');
            for batch in pairs.chunks(BATCH).rev() {
                todo.push(Task::Op(b'u'));
                for (k, x) in batch.iter().rev() {
                    todo.push(Task::Value(x));
                    todo.push(Task::Value(k));
                }
                todo.push(Task::Op(b'('));
            }
        }
    }
    Ok(())
}

/// The shortest of BININT1 (0..=255), BININT2 (0..=65535), BININT (i32), LONG1, as CPython.
fn write_int(i: i64, out: &mut Vec<u8>) {
    if let Ok(b) = u8::try_from(i) {
        out.extend_from_slice(&[b'K', b]);
    } else if let Ok(h) = u16::try_from(i) {
        out.push(b'M');
        out.extend_from_slice(&h.to_le_bytes());
    } else if let Ok(w) = i32::try_from(i) {
        out.push(b'J');
        out.extend_from_slice(&w.to_le_bytes());
    } else {
        // The fewest two's-complement bytes that hold it (5 to 8: it is outside i32).
        let fits = |n: usize| {
            let half = 1i128 << (8 * n - 1);
            (-half..half).contains(&i128::from(i))
        };
        let len = (5..8).find(|&n| fits(n)).unwrap_or(8);
        let bytes = i.to_le_bytes();
        out.extend_from_slice(&[0x8a, len as u8]);
        out.extend_from_slice(&bytes[..len]);
    }
}

/// LONG1: a length byte, then the little-endian two's-complement bytes.
fn write_long1(bytes: &[u8], out: &mut Vec<u8>) -> Result<(), PickleWriteError> {
    let len =
        u8::try_from(bytes.len()).map_err(|_| PickleWriteError::IntTooLong { len: bytes.len() })?;
    out.extend_from_slice(&[0x8a, len]);
    out.extend_from_slice(bytes);
    Ok(())
}

/// SHORT_BINUNICODE below 256 bytes, else BINUNICODE (UTF-8 either way).
fn write_str(s: &str, out: &mut Vec<u8>) -> Result<(), PickleWriteError> {
    if let Ok(len) = u8::try_from(s.len()) {
        out.extend_from_slice(&[0x8c, len]);
    } else {
        let len =
            u32::try_from(s.len()).map_err(|_| PickleWriteError::StrTooLong { len: s.len() })?;
        out.push(b'X');
        out.extend_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(s.as_bytes());
    Ok(())
}
