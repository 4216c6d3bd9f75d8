//! A pickle reader that builds plain values only: `None`, booleans, integers, floats, strings,
//! bytes, lists, tuples and dicts. It never imports, calls or constructs anything, so it is safe on
//! untrusted files (a PyTorch memory snapshot is a pickle, and `pickle.load` can run code).
//!
//! Supported: protocols 2 to 5 (and binary protocol-1 pickles without a `PROTO` opcode), with the
//! opcodes PyTorch's `_dump_snapshot` writes plus their close relatives (`FRAME`, `PROTO`, `STOP`,
//! `MARK`, `POP`, `POP_MARK`, `DUP`, `NONE`, `NEWTRUE`, `NEWFALSE`, `BININT*`, `LONG1`, `LONG4`,
//! `BINFLOAT`, `*BINUNICODE*`, `*BINSTRING`, `*BINBYTES*`, `BYTEARRAY8`, list/tuple/dict builders
//! and the memo opcodes). Everything else is an error naming the opcode and its byte offset:
//! `GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`,
//! `BINPERSID`, `EXT1/2/4` would import or call code; text-protocol, set and out-of-band-buffer
//! opcodes are simply not needed.
//!
//! # Note [Shared values]
//!
//! Pickles share a value by memoizing it once and fetching it again (`BINGET`): PyTorch stores each
//! stack-frame list once and refers to it from hundreds of trace entries. A list is memoized when
//! it is still empty and filled afterwards (`EMPTY_LIST MEMOIZE MARK ... APPENDS`), so a memo
//! entry must see later appends. The reader therefore builds containers in an arena and passes
//! indices around (a memo fetch copies an index); at `STOP` it turns the arena into an immutable
//! tree of [`Rc`]-shared values, converting each container exactly once, so a list fetched a
//! thousand times is one allocation referenced a thousand times. A container that (directly or
//! not) holds itself is rejected: the tree could not represent it.
//!
//! # Bounds
//!
//! Every claimed length is checked against the bytes that remain before anything is allocated;
//! each opcode creates at most one value, so the values built (and the memory used) grow at most
//! linearly with the input; nesting deeper than [`MAX_DEPTH`] is an error (which also bounds the
//! recursion of `Drop`, `PartialEq` and `Debug` on the result); truncated input is an error.

use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

/// The deepest nesting of containers (and of `MARK`s) accepted. Real snapshots nest 6 levels.
pub const MAX_DEPTH: usize = 1_000;

/// How many items [`Value::same_as`] looks at before it gives up.
pub const SAME_AS_BUDGET: usize = 1 << 20;

/// A value built from a pickle. Containers are reference-counted: cloning one is cheap, and a
/// value the pickle shares through its memo is shared here too. (`==` and `Debug` visit a shared
/// value once per reference; on untrusted input compare with [`Value::same_as`].)
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Python `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits in an `i64`.
    Int(i64),
    /// Any other integer, as its minimal little-endian two's-complement bytes (PyTorch writes
    /// `size_t(-1)` = 2^64 − 1 as a frame's line number, for example).
    BigInt(Rc<[u8]>),
    /// A float.
    Float(f64),
    /// A string (invalid UTF-8, e.g. surrogates, is replaced by U+FFFD).
    Str(Rc<str>),
    /// `bytes` or `bytearray`.
    Bytes(Rc<[u8]>),
    /// A list.
    List(Rc<[Value]>),
    /// A tuple.
    Tuple(Rc<[Value]>),
    /// A dict, as (key, value) pairs in insertion order; when a key repeats, the last pair wins
    /// (see [`Value::get`]).
    Dict(Rc<[(Value, Value)]>),
}

impl Value {
    /// The value stored under the string key `key`, if this is a dict that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(pairs) => pairs.iter().rev().find_map(|(k, v)| match k {
                Value::Str(s) if &**s == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }

    /// The integer, if this is one (`True`/`False` count as 1/0, as in Python).
    pub fn as_int(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    /// The integer, if this is one that fits in an `i128`.
    pub fn as_i128(&self) -> Option<i128> {
        match self {
            Value::BigInt(b) if b.len() <= 16 => {
                let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) {
                    0xff
                } else {
                    0
                };
                let mut a = [fill; 16];
                a.get_mut(..b.len())?.copy_from_slice(b);
                Some(i128::from_le_bytes(a))
            }
            _ => self.as_int().map(i128::from),
        }
    }

    /// The integer, if this is one in `0..2^64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|i| u64::try_from(i).ok())
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is a list or a tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) | Value::Tuple(items) => Some(items),
            _ => None,
        }
    }

    /// Equality with bounded work: containers both sides share compare equal at once (cheap
    /// for the memo-shared frame lists of a snapshot), and the walk gives up, answering `false`,
    /// after [`SAME_AS_BUDGET`] items. `==` has no such bound: a hostile pickle can share
    /// sub-values so that its tree is exponentially larger than the file.
    pub fn same_as(&self, other: &Value) -> bool {
        let mut budget = SAME_AS_BUDGET;
        same(self, other, &mut budget)
    }

    /// The Python type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
        }
    }
}

