//! The address space runs out: the refusal the allocators' fallback relies on (Note [Address
//! space budget] in `src/expandable/growth.rs`). Reservations are taken, largest first, until one
//! of 1 GiB is refused; that refusal must be `AddressSpaceExhausted`
//! (`is_out_of_memory()`), not another error, and everything is given back.
//!
//! Run on Sim and on Cuda (where the driver's own refusal is what is checked), not on Host: it
//! takes nearly all of the process's addresses for a moment, and Host cases of other threads
//! would then fail to map (Cuda cases run one at a time).

use vmm_alloc::backend::BackendErrorKind as E;

use crate::support::{Case, Subject, TestResult};

pub fn cases<B: Subject>() -> Vec<Case<B>> {
    cases![exhausting_the_address_space_is_refused_as_out_of_memory]
}

fn exhausting_the_address_space_is_refused_as_out_of_memory<B: Subject>(b: &B) -> TestResult {
    let g = b.granularity();
    let mut held = Vec::new();
    let mut refusal = None;
    // Halving from 64 TiB to 1 GiB: at most a few reservations of each size, so about 40 calls
    // take all but less than 1 GiB of a 128 TiB space.
    let mut len: usize = 64 << 40;
    while len >= 1 << 30 {
        match b.reserve(len.next_multiple_of(g)) {
            Ok(va) => held.push(va),
            Err(e) => {
                refusal = Some(e);
                len /= 2;
            }
        }
        if held.len() > 100_000 {
            break; // never on a real space; keeps a broken backend from looping for ever
        }
    }
    let reserved: usize = held.iter().map(|v| v.len).sum();
    for va in held {
        ok!(b.free_reservation(va));
    }
    let Some(err) = refusal else {
        return Err(format!("no reservation was refused after {reserved} bytes").into());
    };
    ensure!(
        matches!(err.kind, E::AddressSpaceExhausted { .. }) && err.is_out_of_memory(),
        "the refusal after {reserved} bytes reserved must be AddressSpaceExhausted (out of memory), got {:?} (\"{err}\")",
        err.kind
    );
    ensure!(b.live().is_empty(), "after the cycle: {}", b.live());
    Ok(())
}
