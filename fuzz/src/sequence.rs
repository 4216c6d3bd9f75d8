//! The case shape both allocator campaigns share: the settings of a run (backend, capacity,
//! configuration), then either a reference model's operations or the fault driver's, with the
//! minimizing and printing that depend only on that shape.

use std::fmt::Debug;
use std::time::Instant;

use crate::faults::{self, FOp};
use crate::runner::shorten;

/// The operations of one case.
#[derive(Clone, Debug)]
pub enum Ops<M> {
    /// A reference model's (`M` is its `Op`).
    Model(Vec<M>),
    /// The fault driver's.
    Faults(Vec<FOp>),
}

/// One case of an allocator campaign.
#[derive(Clone, Debug)]
pub struct Seq<S, M> {
    /// What the run is set up with.
    pub settings: S,
    /// What it does.
    pub ops: Ops<M>,
}

impl<S: Clone, M: Clone> Seq<S, M> {
    /// Shortens a failing case: runs of model operations deleted; fault sequences also have
    /// their random faults replaced by the explicit ones that matter ([`faults::minimize`]).
    pub fn minimize(self, fails: &dyn Fn(&Self) -> bool, deadline: Instant) -> Self {
        let settings = self.settings;
        let with = |ops: Ops<M>| Seq {
            settings: settings.clone(),
            ops,
        };
        match self.ops {
            Ops::Model(ops) => {
                let ops = shorten(ops, |o| fails(&with(Ops::Model(o.to_vec()))), deadline);
                with(Ops::Model(ops))
            }
            Ops::Faults(ops) => {
                let fewer = |o: &[FOp]| fails(&with(Ops::Faults(o.to_vec())));
                with(Ops::Faults(faults::minimize(ops, &fewer, deadline)))
            }
        }
    }
}

impl<S: Debug, M: Debug> Seq<S, M> {
    /// The settings, then the operations one per line, ready to paste into a test.
    pub fn show(&self) -> String {
        let (kind, ops): (&str, Vec<String>) = match &self.ops {
            Ops::Model(ops) => ("model", ops.iter().map(|o| format!("{o:?}")).collect()),
            Ops::Faults(ops) => ("faults", ops.iter().map(|o| format!("{o:?}")).collect()),
        };
        let mut out = format!("    {:?}\n    {} {kind} ops:", self.settings, ops.len());
        for op in ops {
            out.push_str(&format!("\n      {op},"));
        }
        out
    }
}
