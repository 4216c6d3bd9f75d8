//! The loop every campaign shares: cases drawn from a seeded proptest runner until the time is up,
//! each run with panics caught; the first failure is shrunk by proptest, then shortened further by
//! the campaign's own minimizer, and reported with its reproducer.

use std::cell::{Cell, RefCell};
use std::fmt::Debug;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use proptest::strategy::{BoxedStrategy, Strategy};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

/// What a campaign did, summed over its cases.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Cases run (sequences, inputs, strings), shrinking runs not counted.
    pub cases: u64,
    /// Allocator operations applied.
    pub ops: u64,
    /// Backend faults that fired.
    pub faults: u64,
    /// Reader or parser inputs fed.
    pub inputs: u64,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.cases += o.cases;
        self.ops += o.ops;
        self.faults += o.faults;
        self.inputs += o.inputs;
    }
}

/// A failing case, minimized.
pub struct Failure {
    /// What went wrong, on the minimized case.
    pub reason: String,
    /// The minimized case, printable.
    pub reproducer: String,
}

/// How a campaign ended.
pub struct Outcome {
    /// The campaign's name.
    pub name: &'static str,
    /// The seed its runner was built from.
    pub seed: u64,
    /// What it did.
    pub tally: Tally,
    /// Wall time, minimization included.
    pub seconds: f64,
    /// The first failure, if any (the campaign stops there).
    pub failure: Option<Failure>,
}

/// One kind of randomized campaign.
pub trait Campaign {
    /// One generated case.
    type Case: Clone + Debug;
    /// Its name on the command line.
    fn name(&self) -> &'static str;
    /// How cases are generated (and shrunk).
    fn strategy(&self) -> BoxedStrategy<Self::Case>;
    /// Runs one case, adding what it did to `tally`; `Err` says what property broke.
    fn run(&self, case: &Self::Case, tally: &mut Tally) -> Result<(), String>;
    /// Shortens a failing case beyond proptest's shrinking (which deletes each element of a
    /// sequence once, in order, and gives up on elements later ones depend on).
    fn minimize(
        &self,
        case: Self::Case,
        _fails: &dyn Fn(&Self::Case) -> bool,
        _deadline: Instant,
    ) -> Self::Case {
        case
    }
    /// The case as a reproducer a person can read and paste into a test.
    fn show(&self, case: &Self::Case) -> String;
}

thread_local! {
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f`, turning a panic into an error that says where and why. The panic hook installed by
/// [`run_campaign`] keeps panics quiet: shrinking re-runs a panicking case hundreds of times.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => Err(LAST_PANIC.with(|p| format!("panicked: {}", p.borrow()))),
    }
}

/// The runner's seed: the campaign's seed spread over ChaCha's 32 bytes, mixed with the
/// campaign's name so that `all` gives each campaign its own stream from one seed.
fn rng_for(seed: u64, name: &str) -> TestRng {
    let mut bytes = [0u8; 32];
    let mut x = seed
        ^ name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
    for chunk in bytes.chunks_mut(8) {
        // SplitMix64 steps: distinct, well-mixed words from one u64.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// Runs `campaign` for `seconds` from `seed`. Minimizing a failure may take up to two more
/// minutes (proptest's shrinking, then the campaign's own), so a long run's failure still comes
/// back short.
pub fn run_campaign<C: Campaign>(campaign: &C, seed: u64, seconds: f64) -> Outcome {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds.max(0.0));
    let config = Config {
        failure_persistence: None,
        max_shrink_iters: 1_000_000,
        max_shrink_time: 60_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng_for(seed, campaign.name()));
    let strategy = campaign.strategy();
    let tally = RefCell::new(Tally::default());
    let previous_hook = panic::take_hook();
    panic::set_hook(Box::new(|info| {
        LAST_PANIC.with(|p| *p.borrow_mut() = info.to_string());
    }));
    let mut failure = None;
    while Instant::now() < deadline {
        let tree = match strategy.new_tree(&mut runner) {
            Ok(t) => t,
            Err(reason) => {
                failure = Some(Failure {
                    reason: format!("could not generate a case: {reason}"),
                    reproducer: String::new(),
                });
                break;
            }
        };
        // Only the first run of a case counts; the runs while shrinking do not.
        let first = Cell::new(true);
        let result = runner.run_one(tree, |case| {
            let mut t = Tally::default();
            let r = guarded(|| campaign.run(&case, &mut t));
            if first.replace(false) {
                t.cases += 1;
                tally.borrow_mut().add(t);
            }
            r.map_err(TestCaseError::fail)
        });
        match result {
            Ok(_) => {}
            Err(TestError::Fail(_, case)) => {
                failure = Some(minimized(campaign, case));
                break;
            }
            Err(TestError::Abort(reason)) => {
                failure = Some(Failure {
                    reason: format!("runner aborted: {reason}"),
                    reproducer: String::new(),
                });
                break;
            }
        }
    }
    panic::set_hook(previous_hook);
    Outcome {
        name: campaign.name(),
        seed,
        tally: tally.into_inner(),
        seconds: start.elapsed().as_secs_f64(),
        failure,
    }
}

/// Shortens proptest's minimal case with the campaign's minimizer and says why it fails.
fn minimized<C: Campaign>(campaign: &C, case: C::Case) -> Failure {
    let fails = |c: &C::Case| guarded(|| campaign.run(c, &mut Tally::default())).is_err();
    let deadline = Instant::now() + Duration::from_secs(60);
    let case = campaign.minimize(case, &fails, deadline);
    let reason = guarded(|| campaign.run(&case, &mut Tally::default()))
        .err()
        .unwrap_or_else(|| "(the minimized case passed when run again: flaky?)".into());
    Failure {
        reason,
        reproducer: campaign.show(&case),
    }
}

/// The generic part of minimizing: deletes runs of items (halves down to single items) while the
/// case keeps failing, then single items again, until nothing more can go. `fails` rebuilds the
/// case around the shorter list.
pub fn shorten<T: Clone>(
    mut items: Vec<T>,
    fails: impl Fn(&[T]) -> bool,
    deadline: Instant,
) -> Vec<T> {
    let mut chunk = items.len().div_ceil(2).max(1);
    loop {
        let mut removed_any = false;
        let mut at = 0;
        while at < items.len() && Instant::now() < deadline {
            let end = (at + chunk).min(items.len());
            let mut fewer = items[..at].to_vec();
            fewer.extend_from_slice(&items[end..]);
            if fails(&fewer) {
                items = fewer;
                removed_any = true;
            } else {
                at += chunk;
            }
        }
        if Instant::now() >= deadline {
            return items;
        }
        if chunk > 1 {
            chunk /= 2;
        } else if !removed_any {
            return items;
        }
    }
}
