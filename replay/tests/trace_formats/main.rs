//! The trace readers and writers (RMM CSV, native) and the built-in workloads: exact results on
//! small inputs, errors (never panics) on bad and hostile ones, round trips, determinism and sanity.

mod address_order;
mod builtin_workloads;
mod claims;
mod goal_conflicts;
mod hostile;
mod mechanism_workloads;
mod native_format;
mod program_workloads;
mod rmm_csv_reader;

// Shared with tests/shared_traces, hence the path.
use vmm_dev_support::fixtures::renumbering;

use std::collections::HashMap;

use vmm_replay::native::{read_native, read_native_file, write_native, write_native_file};
use vmm_replay::rmm_csv::{parse_rmm_csv, read_rmm_csv, read_rmm_csv_file};
use vmm_replay::{workloads, Event, InitialBlock, Recorded, StartState, Trace, TraceError};

const GIB: u64 = 1 << 30;

fn alloc(id: u64, size: u64, stream: u64) -> Event {
    Event::Alloc { id, size, stream }
}

fn free(id: u64) -> Event {
    Event::Free { id }
}

fn block(id: u64, size: u64, stream: u64) -> InitialBlock {
    InitialBlock { id, size, stream }
}

fn message<T: std::fmt::Debug>(r: Result<T, TraceError>) -> String {
    r.unwrap_err().message
}

fn csv_err(text: &str) -> String {
    match read_rmm_csv(text, "t") {
        Ok(t) => panic!("expected an error, read {t:?}"),
        Err(e) => {
            assert_eq!(e.file, "t");
            e.message
        }
    }
}

fn temp_path(file: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "vmm-alloc-trace-formats-{}-{file}",
        std::process::id()
    ))
}