fn same(a: &Value, b: &Value, budget: &mut usize) -> bool {
    let mut spend = |n: usize| match budget.checked_sub(n + 1) {
        Some(left) => {
            *budget = left;
            true
        }
        None => false,
    };
    match (a, b) {
        (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => {
            Rc::ptr_eq(x, y)
                || (x.len() == y.len()
                    && spend(x.len())
                    && x.iter().zip(y.iter()).all(|(p, q)| same(p, q, budget)))
        }
        (Value::Dict(x), Value::Dict(y)) => {
            Rc::ptr_eq(x, y)
                || (x.len() == y.len()
                    && spend(x.len())
                    && x.iter()
                        .zip(y.iter())
                        .all(|((k, v), (l, w))| same(k, l, budget) && same(v, w, budget)))
        }
        _ => a == b,
    }
}

/// A pickle could not be read: what is wrong and at which byte.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("pickle byte {offset}: {message}")]
pub struct PickleError {
    /// Offset of the opcode (or of the end of input) where reading stopped.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

/// Reads one pickle from `bytes` and returns the value its `STOP` opcode yields (bytes after
/// `STOP` are ignored, as `pickle.load` does).
///
/// ```
/// use vmm_replay::pickle::{parse, Value};
/// // pickle.dumps([1, "a"], protocol=2)
/// let v = parse(b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00aq\x01e.").unwrap();
/// assert_eq!(v.as_seq().unwrap()[0], Value::Int(1));
/// assert!(parse(b"\x80\x02cos\nsystem\n.").unwrap_err().to_string().contains("GLOBAL"));
/// ```
pub fn parse(bytes: &[u8]) -> Result<Value, PickleError> {
    if bytes.is_empty() {
        return Err(PickleError {
            offset: 0,
            message: "the input is empty: expected a pickle (a PyTorch snapshot starts with \
                      PROTO, byte 0x80)"
                .into(),
        });
    }
    let mut m = Machine {
        input: bytes,
        pos: 0,
        op_at: 0,
        op: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        nodes: Vec::new(),
    };
    let root = m.run()?;
    finish(m.nodes, root, bytes.len())
}

/// A stack item while reading: a finished scalar, or an arena container.
#[derive(Clone)]
enum Slot {
    Val(Value),
    Node(usize),
}

/// A container under construction (see Note [Shared values]).
enum Node {
    List(Vec<Slot>),
    Tuple(Vec<Slot>),
    Dict(Vec<(Slot, Slot)>),
}

struct Machine<'a> {
    input: &'a [u8],
    pos: usize,
    /// Where the current opcode starts, and the opcode, for error messages.
    op_at: usize,
    op: u8,
    stack: Vec<Slot>,
    /// Stack lengths at each open `MARK`.
    marks: Vec<usize>,
    memo: Memo,
    nodes: Vec<Node>,
}

/// The memo: a dense vector for the keys `MEMOIZE` hands out (0, 1, 2, ...), a map for any
/// other key a `BINPUT` names. No key is in both.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Slot>>,
    sparse: HashMap<u64, Slot>,
    /// Distinct keys stored (Python's `len(memo)`, the key `MEMOIZE` uses next).
    count: u64,
}

