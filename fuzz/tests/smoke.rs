//! CI's short versions of the campaigns: each runs a few seconds through the same binary and
//! command a long run uses, from a fixed seed, and must pass and print its figures.

use std::process::Command;

/// Runs `campaign ARGS` and returns its output, failing the test with it on a non-zero exit.
fn campaign(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_campaign"))
        .args(args)
        .output()
        .expect("the campaign binary runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "campaign {args:?} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The figures line of `name`: "NAME: seed S, C cases, O ops, F faults injected, I inputs, ...".
fn figures(text: &str, name: &str) -> [u64; 4] {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}: seed")))
        .unwrap_or_else(|| panic!("no figures for {name} in:\n{text}"));
    let n = |what: &str| -> u64 {
        let before = line.split(&format!(" {what}")).next().expect("a figure");
        let word = before.rsplit(' ').next().expect("a number");
        word.parse().unwrap_or_else(|_| panic!("{what} in {line}"))
    };
    [n("cases"), n("ops"), n("faults"), n("inputs")]
}

#[test]
fn expandable_smoke() {
    let out = campaign(&["expandable", "--seconds", "6", "--seed", "1"]);
    let [cases, ops, faults, _] = figures(&out, "expandable");
    assert!(cases > 10 && ops > 1000 && faults > 10, "{out}");
}

#[test]
fn classic_smoke() {
    let out = campaign(&["classic", "--seconds", "5", "--seed", "2"]);
    let [cases, ops, faults, _] = figures(&out, "classic");
    assert!(cases > 10 && ops > 1000 && faults > 10, "{out}");
}

#[test]
fn readers_smoke() {
    let out = campaign(&["readers", "--seconds", "4", "--seed", "3"]);
    let [_, _, _, inputs] = figures(&out, "readers");
    assert!(inputs > 1000, "{out}");
}

#[test]
fn config_smoke() {
    let out = campaign(&["config", "--seconds", "2", "--seed", "4"]);
    let [_, _, _, inputs] = figures(&out, "config");
    assert!(inputs > 1000, "{out}");
}

/// `all` splits its time across the four and reports each.
#[test]
fn all_runs_every_campaign() {
    let out = campaign(&["all", "--seconds", "4", "--seed", "5"]);
    for name in ["expandable", "classic", "readers", "config"] {
        figures(&out, name);
    }
}

#[test]
fn bad_arguments_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_campaign"))
        .args(["nonsense", "--seconds", "1"])
        .output()
        .expect("the campaign binary runs");
    assert_eq!(out.status.code(), Some(2));
}
