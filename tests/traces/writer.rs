//! A minimal pickle writer (protocol 2, no memo) for synthetic snapshots.

use std::rc::Rc;

use vmm_alloc::trace::pickle::Value;

/// Pickles `v` with protocol 2.
pub fn dumps(v: &Value) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    write(v, &mut out);
    out.push(b'.');
    out
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::None => out.push(b'N'),
        Value::Bool(true) => out.push(0x88),
        Value::Bool(false) => out.push(0x89),
        Value::Int(i) => {
            out.push(0x8a);
            out.push(8);
            out.extend_from_slice(&i.to_le_bytes());
        }
        Value::BigInt(b) => {
            out.push(0x8a);
            out.push(b.len() as u8);
            out.extend_from_slice(b);
        }
        Value::Float(f) => {
            out.push(b'G');
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::Str(s) => {
            out.push(b'X');
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bytes(b) => {
            out.push(b'B');
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        Value::List(items) => {
            out.extend_from_slice(b"](");
            items.iter().for_each(|x| write(x, out));
            out.push(b'e');
        }
        Value::Tuple(items) => {
            out.push(b'(');
            items.iter().for_each(|x| write(x, out));
            out.push(b't');
        }
        Value::Dict(pairs) => {
            out.extend_from_slice(b"}(");
            for (k, x) in pairs.iter() {
                write(k, out);
                write(x, out);
            }
            out.push(b'u');
        }
    }
}

/// A string value.
pub fn s(x: &str) -> Value {
    Value::Str(Rc::from(x))
}

/// An integer value.
pub fn i(x: i64) -> Value {
    Value::Int(x)
}

/// A list value.
pub fn list(items: Vec<Value>) -> Value {
    Value::List(Rc::from(items))
}

/// A dict with string keys.
pub fn dict(pairs: Vec<(&str, Value)>) -> Value {
    Value::Dict(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}
