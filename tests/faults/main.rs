//! Fault sweeps, SQLite style: a fixed script of a few hundred operations (mixed sizes, frees,
//! `record_stream` on other streams, a held stream so frees stay pending, `empty_cache`, bursts
//! that fill the device so remap and release-and-retry run) is first run without faults to count
//! the backend calls of each kind it makes; then, for every kind and every n up to that count, it
//! is run again with the n-th call of that kind failing once (`Trigger::Nth`) and failing from
//! then on (`Trigger::From`, removed after it has hit a few steps), with a generic driver error
//! and, for the calls that can run out of memory, an out-of-memory error.
//!
//! At every step a fault hits: nothing panics (each step runs under `catch_unwind`); the call
//! either returns an error that names the failed driver call (or out-of-memory) or succeeds by
//! another route; a failed `deallocate` changes nothing, a failed `allocate` changes nothing
//! unless it released cached memory under pressure (PyTorch's retry: then live allocations and
//! their stats are untouched and nothing more is reserved), a failed `empty_cache` may have done
//! part of its work but no more; the allocator's invariants hold and the backend holds exactly
//! what the allocator accounts for. With the fault removed the same allocator finishes the
//! script, gives everything back on `empty_cache`, still fits 3/4 of the device, and after
//! teardown the backend holds no handle, mapping, reservation or event.
//!
//! Targets, each printing one summary line (cases, faults injected, errors returned, steps that
//! succeeded another way): the expandable allocator with `ExpandableConfig::default()` and with
//! `ExpandableConfig::pytorch_expandable()`, and the classic allocator, on a 256 MiB Sim device; then a
//! shorter sweep on the Host backend where every allocation carries an id-derived pattern,
//! checked before each free, after every faulted step and at the end.
//!
//! Sizes: `VMM_FAULT_SWEEP_OPS` (default 300) is the Sim script's length; the Host script is a
//! quarter of it. `VMM_FAULT_SWEEP_OPS=2000 cargo test --release --test faults` is a long run.
//! `VMM_FAULT_SWEEP_CHECK_EVERY` (default 8) checks every invariant every that many steps after a
//! fault was removed, besides every faulted step (1 checks after every step).
//! `VMM_FAULT_SWEEP_LOG=FILE` appends every broken promise to FILE (a failing test shows 12).

mod classic_regressions;
mod expandable_bugs;
mod harness;
mod script;
mod sweep;
