//! Trace readers: the safe pickle reader (values, sharing, hostile input), the PyTorch snapshot
//! reader on synthetic snapshots, and its figures against `shared/tools/trace_summary.py` on every
//! real snapshot in `shared/traces/pytorch` (a visible skip when that folder is absent).

mod classic_faithfulness;
mod dump;
mod faithfulness;
mod json;
mod pickle_hostile;
mod pickle_values;
mod snapshot_synthetic;
mod writer;
