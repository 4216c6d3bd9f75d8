//! Fault injection: fail the n-th call of a kind, every call from the n-th on, or calls at random
//! with a seed. Installed on a Sim or Host backend by a test; an injected failure leaves the
//! backend's state unchanged, exactly like a real failure.

// Built without the `testkit` feature, nothing can install a plan: every backend keeps the empty
// one, and the builders are unused.
#![cfg_attr(not(feature = "testkit"), allow(dead_code))]

use crate::backend::{CallKind, CallKinds};

/// Spreads a seed over all 64 bits (SplitMix64's finalizer), so that nearby seeds give unrelated
/// streams; never returns 0, which would make xorshift emit zeros forever.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).max(1)
}

/// The error an injected fault produces.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FaultError {
    /// A generic driver failure ([`crate::BackendErrorKind::Injected`]).
    Injected,
    /// Out of memory, as `cuMemCreate` reports when the device is full.
    OutOfMemory,
}

/// When a fault fires, counting calls of its kind from the moment the plan was installed
/// (the first call is number 1).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Trigger {
    /// Only the n-th call fails (a transient fault).
    Nth(u64),
    /// The n-th call and every later one fail (a persistent fault).
    From(u64),
}

#[derive(Clone, Debug)]
struct Rule {
    kind: CallKind,
    trigger: Trigger,
    error: FaultError,
}

#[derive(Clone, Debug)]
struct RandomFaults {
    state: u64,
    /// Fires when a draw in `0..2^32` falls below this.
    threshold: u64,
    kinds: CallKinds,
    error: FaultError,
}

/// A set of faults to inject. Build it, then install it with `EmulatedBackend::set_faults` (feature `testkit`) on a Sim or Host backend.
///
/// ```
/// use vmm_alloc::backend::CallKind;
/// use vmm_alloc::testkit::{FaultError, FaultPlan, Trigger};
/// let plan = FaultPlan::new()
///     .fail(CallKind::Create, Trigger::Nth(3), FaultError::OutOfMemory)
///     .fail(CallKind::Map, Trigger::From(10), FaultError::Injected);
/// # let _ = plan;
/// ```
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    rules: Vec<Rule>,
    random: Option<RandomFaults>,
    seen: [u64; CallKind::COUNT],
    fired: u64,
}

impl FaultPlan {
    /// A plan that injects nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule: calls of `kind` selected by `trigger` fail with `error`.
    pub fn fail(mut self, kind: CallKind, trigger: Trigger, error: FaultError) -> Self {
        self.rules.push(Rule {
            kind,
            trigger,
            error,
        });
        self
    }

    /// Also fails each call whose kind is in `kinds` with probability `probability` (clamped to
    /// 0..=1), drawn from a generator seeded with `seed`: the same seed and the same call sequence
    /// fail the same calls.
    pub fn random(
        mut self,
        seed: u64,
        probability: f64,
        kinds: CallKinds,
        error: FaultError,
    ) -> Self {
        let p = if probability.is_nan() {
            0.0
        } else {
            probability.clamp(0.0, 1.0)
        };
        self.random = Some(RandomFaults {
            state: splitmix64(seed),
            threshold: (p * (1u64 << 32) as f64) as u64,
            kinds,
            error,
        });
        self
    }

    /// How many faults this plan has injected so far.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// Counts a call of `kind` and says whether (and how) it must fail.
    pub(crate) fn on_call(&mut self, kind: CallKind) -> Option<FaultError> {
        let n = {
            let seen = &mut self.seen[kind.index()];
            *seen += 1;
            *seen
        };
        let mut verdict = self.rules.iter().find_map(|r| {
            let hit = r.kind == kind
                && match r.trigger {
                    Trigger::Nth(k) => n == k,
                    Trigger::From(k) => n >= k,
                };
            hit.then_some(r.error)
        });
        if let Some(random) = self.random.as_mut().filter(|r| r.kinds.has(kind)) {
            // xorshift64*: small, seedable, good enough to pick calls.
            let mut x = random.state;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            random.state = x;
            let draw = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32;
            if verdict.is_none() && draw < random.threshold {
                verdict = Some(random.error);
            }
        }
        if verdict.is_some() {
            self.fired += 1;
        }
        verdict
    }
}
