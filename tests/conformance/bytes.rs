//! Cases for backends with real memory (capability BYTES: Host, Cuda): what is written through a
//! mapping is what every mapping of the same handle reads, and moving bytes where no readable or
//! writable mapping is fails cleanly instead of crashing.

use vmm_alloc::backend::{Access, Capabilities, Protection};
use vmm_alloc::{BackendErrorKind as E, DevAddr};

use crate::support::{
    addr, expect_bytes, map_whole, pattern, rw, unmap_whole, Case, Subject, TestResult,
};

pub fn cases<B: Subject>() -> Vec<Case<B>> {
    cases![
        bytes_written_read_back,
        alias_mappings_share_bytes,
        alias_keeps_bytes_after_other_unmapped,
        remapped_handle_keeps_bytes,
        write_spans_adjacent_mappings,
        no_access_until_set_access,
        read_only_access_refuses_writes,
        bytes_outside_mappings_rejected,
    ]
}

fn bytes_written_read_back<B: Subject>(b: &B) -> TestResult {
    let m = map_whole(b, 2)?;
    let first = pattern(4096, 1);
    let last = pattern(100, 2);
    let odd = pattern(33, 3);
    ok!(b.write(m.va.start, &first));
    ok!(b.write(addr(m.va, m.len - last.len()), &last));
    ok!(b.write(addr(m.va, b.granularity() + 7), &odd));
    expect_bytes(b, m.va.start, &first, "first 4 KiB")?;
    expect_bytes(
        b,
        addr(m.va, m.len - last.len()),
        &last,
        "last bytes of the mapping",
    )?;
    expect_bytes(b, addr(m.va, b.granularity() + 7), &odd, "unaligned write")?;
    // A read from the middle of a written range.
    expect_bytes(
        b,
        addr(m.va, 1000),
        &first[1000..1100],
        "middle of the first write",
    )?;
    unmap_whole(b, m)
}

/// Maps one handle at `va` and `va + g`, read-write.
fn two_aliases<B: Subject>(
    b: &B,
) -> Result<(vmm_alloc::VaRange, vmm_alloc::backend::PhysHandle), libtest_mimic::Failed> {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    ok!(b.map(addr(va, g), g, h, 0));
    ok!(b.set_access(va.start, 2 * g, &rw(b)));
    Ok((va, h))
}

fn alias_mappings_share_bytes<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let (va, h) = two_aliases(b)?;
    let one = pattern(200, 4);
    ok!(b.write(addr(va, 100), &one));
    expect_bytes(
        b,
        addr(va, g + 100),
        &one,
        "written via the first alias, read via the second",
    )?;
    let two = pattern(300, 5);
    ok!(b.write(addr(va, g + g - 300), &two));
    expect_bytes(
        b,
        addr(va, g - 300),
        &two,
        "written via the second alias, read via the first",
    )?;
    ok!(b.unmap(va.start, 2 * g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn alias_keeps_bytes_after_other_unmapped<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let (va, h) = two_aliases(b)?;
    let data = pattern(512, 6);
    ok!(b.write(addr(va, 4096), &data));
    ok!(b.unmap(va.start, g));
    ok!(b.release(h));
    expect_bytes(
        b,
        addr(va, g + 4096),
        &data,
        "surviving alias after unmap + release",
    )?;
    let more = pattern(64, 7);
    ok!(b.write(addr(va, g), &more));
    expect_bytes(b, addr(va, g), &more, "write through the surviving alias")?;
    ok!(b.unmap(addr(va, g), g));
    ensure_eq!(
        b.live().physical_bytes,
        0,
        "physical bytes after the last alias went"
    );
    ok!(b.free_reservation(va));
    Ok(())
}

fn remapped_handle_keeps_bytes<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(2 * g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    ok!(b.set_access(va.start, g, &rw(b)));
    let data = pattern(1024, 8);
    ok!(b.write(addr(va, g - 1024), &data));
    ok!(b.unmap(va.start, g));
    // A cached handle, mapped again elsewhere, still holds its bytes.
    ok!(b.map(addr(va, g), g, h, 0));
    ok!(b.set_access(addr(va, g), g, &rw(b)));
    expect_bytes(
        b,
        addr(va, 2 * g - 1024),
        &data,
        "handle unmapped and mapped again",
    )?;
    ok!(b.unmap(addr(va, g), g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn write_spans_adjacent_mappings<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(3 * g));
    let h1 = ok!(b.create(g));
    let h2 = ok!(b.create(g));
    let h3 = ok!(b.create(g));
    ok!(b.map(va.start, g, h1, 0));
    ok!(b.map(addr(va, g), g, h2, 0));
    ok!(b.map(addr(va, 2 * g), g, h3, 0));
    ok!(b.set_access(va.start, 2 * g, &rw(b)));
    let data = pattern(64, 14);
    ok!(b.write(addr(va, g - 32), &data));
    expect_bytes(b, addr(va, g - 32), &data, "across two handles")?;
    expect_bytes(
        b,
        addr(va, g - 32),
        &data[..32],
        "first half, in the first handle",
    )?;
    expect_bytes(
        b,
        addr(va, g),
        &data[32..],
        "second half, in the second handle",
    )?;
    // The third mapping has no access yet: a write running into it is refused at the seam.
    let seam = addr(va, 2 * g);
    rejects!(b, Write, b.write(addr(va, 2 * g - 8), &[1u8; 16]),
        E::NoAccess { addr: a, needed: "read-write" } if *a == seam);
    expect_bytes(b, addr(va, g - 32), &data, "bytes after a refused write")?;
    ok!(b.unmap(va.start, 3 * g));
    for h in [h1, h2, h3] {
        ok!(b.release(h));
    }
    ok!(b.free_reservation(va));
    Ok(())
}

fn no_access_until_set_access<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(g));
    let h = ok!(b.create(g));
    ok!(b.map(va.start, g, h, 0));
    rejects!(b, Write, b.write(va.start, &[1, 2, 3]),
        E::NoAccess { addr: a, needed: "read-write" } if *a == va.start);
    rejects!(b, Read, b.read(va.start, &mut [0u8; 3]),
        E::NoAccess { addr: a, needed: "read" } if *a == va.start);
    ok!(b.set_access(va.start, g, &rw(b)));
    let data = pattern(16, 15);
    ok!(b.write(addr(va, 8), &data));
    expect_bytes(b, addr(va, 8), &data, "after granting read-write")?;
    ok!(b.unmap(va.start, g));
    // A new mapping of the same handle starts without access again.
    ok!(b.map(va.start, g, h, 0));
    rejects!(
        b,
        Read,
        b.read(addr(va, 8), &mut [0u8; 16]),
        E::NoAccess { .. }
    );
    ok!(b.unmap(va.start, g));
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}

