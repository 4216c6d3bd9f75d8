//! Values for synthetic snapshots, pickled by the library's writer.

use std::rc::Rc;

use vmm_replay::pickle::Value;

/// Pickles `v` (protocol 4, the opcodes memory_viz reads).
pub fn dumps(v: &Value) -> Vec<u8> {
    vmm_replay::dump::pickle_writer::dumps(v).expect("test values hold no bytes")
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
