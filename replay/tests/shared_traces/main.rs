//! Every test that reads the shared folder `../shared` beside the repository (the recorded
//! PyTorch snapshots in `traces/pytorch`, the independent reader `tools/trace_summary.py`).
//!
//! The count is honest (issue 16, item 6): where `../shared` exists (CI, the lead's machine) each
//! test runs, and fails when a file it needs is missing; where it does not (a fresh clone) each
//! test is reported *ignored*, with the reason, never passed. A test that needs `python3` and
//! finds none is ignored with that reason too. `mechanism::absent_is_ignored_present_but_empty_fails`
//! re-runs this binary against an absent and an empty shared folder to hold that to account.

mod capacity;
mod classic;
mod cli;
mod dump_summary;
mod figures;
mod json;
mod mechanism;
mod native;

// Shared with tests/traces and tests/trace_formats, hence the paths.
use vmm_dev_support::fixtures::{pressure, renumbering};

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// Overrides where the shared folder is. Set only by [`mechanism`]'s test, on the copies of this
/// binary it runs; every other run finds the folder beside the repository.
pub const SHARED_OVERRIDE: &str = "VMM_REPLAY_TEST_SHARED_DIR";

/// The shared folder: `<repository root>/../shared`, unless overridden (see [`SHARED_OVERRIDE`]).
fn shared_root() -> PathBuf {
    match std::env::var_os(SHARED_OVERRIDE) {
        Some(dir) => PathBuf::from(dir),
        // CARGO_MANIFEST_DIR is <repository root>/replay.
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// What a test gets: the shared folder, which exists.
pub struct Shared(PathBuf);

impl Shared {
    /// `rel` inside the shared folder (it may be missing: the test then fails on it).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    /// The `.pickle` files directly in `rel`, sorted; an error when the folder is unreadable or
    /// holds none.
    pub fn pickles(&self, rel: &str) -> Result<Vec<PathBuf>, Failed> {
        let dir = self.path(rel);
        let rd = std::fs::read_dir(&dir).map_err(|e| {
            Failed::from(format!(
                "{} exists but {} is not readable: {e}",
                self.0.display(),
                dir.display()
            ))
        })?;
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(format!("no .pickle file in {}", dir.display()).into());
        }
        Ok(files)
    }

    /// `tools/trace_summary.py` and a `python3` to run it; `Ignored` when there is no python3,
    /// an error when the tool is missing.
    pub fn trace_summary(&self) -> Result<Result<PathBuf, Completion>, Failed> {
        let tool = self.path("tools/trace_summary.py");
        if !tool.is_file() {
            return Err(format!("{} not found", tool.display()).into());
        }
        Ok(match Command::new("python3").arg("--version").output() {
            Ok(o) if o.status.success() => Ok(tool),
            _ => Err(Completion::ignored_with(
                "python3 is not available to run trace_summary.py",
            )),
        })
    }
}

/// A test of the shared folder: `Ok(Completed)` passed, `Ok(Ignored)` could not run its subject
/// on this machine (no python3), `Err` or a panic failed.
pub type SharedTest = fn(&Shared) -> Result<Completion, Failed>;

/// The trial `name` running `test`: ignored with the reason when the shared folder is absent.
fn shared_trial(name: &str, test: SharedTest) -> Trial {
    Trial::ignorable_test(name, move || {
        let root = shared_root();
        if !root.is_dir() {
            return Ok(Completion::ignored_with(format!(
                "{} not found: the recorded traces and trace_summary.py live there",
                root.display()
            )));
        }
        test(&Shared(root))
    })
}

fn main() {
    let args = Arguments::from_args();
    let mut trials: Vec<Trial> = [
        capacity::TESTS,
        classic::TESTS,
        cli::TESTS,
        dump_summary::TESTS,
        figures::TESTS,
        native::TESTS,
    ]
    .into_iter()
    .flatten()
    .map(|&(name, test)| shared_trial(name, test))
    .collect();
    // The mechanism's own test needs no shared folder, and is not run by the runs it starts.
    if std::env::var_os(SHARED_OVERRIDE).is_none() {
        trials.push(mechanism::trial());
    }
    libtest_mimic::run(&args, trials).exit();
}