impl Memo {
    fn put(&mut self, key: u64, v: Slot) {
        let dense_len = self.dense.len() as u64;
        if let Some(slot) = usize::try_from(key)
            .ok()
            .and_then(|k| self.dense.get_mut(k))
        {
            if slot.is_none() {
                self.count += 1;
            }
            *slot = Some(v);
        } else if key == dense_len {
            if self.sparse.remove(&key).is_none() {
                self.count += 1;
            }
            self.dense.push(Some(v));
        } else if self.sparse.insert(key, v).is_none() {
            self.count += 1;
        }
    }

    fn get(&self, key: u64) -> Option<&Slot> {
        usize::try_from(key)
            .ok()
            .and_then(|k| self.dense.get(k))
            .and_then(Option::as_ref)
            .or_else(|| self.sparse.get(&key))
    }
}

/// Names of the printable-ASCII opcodes, each prefixed by its byte.
const ASCII_OPS: &str = concat!(
    "(MARK .STOP 0POP 1POP_MARK 2DUP FFLOAT IINT JBININT KBININT1 LLONG MBININT2 NNONE ",
    "PPERSID QBINPERSID RREDUCE SSTRING TBINSTRING USHORT_BINSTRING VUNICODE XBINUNICODE ",
    "aAPPEND bBUILD cGLOBAL dDICT }EMPTY_DICT eAPPENDS gGET hBINGET iINST jLONG_BINGET lLIST ",
    "]EMPTY_LIST oOBJ pPUT qBINPUT rLONG_BINPUT sSETITEM tTUPLE )EMPTY_TUPLE uSETITEMS ",
    "GBINFLOAT BBINBYTES CSHORT_BINBYTES"
);

/// Names of the opcodes 0x80 to 0x98 (protocols 2 to 5).
const HIGH_OPS: [&str; 25] = [
    "PROTO",
    "NEWOBJ",
    "EXT1",
    "EXT2",
    "EXT4",
    "TUPLE1",
    "TUPLE2",
    "TUPLE3",
    "NEWTRUE",
    "NEWFALSE",
    "LONG1",
    "LONG4",
    "SHORT_BINUNICODE",
    "BINUNICODE8",
    "BINBYTES8",
    "EMPTY_SET",
    "ADDITEMS",
    "FROZENSET",
    "NEWOBJ_EX",
    "STACK_GLOBAL",
    "MEMOIZE",
    "FRAME",
    "BYTEARRAY8",
    "NEXT_BUFFER",
    "READONLY_BUFFER",
];

/// The name of an opcode, for error messages (`"unknown"` when it is none).
fn opcode_name(op: u8) -> &'static str {
    let name = match op.checked_sub(0x80) {
        Some(i) => HIGH_OPS.get(usize::from(i)).copied(),
        None => ASCII_OPS
            .split(' ')
            .find(|n| n.as_bytes().first() == Some(&op))
            .and_then(|n| n.get(1..)),
    };
    name.unwrap_or("unknown")
}

