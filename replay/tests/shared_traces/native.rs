//! The real PyTorch snapshots round-trip through the native format, which is far smaller than
//! the pickle.

use libtest_mimic::{Completion, Failed};
use vmm_replay::native::{read_native, write_native};

use crate::renumbering::same_up_to_renumbering;
use crate::{Shared, SharedTest};

/// The tests of this file.
pub const TESTS: &[(&str, SharedTest)] = &[(
    "native::round_trips_real_snapshots",
    round_trips_real_snapshots,
)];

fn round_trips_real_snapshots(shared: &Shared) -> Result<Completion, Failed> {
    let (mut pickles, mut natives, mut events) = (0, 0, 0);
    for path in shared.pickles("traces/pytorch")? {
        let bytes = std::fs::read(&path).unwrap();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("p");
        let traces = vmm_replay::snapshot::read_snapshot(&bytes, stem)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for t in traces {
            let native = write_native(&t);
            let back = read_native(&native, "n").unwrap();
            same_up_to_renumbering(&t, &back);
            assert_eq!(write_native(&back), native, "{}", t.name);
            println!(
                "{}: {} events, pickle {} B, native {} B ({:.2} B/event, 1/{:.0} of the pickle){}",
                t.name,
                t.events.len(),
                bytes.len(),
                native.len(),
                native.len() as f64 / t.events.len().max(1) as f64,
                bytes.len() as f64 / native.len() as f64,
                if back == t { "" } else { ", ids renumbered" }
            );
            (pickles, natives, events) = (
                pickles + bytes.len(),
                natives + native.len(),
                events + t.events.len(),
            );
        }
    }
    println!("all: {events} events, pickles {pickles} B, native {natives} B");
    Ok(Completion::Completed)
}
