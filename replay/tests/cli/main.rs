//! `vmm-replay` as a user runs it: the binary, its output and its exit codes.

mod advise_conf;
mod bad_input;
mod check_classic;
mod outputs;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs `vmm-replay` with `args`.
fn vmm_replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmm-replay"))
        .args(args)
        .output()
        .expect("vmm-replay runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `vmm-replay --json` with `args`, insisting on success.
fn replay_json(args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let o = vmm_replay(&all);
    assert!(
        o.status.success(),
        "vmm-replay {all:?} failed: {}",
        stderr(&o)
    );
    serde_json::from_str(&stdout(&o)).expect("--json prints JSON")
}

/// A file `name` holding `bytes` in a directory of this test's own.
fn file(test: &str, name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vmm-replay-cli-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

const MIB: u64 = 1 << 20;

/// An RMM log: `(action, pointer, size, stream)` rows.
fn rmm_csv(rows: &[(&str, u64, u64, u64)]) -> Vec<u8> {
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for (i, (action, ptr, size, stream)) in rows.iter().enumerate() {
        text.push_str(&format!(
            "1,00:00:00:{i:06},{action},{ptr:#x},{size},{stream:#x}\n"
        ));
    }
    text.into_bytes()
}

/// 3 MiB and 5 MiB live together (8 MiB), the first freed, 1 MiB more: peak live 8 MiB.
fn small_log() -> Vec<u8> {
    rmm_csv(&[
        ("allocate", 0x1000_0000, 3 * MIB, 0),
        ("allocate", 0x2000_0000, 5 * MIB, 0),
        ("free", 0x1000_0000, 3 * MIB, 0),
        ("allocate", 0x3000_0000, MIB, 0),
        ("free", 0x2000_0000, 5 * MIB, 0),
        ("free", 0x3000_0000, MIB, 0),
    ])
}

/// The `allocators` array of the only trace in a JSON report, by allocator name.
fn allocator<'a>(report: &'a Value, trace: usize, name: &str) -> &'a Value {
    report["traces"][trace]["allocators"]
        .as_array()
        .expect("allocators array")
        .iter()
        .find(|a| a["allocator"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}