impl Machine<'_> {
    fn err(&self, message: impl fmt::Display) -> PickleError {
        let (op, name) = (self.op, opcode_name(self.op));
        PickleError {
            offset: self.op_at,
            message: format!("{name} (0x{op:02x}): {message}"),
        }
    }

    /// Takes `n` argument bytes, or fails if fewer remain.
    fn take(&mut self, n: u64) -> Result<&[u8], PickleError> {
        let left = self.input.len() - self.pos;
        if n > left as u64 {
            return Err(self.err(format!(
                "needs {n} more bytes but only {left} remain (truncated or corrupt)"
            )));
        }
        let start = self.pos;
        self.pos += n as usize;
        self.input
            .get(start..self.pos)
            .ok_or_else(|| self.err("argument out of bounds"))
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64)?);
        Ok(a)
    }

    /// A little-endian unsigned argument of `width` bytes (1 to 8).
    fn uint(&mut self, width: u64) -> Result<u64, PickleError> {
        let b = self.take(width)?;
        Ok(b.iter().rev().fold(0, |acc, &x| (acc << 8) | u64::from(x)))
    }

    fn push_val(&mut self, v: Value) {
        self.stack.push(Slot::Val(v));
    }

    fn push_node(&mut self, n: Node) {
        self.nodes.push(n);
        self.stack.push(Slot::Node(self.nodes.len() - 1));
    }

    /// The stack length below which the current opcode may not pop (the innermost mark).
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Slot, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn top(&self) -> Result<&Slot, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.err("stack underflow"));
        }
        self.stack.last().ok_or_else(|| self.err("stack underflow"))
    }

    /// Pops everything above the innermost mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Slot>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.err("no MARK to pop"))?;
        if m > self.stack.len() {
            return Err(self.err("MARK above the stack top"));
        }
        Ok(self.stack.split_off(m))
    }

    /// The arena index of the container on top of the stack (the target of APPEND / SETITEM).
    fn target(&self) -> Result<usize, PickleError> {
        match self.top()? {
            Slot::Node(i) => Ok(*i),
            Slot::Val(v) => {
                Err(self.err(format!("target is a {}, not a container", v.type_name())))
            }
        }
    }

    fn append(&mut self, items: Vec<Slot>) -> Result<(), PickleError> {
        let idx = self.target()?;
        if let Some(Node::List(v)) = self.nodes.get_mut(idx) {
            v.extend(items);
            return Ok(());
        }
        Err(self.err("can only append to a list"))
    }

    fn set_items(&mut self, items: Vec<Slot>) -> Result<(), PickleError> {
        let idx = self.target()?;
        let Some(pairs) = pairs(items) else {
            return Err(self.err("odd number of items for a dict"));
        };
        if let Some(Node::Dict(d)) = self.nodes.get_mut(idx) {
            d.extend(pairs);
            return Ok(());
        }
        Err(self.err("can only set items of a dict"))
    }

    /// An integer of a `width`-byte length, then that many bytes (LONG1, LONG4).
    fn long(&mut self, width: u64) -> Result<(), PickleError> {
        let n = self.uint(width)?;
        let v = le_int(self.take(n)?);
        self.push_val(v);
        Ok(())
    }

    /// A string of a `width`-byte length (lossy UTF-8: Python allows lone surrogates).
    fn string(&mut self, width: u64) -> Result<(), PickleError> {
        let n = self.uint(width)?;
        let s: Rc<str> = Rc::from(String::from_utf8_lossy(self.take(n)?).as_ref());
        self.push_val(Value::Str(s));
        Ok(())
    }

    /// Bytes of a `width`-byte length.
    fn bytes(&mut self, width: u64) -> Result<(), PickleError> {
        let n = self.uint(width)?;
        let b: Rc<[u8]> = Rc::from(self.take(n)?);
        self.push_val(Value::Bytes(b));
        Ok(())
    }

    /// Stores the top of the stack under a `width`-byte key (`MEMOIZE`: width 0, the next key).
    fn memo_put(&mut self, width: u64) -> Result<(), PickleError> {
        let key = if width == 0 {
            self.memo.count
        } else {
            self.uint(width)?
        };
        let top = self.top()?.clone();
        self.memo.put(key, top);
        Ok(())
    }

    fn memo_get(&mut self, width: u64) -> Result<(), PickleError> {
        let key = self.uint(width)?;
        let v = self.memo.get(key).cloned();
        let v = v.ok_or_else(|| self.err(format!("memo key {key} was never stored")))?;
        self.stack.push(v);
        Ok(())
    }

    fn tuple_of(&mut self, n: usize) -> Result<(), PickleError> {
        if self.stack.len() < self.floor() + n {
            return Err(self.err("stack underflow"));
        }
        let items = self.stack.split_off(self.stack.len() - n);
        self.push_node(Node::Tuple(items));
        Ok(())
    }

    /// BININT, BININT1, BININT2, BINFLOAT.
    fn number(&mut self, op: u8) -> Result<Value, PickleError> {
        Ok(match op {
            b'J' => Value::Int(i32::from_le_bytes(self.take_array()?).into()),
            b'K' => Value::Int(self.uint(1)? as i64),
            b'M' => Value::Int(self.uint(2)? as i64),
            _ => Value::Float(f64::from_be_bytes(self.take_array()?)),
        })
    }

    fn proto(&mut self) -> Result<(), PickleError> {
        match self.uint(1)? {
            2..=5 => Ok(()),
            v => Err(self.err(format!("unsupported pickle protocol {v}"))),
        }
    }

    /// A frame only announces how many bytes follow: check the claim, then read on.
    fn frame(&mut self) -> Result<(), PickleError> {
        let n = self.uint(8)?;
        let left = self.input.len() - self.pos;
        if n > left as u64 {
            let msg = format!("frame of {n} bytes but only {left} remain (truncated or corrupt)");
            return Err(self.err(msg));
        }
        Ok(())
    }

    fn mark(&mut self) -> Result<(), PickleError> {
        if self.marks.len() >= MAX_DEPTH {
            return Err(self.err(format!("MARKs nested deeper than {MAX_DEPTH}")));
        }
        self.marks.push(self.stack.len());
        Ok(())
    }

    /// POP: drops the top item, or the innermost mark when nothing is above it (as CPython).
    fn pop_any(&mut self) -> Result<(), PickleError> {
        if self.stack.len() > self.floor() {
            self.stack.pop();
        } else {
            self.pop_mark()?;
        }
        Ok(())
    }

    fn dict(&mut self) -> Result<(), PickleError> {
        let items = self.pop_mark()?;
        let p = pairs(items).ok_or_else(|| self.err("odd number of items"))?;
        self.push_node(Node::Dict(p));
        Ok(())
    }

    /// Runs opcodes up to `STOP` and returns the value it yields.
    fn run(&mut self) -> Result<Slot, PickleError> {
        loop {
            self.op_at = self.pos;
            let Some(&op) = self.input.get(self.pos) else {
                let message = "input ended before the STOP opcode (truncated)".into();
                return Err(PickleError {
                    offset: self.pos,
                    message,
                });
            };
            self.op = op;
            self.pos += 1;
            match op {
                0x80 => self.proto()?,
                0x95 => self.frame()?,
                b'.' => return self.pop(),
                b'(' => self.mark()?,
                b'0' => self.pop_any()?,
                b'1' => drop(self.pop_mark()?),
                b'2' => {
                    let top = self.top()?.clone();
                    self.stack.push(top);
                }
                b'N' => self.push_val(Value::None),
                0x88 | 0x89 => self.push_val(Value::Bool(op == 0x88)),
                b'J' | b'K' | b'M' | b'G' => {
                    let v = self.number(op)?;
                    self.push_val(v);
                }
                0x8a => self.long(1)?,
                0x8b => self.long(4)?,
                0x8c | b'U' => self.string(1)?,
                b'X' | b'T' => self.string(4)?,
                0x8d => self.string(8)?,
                b'C' => self.bytes(1)?,
                b'B' => self.bytes(4)?,
                0x8e | 0x96 => self.bytes(8)?,
                b']' => self.push_node(Node::List(Vec::new())),
                b')' => self.push_node(Node::Tuple(Vec::new())),
                b'}' => self.push_node(Node::Dict(Vec::new())),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push_node(Node::List(items));
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push_node(Node::Tuple(items));
                }
                0x85..=0x87 => self.tuple_of(usize::from(op - 0x84))?,
                b'd' => self.dict()?,
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                0x94 => self.memo_put(0)?,
                b'q' => self.memo_put(1)?,
                b'r' => self.memo_put(4)?,
                b'h' => self.memo_get(1)?,
                b'j' => self.memo_get(4)?,
                b'c' | 0x93 | b'R' | b'b' | b'i' | b'o' | 0x81 | 0x92 | b'P' | b'Q' | 0x82
                | 0x83 | 0x84 => {
                    let why = "refused: it imports or calls code, and only plain values are read";
                    return Err(self.err(why));
                }
                _ if opcode_name(op) != "unknown" => {
                    return Err(self.err("not supported by this reader"));
                }
                _ => return Err(self.err("unknown opcode")),
            }
        }
    }
}

