//! Trace readers: the safe pickle reader (values, sharing, hostile input), the PyTorch snapshot
//! reader on synthetic snapshots, and replays dumped as snapshots. What reads `../shared` (the
//! real snapshots, `trace_summary.py`) is in `tests/shared_traces`.

mod dump;
mod pickle_hostile;
mod pickle_values;
mod recorded_mallocs;
mod release_runs;
mod snapshot_claims;
mod snapshot_synthetic;
mod writer;

// Shared with tests/shared_traces, hence the path.
use vmm_dev_support::fixtures::pressure;
