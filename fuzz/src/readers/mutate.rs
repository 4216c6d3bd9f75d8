//! Byte-level mutations of valid inputs, in the manner of AFL's havoc stage: bit flips, bytes
//! and integers at their edges, inserted, deleted and duplicated runs, splices from another valid
//! input, truncation; plus one that replaces a comma-separated field (CSV logs get past their
//! header that way). Positions are taken modulo the input's length, so every mutation applies to
//! every input and shrinks towards position 0.

use proptest::prelude::*;

/// Integers at the edges of every width, little- and big-endian, and as over-long varints.
const EDGES: [&[u8]; 14] = [
    &[0x00],
    &[0xff],
    &[0x7f],
    &[0x80],
    &[0xff, 0xff],
    &[0xff, 0xff, 0xff, 0x7f],
    &[0x7f, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0xff],
    &[0x00, 0x00, 0x00, 0x80],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[
        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
    ],
    &[
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0x03,
    ],
    &[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// Fields that break numbers and actions of a CSV line in interesting ways.
const FIELDS: [&str; 14] = [
    "",
    "-1",
    "0",
    "0x",
    "(nil)",
    "18446744073709551615",
    "18446744073709551616",
    "0xffffffffffffffffff",
    "1e3",
    "allocate",
    "free",
    "allocate failure",
    "\"quoted,field\"",
    "Thread,Time,Action,Pointer,Size,Stream",
];

/// One mutation.
#[derive(Clone, Debug)]
pub enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Edge {
        at: usize,
        edge: usize,
        overwrite: bool,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Duplicate {
        from: usize,
        len: usize,
        to: usize,
    },
    Splice {
        other: usize,
        from: usize,
        len: usize,
        at: usize,
    },
    Truncate {
        at: usize,
    },
    Field {
        line: usize,
        field: usize,
        value: usize,
    },
}

/// Mutations, biased towards the small ones that keep most of the structure intact.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        4 => (at, 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        4 => (at, 0..EDGES.len(), any::<bool>())
            .prop_map(|(at, edge, overwrite)| Mutation::Edge { at, edge, overwrite }),
        2 => (at, 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        2 => (at, 1usize..256, at)
            .prop_map(|(from, len, to)| Mutation::Duplicate { from, len, to }),
        1 => (any::<usize>(), at, 1usize..512, at)
            .prop_map(|(other, from, len, at)| Mutation::Splice { other, from, len, at }),
        1 => at.prop_map(|at| Mutation::Truncate { at }),
        2 => (0usize..64, 0usize..8, 0..FIELDS.len())
            .prop_map(|(line, field, value)| Mutation::Field { line, field, value }),
    ]
}

fn pos(at: usize, len: usize) -> usize {
    at % (len + 1)
}

/// Replaces field `field` of line `line` (both modulo what is there) with `value`.
fn replace_field(bytes: &mut Vec<u8>, line: usize, field: usize, value: &str) {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let mut lines: Vec<String> = text.split('\n').map(String::from).collect();
    let l = line % lines.len();
    let mut fields: Vec<&str> = lines[l].split(',').collect();
    let f = field % fields.len();
    fields[f] = value;
    lines[l] = fields.join(",");
    *bytes = lines.join("\n").into_bytes();
}

/// Applies `m` to `bytes`; `others` are the valid inputs a splice takes from.
pub fn apply(bytes: &mut Vec<u8>, m: &Mutation, others: &[Vec<u8>]) {
    let len = bytes.len();
    match *m {
        Mutation::Flip { at, bit } if len > 0 => bytes[at % len] ^= 1 << bit,
        Mutation::Flip { .. } => {}
        Mutation::Edge {
            at,
            edge,
            overwrite,
        } => {
            let e = EDGES[edge];
            let p = pos(at, len);
            if overwrite {
                let end = (p + e.len()).min(len);
                bytes.splice(p..end, e.iter().copied());
            } else {
                bytes.splice(p..p, e.iter().copied());
            }
        }
        Mutation::Delete { at, len: n } => {
            let p = pos(at, len);
            bytes.drain(p..(p + n).min(len));
        }
        Mutation::Duplicate { from, len: n, to } => {
            let p = pos(from, len);
            let run: Vec<u8> = bytes[p..(p + n).min(len)].to_vec();
            let q = pos(to, len);
            bytes.splice(q..q, run);
        }
        Mutation::Splice {
            other,
            from,
            len: n,
            at,
        } => {
            let Some(src) = others.get(other % others.len().max(1)) else {
                return;
            };
            let p = pos(from, src.len());
            let run = &src[p..(p + n).min(src.len())];
            let q = pos(at, len);
            bytes.splice(q..q, run.iter().copied());
        }
        Mutation::Truncate { at } => bytes.truncate(pos(at, len)),
        Mutation::Field { line, field, value } => replace_field(bytes, line, field, FIELDS[value]),
    }
}
