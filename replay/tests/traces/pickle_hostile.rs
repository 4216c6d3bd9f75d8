//! Hostile pickles: every one is an error value, never a panic, a hang or a huge allocation.

use vmm_replay::pickle::parse;

use crate::pickle_values::PROTO4_SHARED;

#[test]
fn every_truncation_is_an_error() {
    for n in 0..PROTO4_SHARED.len() {
        let e = parse(&PROTO4_SHARED[..n]).expect_err("a truncated pickle must not parse");
        assert!(e.offset <= n, "{e} at prefix {n}");
    }
    assert!(parse(PROTO4_SHARED).is_ok());
}

#[test]
fn code_execution_opcodes_are_refused_by_name() {
    // pickle.dumps(os.system) style payloads.
    let global = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
    let e = parse(global).unwrap_err();
    assert!(e.to_string().contains("GLOBAL"), "{e}");
    assert_eq!(e.offset, 2);
    let stack_global = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02ls\x85R.";
    let e = parse(stack_global).unwrap_err();
    assert!(e.to_string().contains("STACK_GLOBAL"), "{e}");
    assert_eq!(e.offset, 14);
    let reduce = b"\x80\x02N)R.";
    let e = parse(reduce).unwrap_err();
    assert!(e.to_string().contains("REDUCE"), "{e}");
    for (op, name) in [
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
    ] {
        let p = [0x80, 2, b'N', b'N', op, 0, 0, 0, 0, b'.'];
        let e = parse(&p).unwrap_err();
        assert!(e.to_string().contains(name), "{name}: {e}");
        assert_eq!(e.offset, 4, "{name}: {e}");
    }
}

#[test]
fn unknown_and_unsupported_opcodes_are_errors() {
    let e = parse(b"\x80\x02\xff.").unwrap_err();
    assert!(e.to_string().contains("unknown opcode"), "{e}");
    assert!(e.to_string().contains("0xff"), "{e}");
    let e = parse(b"\x80\x04\x8f.").unwrap_err();
    assert!(e.to_string().contains("EMPTY_SET"), "{e}");
    let e = parse(b"\x80\x06N.").unwrap_err();
    assert!(e.to_string().contains("protocol 6"), "{e}");
}

#[test]
fn huge_claimed_lengths_are_errors() {
    let n = (1u64 << 60).to_le_bytes();
    for op in [0x8d_u8, 0x8e, 0x96, 0x95] {
        let mut p = vec![0x80, 4, op];
        p.extend_from_slice(&n);
        p.extend_from_slice(b"abc.");
        let e = parse(&p).unwrap_err();
        assert!(e.to_string().contains("remain"), "{e}");
    }
    // BINUNICODE with a 4 GiB length on a 10-byte input.
    let e = parse(b"\x80\x02X\xff\xff\xff\xffab.").unwrap_err();
    assert!(e.to_string().contains("BINUNICODE"), "{e}");
    // LONG4 of 2^31 - 1 bytes.
    let e = parse(b"\x80\x02\x8b\xff\xff\xff\x7f\x00.").unwrap_err();
    assert!(e.to_string().contains("LONG4"), "{e}");
}

#[test]
fn deep_nesting_is_an_error() {
    // 100,000 MARK + EMPTY_LIST.
    let mut p = b"\x80\x02".to_vec();
    for _ in 0..100_000 {
        p.extend_from_slice(b"(]");
    }
    p.push(b'.');
    let e = parse(&p).unwrap_err();
    assert!(e.to_string().contains("deeper"), "{e}");
    // 100,000 lists nested with APPEND only (no MARK): caught when the tree is built.
    let mut p = b"\x80\x02".to_vec();
    p.extend(std::iter::repeat_n(b']', 100_000));
    p.extend(std::iter::repeat_n(b'a', 99_999));
    p.push(b'.');
    let e = parse(&p).unwrap_err();
    assert!(e.to_string().contains("deeper"), "{e}");
}

#[test]
fn self_reference_and_stack_misuse_are_errors() {
    // l = []; l.append(l)
    let e = parse(b"\x80\x02]q\x00h\x00a.").unwrap_err();
    assert!(e.to_string().contains("holds itself"), "{e}");
    for (p, what) in [
        (&b"\x80\x02."[..], "underflow"),
        (b"\x80\x02Na.", "underflow"),
        (b"\x80\x02K\x01K\x02a.", "int"),
        (b"\x80\x02)K\x01a.", "append to a list"),
        (b"\x80\x02]K\x01K\x02s.", "dict"),
        (b"\x80\x02e.", "MARK"),
        (b"\x80\x02h\x05.", "memo key 5"),
        (b"\x80\x02(K\x01d.", "odd"),
        (b"\x80\x02\x94.", "underflow"),
    ] {
        let e = parse(p).unwrap_err();
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
}

#[test]
fn random_corruptions_never_panic() {
    // Deterministic xorshift: flip bytes of a valid pickle and parse the result.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let mut p = PROTO4_SHARED.to_vec();
        for _ in 0..1 + next() % 4 {
            let at = (next() % p.len() as u64) as usize;
            p[at] = next() as u8;
        }
        let _ = parse(&p);
    }
}

#[test]
fn shared_structure_comparison_is_bounded() {
    // A_k = (A_{k-1}, A_{k-1}), 80 levels: a 2^80-leaf tree in 400 bytes, built twice without
    // sharing between the two; comparing them must give up quickly instead of walking 2^80 leaves.
    let mut p = b"\x80\x02".to_vec();
    for key in [0u8, 1] {
        p.extend_from_slice(b"K\x01");
        for _ in 0..80 {
            p.extend_from_slice(&[b'q', key, b'h', key, 0x86]);
        }
    }
    p.extend_from_slice(b"\x86.");
    let v = parse(&p).unwrap();
    let pair = v.as_seq().unwrap();
    let t = std::time::Instant::now();
    assert!(!pair[0].same_as(&pair[1]), "gives up: not proven equal");
    assert!(pair[0].same_as(&pair[0]), "shared: equal at once");
    assert!(t.elapsed().as_secs() < 5);
}
