//! Constructing the Cuda backend where it cannot work: no driver library, or a device that does
//! not exist. These run on every machine (they are not `cuda::` trials, which need a GPU), and
//! must see an error value, never a panic: cudarc itself panics when libcuda is missing.

use std::panic::{catch_unwind, AssertUnwindSafe};

use libtest_mimic::{Failed, Trial};
use vmm_alloc::backend::CallKind;
use vmm_alloc::{BackendError, BackendErrorKind as E, CudaBackend};

/// The trials, named `cuda_init::<case>`.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "cuda_init::new_without_driver_is_a_no_device_error",
            new_without_driver_is_a_no_device_error,
        ),
        Trial::test(
            "cuda_init::new_with_missing_ordinal_is_an_error",
            new_with_missing_ordinal_is_an_error,
        ),
    ]
}

/// `CudaBackend::new(ordinal)`, which must return rather than panic, and must fail.
fn new_must_fail(ordinal: usize) -> Result<BackendError, Failed> {
    match catch_unwind(AssertUnwindSafe(|| CudaBackend::new(ordinal))) {
        Err(_) => Err(format!(
            "CudaBackend::new({ordinal}) panicked instead of returning an error"
        )
        .into()),
        Ok(Ok(_)) => Err(format!(
            "CudaBackend::new({ordinal}) succeeded, but that device cannot exist"
        )
        .into()),
        Ok(Err(e)) => Ok(e),
    }
}

/// Fails unless `err` is a constructor error of the no-device kind.
fn ensure_no_device(err: &BackendError, what: &str) -> Result<String, Failed> {
    ensure_eq!(err.op, CallKind::Init, "op of the error of {what}");
    let E::NoDevice(why) = &err.kind else {
        return Err(format!(
            "{what}: expected a NoDevice error, got {:?} (\"{err}\")",
            err.kind
        )
        .into());
    };
    Ok(why.clone())
}

fn new_without_driver_is_a_no_device_error() -> Result<(), Failed> {
    if CudaBackend::driver_present() {
        println!(
            "SKIPPED: cuda_init::new_without_driver_is_a_no_device_error: libcuda is present on \
             this machine, so the no-driver path cannot be exercised here"
        );
        return Ok(());
    }
    let err = new_must_fail(0)?;
    let why = ensure_no_device(&err, "CudaBackend::new(0) without libcuda")?;
    ensure!(
        why.contains("libcuda"),
        "the error of CudaBackend::new(0) without libcuda does not say libcuda is missing: \"{err}\""
    );
    // Every later attempt fails the same way (cudarc would panic again on each call).
    let again = new_must_fail(0)?;
    ensure_eq!(again, err, "the error of a second CudaBackend::new(0)");
    Ok(())
}

fn new_with_missing_ordinal_is_an_error() -> Result<(), Failed> {
    let has_device_0 = matches!(catch_unwind(|| CudaBackend::new(0).is_ok()), Ok(true));
    for ordinal in [9999, usize::MAX] {
        let what = format!("CudaBackend::new({ordinal})");
        let err = new_must_fail(ordinal)?;
        let why = ensure_no_device(&err, &what)?;
        // With a device 0, the error names the device asked for; without a driver, it says
        // libcuda is missing (a driver with no device at all has its own message).
        let named = if !CudaBackend::driver_present() {
            "libcuda".to_string()
        } else if has_device_0 {
            ordinal.to_string()
        } else {
            String::new()
        };
        ensure!(
            why.contains(&named),
            "the error of {what} does not mention \"{named}\": \"{err}\""
        );
    }
    Ok(())
}