/// Groups `k1, v1, k2, v2, ...` into pairs; `None` for an odd count.
fn pairs(items: Vec<Slot>) -> Option<Vec<(Slot, Slot)>> {
    if !items.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Some(out)
}

/// A little-endian two's-complement integer: an [`Value::Int`] when it fits in an `i64`, else a
/// [`Value::BigInt`] of its minimal encoding (redundant sign-extension bytes dropped).
fn le_int(b: &[u8]) -> Value {
    let mut len = b.len();
    while len > 1 {
        let (Some(&top), Some(&below)) = (b.get(len - 1), b.get(len - 2)) else {
            break;
        };
        let redundant = (top == 0x00 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0);
        if !redundant {
            break;
        }
        len -= 1;
    }
    let b = b.get(..len).unwrap_or(b);
    if b.len() > 8 {
        return Value::BigInt(Rc::from(b));
    }
    let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut a = [fill; 8];
    for (slot, &byte) in a.iter_mut().zip(b) {
        *slot = byte;
    }
    Value::Int(i64::from_le_bytes(a))
}

/// Turns the arena into an `Rc` tree, converting each container once (Note [Shared values]).
fn finish(nodes: Vec<Node>, root: Slot, end: usize) -> Result<Value, PickleError> {
    let root = match root {
        Slot::Val(v) => return Ok(v),
        Slot::Node(i) => i,
    };
    let fail = |message: String| PickleError {
        offset: end,
        message,
    };
    const TODO: u8 = 0;
    const OPEN: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![TODO; nodes.len()];
    let mut done: Vec<Option<Value>> = vec![None; nodes.len()];
    // Depth-first, post-order: (container, next child to visit).
    let mut path: Vec<(usize, usize)> = vec![(root, 0)];
    if let Some(s) = state.get_mut(root) {
        *s = OPEN;
    }
    while let Some(&(n, next)) = path.last() {
        let node = nodes
            .get(n)
            .ok_or_else(|| fail("internal: container index out of range".into()))?;
        if let Some(slot) = child_slot(node, next) {
            if let Some(top) = path.last_mut() {
                top.1 += 1;
            }
            if let Slot::Node(c) = *slot {
                match state.get(c).copied() {
                    Some(TODO) => {
                        if path.len() >= MAX_DEPTH {
                            return Err(fail(format!(
                                "containers nested deeper than {MAX_DEPTH} levels"
                            )));
                        }
                        if let Some(s) = state.get_mut(c) {
                            *s = OPEN;
                        }
                        path.push((c, 0));
                    }
                    Some(OPEN) => {
                        return Err(fail(
                            "a container holds itself (recursive structure); not supported".into(),
                        ))
                    }
                    _ => {}
                }
            }
            continue;
        }
        // Every child is converted: build this container.
        let get = |s: &Slot| -> Result<Value, PickleError> {
            match s {
                Slot::Val(v) => Ok(v.clone()),
                Slot::Node(c) => done
                    .get(*c)
                    .cloned()
                    .flatten()
                    .ok_or_else(|| fail("internal: child not converted".into())),
            }
        };
        let v = match node {
            Node::List(items) => Value::List(items.iter().map(get).collect::<Result<_, _>>()?),
            Node::Tuple(items) => Value::Tuple(items.iter().map(get).collect::<Result<_, _>>()?),
            Node::Dict(pairs) => Value::Dict(
                pairs
                    .iter()
                    .map(|(k, v)| Ok((get(k)?, get(v)?)))
                    .collect::<Result<_, PickleError>>()?,
            ),
        };
        if let Some(d) = done.get_mut(n) {
            *d = Some(v);
        }
        if let Some(s) = state.get_mut(n) {
            *s = DONE;
        }
        path.pop();
    }
    done.get_mut(root)
        .and_then(Option::take)
        .ok_or_else(|| fail("internal: root not converted".into()))
}

/// The `i`-th child slot of a container (dict keys and values interleaved).
fn child_slot(node: &Node, i: usize) -> Option<&Slot> {
    match node {
        Node::List(v) | Node::Tuple(v) => v.get(i),
        Node::Dict(p) => p
            .get(i / 2)
            .map(|(k, v)| if i.is_multiple_of(2) { k } else { v }),
    }
}
