//! The rules at the C boundary: no panic crosses it (each call runs under `catch_unwind` and a
//! panic becomes an error code), and the text of the last error is kept per thread for
//! `vmm_alloc_last_error`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const OK: i32 = 0;
/// A generic failure: the last error says what.
pub const E_FAILED: i32 = 1;
/// Out of memory: the last error is the report.
pub const E_OOM: i32 = 2;
/// An argument is invalid (a pointer we did not allocate, a bad device, a bad string).
pub const E_INVALID: i32 = 3;
/// A panic inside the library: a bug, reported instead of unwinding into the caller.
pub const E_PANIC: i32 = 4;

/// An error at the boundary: its code and its message.
#[derive(Debug)]
pub struct CallError {
    /// One of the `E_*` codes.
    pub code: i32,
    /// What happened and what to do.
    pub message: String,
}

impl CallError {
    /// A failure with `code`.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (interior NULs replaced).
pub fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// This thread's last error: valid until this thread's next failing call.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs `f`, turning an error or a panic into a code and this thread's last error.
pub fn guard(f: impl FnOnce() -> Result<(), CallError>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => OK,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.code
        }
        Err(panic) => {
            set_last_error(&panic_message(&*panic));
            E_PANIC
        }
    }
}

/// Runs `f` for a call that returns a value and cannot report an error code: a failure or panic
/// gives `fallback` and sets the last error.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> Result<T, CallError>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            fallback
        }
        Err(panic) => {
            set_last_error(&panic_message(&*panic));
            fallback
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("vmm_alloc internal error (a bug, please report it): {what}")
}
