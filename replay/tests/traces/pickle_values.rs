//! Small pickles written by CPython decode to the right values.

use std::rc::Rc;

use vmm_replay::pickle::{parse, Value};

use crate::writer::{dict, dumps, i, list, s};

/// `pickle.dumps({'a': [1, 2.5, None, True, False], 'b': (1, 'x'), 'n': -5, 'big': 2**40,
/// 'neg': -2**40, 'i2': 40000, 'i4': -70000, 'e': ()}, protocol=2)`
const PROTO2: &[u8] = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01G@\x04\x00\x00\x00\x00\x00\x00N\x88\x89eX\x01\x00\x00\x00bq\x03K\x01X\x01\x00\x00\x00xq\x04\x86q\x05X\x01\x00\x00\x00nq\x06J\xfb\xff\xff\xffX\x03\x00\x00\x00bigq\x07\x8a\x06\x00\x00\x00\x00\x00\x01X\x03\x00\x00\x00negq\x08\x8a\x06\x00\x00\x00\x00\x00\xffX\x02\x00\x00\x00i2q\x09M@\x9cX\x02\x00\x00\x00i4q\x0aJ\x90\xee\xfe\xffX\x01\x00\x00\x00eq\x0b)u.";

/// `l = [1, 's']; pickle.dumps({'x': l, 'y': l, 'z': [l, [l, [l]]], 'u': 'héllo',
/// 'by': b'\x00\x01'}, protocol=4)`: one list shared five times through the memo.
pub const PROTO4_SHARED: &[u8] = b"\x80\x04\x95E\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01x\x94]\x94(K\x01\x8c\x01s\x94e\x8c\x01y\x94h\x02\x8c\x01z\x94]\x94(h\x02]\x94(h\x02]\x94h\x02aee\x8c\x01u\x94\x8c\x06h\xc3\xa9llo\x94\x8c\x02by\x94C\x02\x00\x01\x94u.";

/// `pickle.dumps([[[[]]], [1, [2, [3]]]], protocol=5)`
const PROTO5_NESTED: &[u8] = b"\x80\x05\x95\x1e\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94]\x94]\x94aa]\x94(K\x01]\x94(K\x02]\x94K\x03aeee.";

fn tuple(items: Vec<Value>) -> Value {
    Value::Tuple(Rc::from(items))
}

#[test]
fn protocol_2_scalars_and_containers() {
    let v = parse(PROTO2).unwrap();
    let expected = dict(vec![
        (
            "a",
            list(vec![
                i(1),
                Value::Float(2.5),
                Value::None,
                Value::Bool(true),
                Value::Bool(false),
            ]),
        ),
        ("b", tuple(vec![i(1), s("x")])),
        ("n", i(-5)),
        ("big", i(1 << 40)),
        ("neg", i(-(1 << 40))),
        ("i2", i(40000)),
        ("i4", i(-70000)),
        ("e", tuple(vec![])),
    ]);
    assert_eq!(v, expected);
    assert_eq!(v.get("big").and_then(Value::as_int), Some(1 << 40));
    assert_eq!(v.get("missing"), None);
}

#[test]
fn protocol_4_memo_sharing_is_shared_not_copied() {
    let v = parse(PROTO4_SHARED).unwrap();
    let l = list(vec![i(1), s("s")]);
    let expected = dict(vec![
        ("x", l.clone()),
        ("y", l.clone()),
        (
            "z",
            list(vec![l.clone(), list(vec![l.clone(), list(vec![l])])]),
        ),
        ("u", s("héllo")),
        ("by", Value::Bytes(Rc::from(&b"\x00\x01"[..]))),
    ]);
    assert_eq!(v, expected);
    let (Some(Value::List(x)), Some(Value::List(y))) = (v.get("x"), v.get("y")) else {
        panic!("x and y are lists");
    };
    assert!(Rc::ptr_eq(x, y), "a memo reference shares the list");
    let z = v.get("z").and_then(Value::as_seq).unwrap();
    let Value::List(z0) = &z[0] else { panic!() };
    assert!(Rc::ptr_eq(x, z0));
}

#[test]
fn protocol_5_nested_lists() {
    let v = parse(PROTO5_NESTED).unwrap();
    let expected = list(vec![
        list(vec![list(vec![list(vec![])])]),
        list(vec![i(1), list(vec![i(2), list(vec![i(3)])])]),
    ]);
    assert_eq!(v, expected);
}

#[test]
fn many_references_to_one_list_stay_cheap() {
    // A list memoized once and fetched 200,000 times: one allocation, shared.
    let mut p = b"\x80\x04]\x94(K\x01K\x02K\x03e](".to_vec();
    for _ in 0..200_000 {
        p.extend_from_slice(b"h\x00");
    }
    p.extend_from_slice(b"e.");
    let v = parse(&p).unwrap();
    let items = v.as_seq().unwrap();
    assert_eq!(items.len(), 200_000);
    let (Value::List(a), Value::List(b)) = (&items[0], &items[199_999]) else {
        panic!()
    };
    assert!(Rc::ptr_eq(a, b));
    assert_eq!(
        Rc::strong_count(a),
        200_000,
        "every item refers to the one list"
    );
}

#[test]
fn writer_round_trips() {
    let v = dict(vec![
        (
            "k",
            list(vec![i(-3), i(i64::MAX), i(i64::MIN), Value::Float(-0.5)]),
        ),
        ("t", tuple(vec![Value::None, Value::Bool(true), s("ü")])),
    ]);
    assert_eq!(parse(&dumps(&v)).unwrap(), v);
}

#[test]
fn dict_repeated_key_last_wins_and_long_ints() {
    // {'a': 1, 'a': 2} written by hand with SETITEM twice; LONG1 with 9 bytes of sign extension.
    let p = b"\x80\x02}X\x01\x00\x00\x00aK\x01sX\x01\x00\x00\x00aK\x02s.";
    assert_eq!(parse(p).unwrap().get("a"), Some(&i(2)));
    let p = b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff.";
    assert_eq!(parse(p).unwrap(), i(-1));
    // 2^63 and 2^64 - 1 (PyTorch writes size_t(-1) as a frame's line number) are BigInts.
    let p = b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.";
    let v = parse(p).unwrap();
    assert_eq!(v.as_u64(), Some(1 << 63));
    assert_eq!(v.as_int(), None);
    let p = b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.";
    assert_eq!(parse(p).unwrap().as_u64(), Some(u64::MAX));
    // -2^100 with redundant sign bytes: minimal encoding, equal to the minimal form.
    let mut long = vec![0x80, 2, 0x8b, 20, 0, 0, 0];
    long.extend_from_slice(&[0; 12]);
    long.extend_from_slice(&[0xf0]);
    long.extend_from_slice(&[0xff; 7]);
    long.push(b'.');
    let mut short = vec![0x80, 2, 0x8a, 13];
    short.extend_from_slice(&[0; 12]);
    short.extend_from_slice(&[0xf0, b'.']);
    assert_eq!(parse(&long).unwrap(), parse(&short).unwrap());
    assert_eq!(parse(&short).unwrap().as_i128(), Some(-(1i128 << 100)));
    let p = b"\x80\x02\x8a\x00.";
    assert_eq!(parse(p).unwrap(), i(0));
}