fn read_only_access_refuses_writes<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let gpu = b.capabilities().contains(Capabilities::GPU);
    let m = map_whole(b, 1)?;
    let data = pattern(32, 16);
    ok!(b.write(addr(m.va, 64), &data));
    let read_only = [Access {
        device: b.device(),
        protection: Protection::Read,
    }];
    match b.set_access(m.va.start, g, &read_only) {
        Ok(()) => {
            expect_bytes(b, addr(m.va, 64), &data, "through a read-only mapping")?;
            rejects!(
                b,
                Write,
                b.write(addr(m.va, 64), &[0u8; 32]),
                E::NoAccess {
                    needed: "read-write",
                    ..
                }
            );
            expect_bytes(b, addr(m.va, 64), &data, "after a refused write")?;
        }
        // The driver may not offer read-only device mappings; the failed call must change nothing.
        Err(e) if gpu && matches!(e.kind, E::Driver { .. }) => {
            expect_bytes(
                b,
                addr(m.va, 64),
                &data,
                "after a refused read-only set_access",
            )?;
        }
        Err(e) => return Err(format!("set_access(read-only) failed: {e}").into()),
    }
    ok!(b.set_access(m.va.start, g, &rw(b)));
    ok!(b.write(addr(m.va, 64), &[7u8; 4]));
    unmap_whole(b, m)
}

fn bytes_outside_mappings_rejected<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let va = ok!(b.reserve(3 * g));
    let h = ok!(b.create(g));
    let mapped = addr(va, g);
    ok!(b.map(mapped, g, h, 0));
    ok!(b.set_access(mapped, g, &rw(b)));
    // Reserved but unmapped, running off either end of the mapping, outside any reservation.
    let spots = [
        (va.start, 8),
        (addr(va, 2 * g), 8),
        (addr(va, 2 * g - 4), 8),
        (addr(va, g - 4), 8),
        (DevAddr::new(g as u64), 8),
    ];
    for (at, len) in spots {
        rejects!(b, Write, b.write(at, &vec![1u8; len]),
            E::PartialMapping { addr: a, len: l } if *a == at && *l == len);
        rejects!(b, Read, b.read(at, &mut vec![0u8; len]),
            E::PartialMapping { addr: a, len: l } if *a == at && *l == len);
    }
    ok!(b.unmap(mapped, g));
    rejects!(
        b,
        Read,
        b.read(mapped, &mut [0u8; 8]),
        E::PartialMapping { .. }
    );
    rejects!(
        b,
        Write,
        b.write(mapped, &[0u8; 8]),
        E::PartialMapping { .. }
    );
    ok!(b.release(h));
    ok!(b.free_reservation(va));
    Ok(())
}
