//! `campaign`: long randomized campaigns against vmm-alloc, on stable Rust, one command each.
//!
//! ```text
//! campaign expandable|classic|readers|config|all [--seconds N] [--seed S]
//! campaign check-input FILE
//! ```
//!
//! Each campaign draws cases from a proptest runner seeded with `--seed` (printed; drawn from the
//! clock when absent) until `--seconds` are spent, stops at its first failure, shrinks it to a
//! short reproducer, prints it, and exits with status 1. `all` splits the seconds across the four.
//! `check-input FILE` runs every trace reader on one file (a reproducer kept by `readers`).

mod classic;
mod config;
mod expandable;
mod faults;
mod heap;
mod readers;
mod runner;
mod sequence;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use runner::{run_campaign, Outcome};

const USAGE: &str =
    "usage: campaign <expandable|classic|readers|config|all> [--seconds N] [--seed S]
       campaign check-input FILE";

/// The share of `all`'s time each campaign gets: the allocator campaigns find the most per
/// second spent (long sequences, three backends, faults), the parsers saturate sooner.
const SHARES: [(&str, f64); 4] = [
    ("expandable", 0.35),
    ("classic", 0.30),
    ("readers", 0.20),
    ("config", 0.15),
];

struct Args {
    what: String,
    seconds: f64,
    seed: Option<u64>,
    file: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let what = it.next().ok_or("no campaign given")?;
    let mut args = Args {
        what,
        seconds: 60.0,
        seed: None,
        file: None,
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--seconds" => {
                let v = value("--seconds")?;
                args.seconds = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or(format!("--seconds: not a number of seconds: {v}"))?;
            }
            "--seed" => {
                let v = value("--seed")?;
                args.seed = Some(v.parse().map_err(|_| format!("--seed: not a u64: {v}"))?);
            }
            other if args.what == "check-input" && args.file.is_none() => {
                args.file = Some(other.to_string())
            }
            other => return Err(format!("unexpected argument {other}")),
        }
    }
    Ok(args)
}

fn run_one(name: &str, seed: u64, seconds: f64) -> Option<Outcome> {
    Some(match name {
        "expandable" => run_campaign(&expandable::Expandable, seed, seconds),
        "classic" => run_campaign(&classic::Classic, seed, seconds),
        "readers" => run_campaign(&readers::Readers::new(), seed, seconds),
        "config" => run_campaign(&config::ConfigStrings::new(), seed, seconds),
        _ => return None,
    })
}

/// Prints a campaign's figures and, on failure, its reproducer; true if it passed.
fn report(o: &Outcome) -> bool {
    let t = o.tally;
    println!(
        "{}: seed {}, {} cases, {} ops, {} faults injected, {} inputs, {:.1} s: {}",
        o.name,
        o.seed,
        t.cases,
        t.ops,
        t.faults,
        t.inputs,
        o.seconds,
        if o.failure.is_some() { "FAILED" } else { "ok" }
    );
    if let Some(f) = &o.failure {
        println!("  failure: {}", f.reason);
        println!("  minimized reproducer:\n{}", f.reproducer);
        println!(
            "  rerun: cargo run --release -p vmm-alloc-fuzz -- {} --seed {} --seconds {:.0}",
            o.name,
            o.seed,
            o.seconds.ceil()
        );
    }
    o.failure.is_none()
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("campaign: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.what == "check-input" {
        return match args.file.as_deref().map(readers::check_file) {
            Some(Ok(summary)) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Some(Err(e)) => {
                println!("FAILED: {e}");
                ExitCode::FAILURE
            }
            None => {
                eprintln!("campaign: check-input needs a FILE\n{USAGE}");
                ExitCode::from(2)
            }
        };
    }
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("seed {seed} (rerun with --seed {seed})");
    let plan: Vec<(&str, f64)> = if args.what == "all" {
        SHARES
            .iter()
            .map(|&(n, share)| (n, args.seconds * share))
            .collect()
    } else {
        vec![(args.what.as_str(), args.seconds)]
    };
    let mut ok = true;
    for (name, seconds) in plan {
        let Some(outcome) = run_one(name, seed, seconds) else {
            eprintln!("campaign: unknown campaign {name}\n{USAGE}");
            return ExitCode::from(2);
        };
        // A failure in one campaign does not stop the others: a long run reports them all.
        ok &= report(&outcome);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
