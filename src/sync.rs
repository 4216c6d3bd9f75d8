//! The lock behind both allocators' thread-safe front ends, swappable for loom's model.
//!
//! Normally `Mutex` is `parking_lot::Mutex`. Built with `RUSTFLAGS="--cfg loom"` it is a thin
//! wrapper over `loom::sync::Mutex` with parking_lot's API (`lock` returns the guard, `try_lock` an option, poisoning
//! is a panic); the front cache's atomics are loom's then too, so `tests/loom.rs` can explore every interleaving of threads calling one
//! allocator. The backends' own lock (`backend/checked.rs`) stays parking_lot's even then: it is
//! only taken for the length of one backend call, during which no loom operation runs, so no
//! schedule can ever find it held (see `tests/loom.rs`).

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32};

#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;
#[cfg(loom)]
pub(crate) use loom_mutex::Mutex;

#[cfg(loom)]
mod loom_mutex {
    /// `loom::sync::Mutex` with parking_lot's signatures.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().expect("allocator lock poisoned")
        }

        pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::WouldBlock) => None,
                Err(std::sync::TryLockError::Poisoned(_)) => panic!("allocator lock poisoned"),
            }
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().expect("allocator lock poisoned")
        }
    }
}
