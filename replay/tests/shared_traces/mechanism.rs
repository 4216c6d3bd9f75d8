//! The honest count itself under test: this binary, run again against a shared folder that is
//! absent, then against one that exists but is empty, must report every shared test ignored
//! (with the reason), then every one failed. Never passed.

use std::process::Command;

use libtest_mimic::{Failed, Trial};

use crate::SHARED_OVERRIDE;

/// How many shared tests there are (every module's `TESTS`).
fn shared_tests() -> usize {
    crate::capacity::TESTS.len()
        + crate::classic::TESTS.len()
        + crate::cli::TESTS.len()
        + crate::dump_summary::TESTS.len()
        + crate::figures::TESTS.len()
        + crate::native::TESTS.len()
}

/// Runs this test binary with the shared folder at `dir`; its exit success, output and the
/// `(passed, failed, ignored)` of its summary line.
fn run_against(dir: &std::path::Path) -> Result<(bool, String, [usize; 3]), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let out = Command::new(exe)
        .env(SHARED_OVERRIDE, dir)
        .output()
        .map_err(|e| format!("running the shared_traces binary again: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text
        .lines()
        .find(|l| l.starts_with("test result:"))
        .ok_or_else(|| format!("no summary line in:\n{text}"))?;
    let count = |what: &str| -> Result<usize, Failed> {
        let before = summary
            .split(';')
            .find(|part| part.trim_end().ends_with(what))
            .ok_or_else(|| format!("no `{what}` in {summary:?}"))?;
        let n = before.trim_end().trim_end_matches(what).trim_end();
        let n = n.rsplit(' ').next().unwrap_or(n);
        n.parse()
            .map_err(|e| Failed::from(format!("{summary:?}: {e}")))
    };
    let counts = [count("passed")?, count("failed")?, count("ignored")?];
    Ok((out.status.success(), text, counts))
}

fn absent_is_ignored_present_but_empty_fails() -> Result<(), Failed> {
    let n = shared_tests();
    let tmp = std::env::temp_dir().join(format!(
        "vmm-replay-shared-mechanism-{}",
        std::process::id()
    ));
    let absent = tmp.join("absent");
    let empty = tmp.join("empty");
    std::fs::create_dir_all(&empty).map_err(|e| format!("{}: {e}", empty.display()))?;

    let (ok, text, counts) = run_against(&absent)?;
    if !ok || counts != [0, 0, n] || !text.contains("not found: the recorded traces") {
        return Err(format!(
            "absent shared folder: expected success with 0 passed, 0 failed, {n} ignored \
             (with the reason), got {counts:?}:\n{text}"
        )
        .into());
    }

    let (ok, text, counts) = run_against(&empty)?;
    let _ = std::fs::remove_dir_all(&tmp);
    // Each test fails on the first file it needs (the python ones before looking for python3).
    if ok || counts != [0, n, 0] {
        return Err(format!(
            "empty shared folder: expected failure with 0 passed, {n} failed, 0 ignored, got \
             {counts:?}:\n{text}"
        )
        .into());
    }
    Ok(())
}

/// The trial, run wherever this binary runs.
pub fn trial() -> Trial {
    Trial::test(
        "mechanism::absent_is_ignored_present_but_empty_fails",
        absent_is_ignored_present_but_empty_fails,
    )
}
