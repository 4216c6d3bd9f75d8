//! The backend conformance suite: one set of cases, written once against the `Backend` trait and
//! run on every backend, so Sim, Host and Cuda are held to exactly the same contract.
//!
//! Each (backend, case) pair is a test named `<backend>::<case>`:
//! * `sim`, `host`: the defaults every user gets;
//! * `sim_64k`, `host_64k`: the common cases again at a 64 KiB granularity (and 2 devices on Sim),
//!   so nothing in the suite or the backends quietly assumes 2 MiB;
//! * `sim` and `cuda` alone: the address space exhausted (`address_space.rs`; not on Host, where
//!   it would starve the Host cases running beside it);
//! * `cuda`: device 0 when `CudaBackend::new(0)` succeeds. Without a usable GPU its tests are
//!   still listed, marked ignored, and one `SKIPPED ...` line says why;
//! * `cuda_init`: constructing the Cuda backend without a driver or device gives an error value
//!   (run everywhere; the no-driver case prints `SKIPPED:` where libcuda is present).
//!
//! Every case gets a fresh backend and must leave it holding nothing (`live().is_empty()`, and on
//! Host no resident pool memory); the harness checks that after each case.

#[macro_use]
mod support;
mod address_space;
mod bytes;
#[cfg(feature = "cuda")]
mod cuda_init;
mod emulated;
mod host_only;
mod lifecycle;
mod rules;
mod sim_only;

use std::sync::Mutex;

use libtest_mimic::{Arguments, Failed, Trial};
use vmm_alloc::backend::{HostBackend, HostConfig, SimBackend, SimConfig};
use vmm_alloc::BackendError;

use support::{Case, Subject, TestResult};

/// The cases every backend runs.
fn common<B: Subject>() -> Vec<Case<B>> {
    let mut cases = rules::cases();
    cases.extend(lifecycle::cases());
    cases
}

/// The common cases plus the ones for backends with real memory.
fn common_with_bytes<B: Subject>() -> Vec<Case<B>> {
    let mut cases = common();
    cases.extend(bytes::cases());
    cases
}

/// How to make the backend for one kind of trial, and what to check after each case.
struct Target<B> {
    prefix: &'static str,
    make: fn() -> Result<B, BackendError>,
    /// Runs after a case passed, on the same backend: anything it must have given back.
    after: fn(&B) -> TestResult,
    /// Cases of this target run one at a time (they share a device with global memory counters).
    serial: Option<&'static Mutex<()>>,
}

fn nothing_more<B>(_: &B) -> TestResult {
    Ok(())
}

fn register<B: Subject>(
    trials: &mut Vec<Trial>,
    target: &Target<B>,
    cases: Vec<Case<B>>,
    ignored: bool,
) {
    for case in cases {
        let (make, after, serial, prefix) =
            (target.make, target.after, target.serial, target.prefix);
        let run = case.run;
        let trial = Trial::test(format!("{prefix}::{}", case.name), move || {
            let _one_at_a_time =
                serial.map(|m| m.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
            let b = make()
                .map_err(|e| Failed::from(format!("could not create the {prefix} backend: {e}")))?;
            run(&b)?;
            let live = b.live();
            if !live.is_empty() {
                return Err(format!("the case passed but left the backend holding {live}").into());
            }
            after(&b)
        });
        trials.push(trial.with_ignored_flag(ignored));
    }
}

fn sim_64k() -> Result<SimBackend, BackendError> {
    SimBackend::with_config(SimConfig {
        granularity: 64 << 10,
        capacity: 1 << 30,
        devices: 2,
        ..SimConfig::default()
    })
}

fn host_64k() -> Result<HostBackend, BackendError> {
    HostBackend::with_config(HostConfig {
        granularity: 64 << 10,
        capacity: 1 << 30,
    })
}

/// On Host, a case that gave everything back also gave its memory back to the OS.
fn host_memory_returned(b: &HostBackend) -> TestResult {
    let resident = b
        .resident_pool_bytes()
        .map_err(|e| Failed::from(format!("resident_pool_bytes failed: {e}")))?;
    if resident != 0 {
        return Err(format!(
            "the case passed but {resident} bytes of the host pool are still resident"
        )
        .into());
    }
    Ok(())
}

fn sim_trials(trials: &mut Vec<Trial>) {
    let sim = Target {
        prefix: "sim",
        make: || Ok(SimBackend::new()),
        after: nothing_more,
        serial: None,
    };
    let mut cases = common::<SimBackend>();
    cases.extend(emulated::cases());
    cases.extend(sim_only::cases());
    cases.extend(address_space::cases());
    register(trials, &sim, cases, false);
    let small = Target {
        prefix: "sim_64k",
        make: sim_64k,
        after: nothing_more,
        serial: None,
    };
    register(trials, &small, common(), false);
}

fn host_trials(trials: &mut Vec<Trial>) {
    let host = Target {
        prefix: "host",
        make: HostBackend::new,
        after: host_memory_returned,
        serial: None,
    };
    let mut cases = common_with_bytes::<HostBackend>();
    cases.extend(emulated::cases());
    cases.extend(host_only::cases());
    register(trials, &host, cases, false);
    let small = Target {
        prefix: "host_64k",
        make: host_64k,
        after: host_memory_returned,
        serial: None,
    };
    register(trials, &small, common_with_bytes(), false);
}

/// Registers the Cuda trials; returns why they are skipped, if they are.
#[cfg(feature = "cuda")]
fn cuda_trials(trials: &mut Vec<Trial>) -> Option<String> {
    use vmm_alloc::CudaBackend;
    // Memory counters are device-wide: cases that read them must not overlap.
    static ONE_DEVICE: Mutex<()> = Mutex::new(());
    let cuda = Target {
        prefix: "cuda",
        make: || CudaBackend::new(0),
        after: nothing_more,
        serial: Some(&ONE_DEVICE),
    };
    let skipped = CudaBackend::new(0).err().map(|e| e.to_string());
    let mut cases = common_with_bytes();
    cases.extend(address_space::cases());
    register(trials, &cuda, cases, skipped.is_some());
    // Not ignored without a GPU: failing to construct is exactly what they test.
    trials.extend(cuda_init::trials());
    skipped
}

#[cfg(not(feature = "cuda"))]
fn cuda_trials(_: &mut Vec<Trial>) -> Option<String> {
    None
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    sim_trials(&mut trials);
    host_trials(&mut trials);
    let before_cuda = trials.len();
    let cuda_skipped = cuda_trials(&mut trials);
    if let Some(why) = cuda_skipped {
        let skipped = trials[before_cuda..]
            .iter()
            .filter(|t| !args.is_filtered_out(t) && args.is_ignored(t))
            .count();
        if skipped > 0 && !args.list {
            println!("SKIPPED {skipped} cuda conformance tests: {why}");
        }
    } else if cfg!(not(feature = "cuda")) && !args.list {
        println!("cuda conformance tests not built: the \"cuda\" feature is off");
    }
    libtest_mimic::run(&args, trials).exit();
}
