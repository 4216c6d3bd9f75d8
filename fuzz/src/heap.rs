//! The process's heap, counted and capped: a reader that allocates without bound on a small input
//! must not take the machine down, and a cap is the only way to stop one allocation of a size read
//! from the input before it happens.
//!
//! Going over the cap makes the allocation fail, which aborts the process ("memory allocation of
//! N bytes failed"): stable Rust has no hook to turn that into an error. So the input being read
//! is kept in a file first ([`BlackBox`]): after such an abort that file is the reproducer.

use std::alloc::System;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use cap::Cap;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

/// Runs `f` with at most `budget` more heap bytes than are allocated now.
pub fn capped<T>(budget: usize, f: impl FnOnce() -> T) -> T {
    let _ = HEAP.set_limit(HEAP.allocated().saturating_add(budget));
    let out = f();
    let _ = HEAP.set_limit(usize::MAX);
    out
}

/// A file holding the input being read right now.
pub struct BlackBox {
    file: Option<File>,
    /// Where it is.
    pub path: PathBuf,
}

impl BlackBox {
    /// A file named after the campaign and this process in the temporary directory; without one
    /// (read-only disk) the campaign still runs, with nothing kept.
    pub fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("vmm-alloc-fuzz-{name}-{}.bin", std::process::id()));
        let file = File::create(&path).ok();
        Self { file, path }
    }

    /// Keeps `bytes` as the current input (two system calls: cheap next to any reader).
    pub fn keep(&self, bytes: &[u8]) {
        if let Some(f) = &self.file {
            let _ = f.set_len(bytes.len() as u64);
            let _ = f.write_all_at(bytes, 0);
        }
    }
}

impl Drop for BlackBox {
    /// The run ended normally: nothing to keep.
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
