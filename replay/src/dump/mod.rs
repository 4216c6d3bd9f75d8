//! An allocator's history and final state from a replay, in PyTorch's memory-snapshot format
//! (`torch.cuda.memory._dump_snapshot`), so that pytorch.org/memory_viz draws it: set
//! [`ReplayOptions::record_history`](super::replay::ReplayOptions::record_history) and write
//! [`SnapshotDump::to_pickle`] to a `.pickle` file.
//!
//! What is written (`shared/reference/pytorch-allocator.md` §4.2):
//!
//! * `device_traces`: one list, device 0's. Each replayed allocation is an `alloc` entry (its
//!   address, the requested size, its stream); each free a `free_requested` then a
//!   `free_completed` (the replay frees at once: no stream waits on the memory); each failed
//!   allocation an `oom` entry (`device_free` in place of `addr`, size = the rounded request);
//!   each change of mapped memory a `segment_map` / `segment_unmap` per contiguous range that
//!   became mapped / unmapped, before the entry of the step that caused it, unmaps first (as
//!   PyTorch's allocator releases, then maps, then records the allocation). `time_us` is the
//!   index of the replayed event; `frames` is empty.
//! * `segments`: the state after the last event, one segment per contiguous *mapped* run of an
//!   expandable segment (`is_expandable=True`), sorted by address, with its blocks.
//! * `allocator_settings`: the policy's settings, with `expandable_segments=True`.
//!
//! ```
//! use vmm_replay::replay::{replay, Policy, ReplayOptions};
//! use vmm_replay::{snapshot::read_snapshot, workloads};
//! let trace = workloads::rmm_random(1, 8 << 20, 200);
//! let opts = ReplayOptions { record_history: true, ..ReplayOptions::default() };
//! let outcome = replay(&trace, Policy::Expandable, &opts).unwrap();
//! let bytes = outcome.history.as_ref().unwrap().to_pickle().unwrap();
//! // std::fs::write("replay.pickle", &bytes) and drop the file on pytorch.org/memory_viz.
//! let back = read_snapshot(&bytes, "replay").unwrap();
//! assert_eq!(back[0].peak_live_bytes(), outcome.peak_live_bytes);
//! ```
//!
//! What the format cannot say: a range unmapped and mapped again within one replayed event
//! does not appear (the entries give the net change); a remap of ours shows as unmaps and maps.
//! With no stack frames, readers guess whether a run of unmaps was an `empty_cache()` or an
//! allocation's release-and-retry ([`snapshot`](super::snapshot) Note [Release runs]), so a
//! trace read back from a dump has the same allocations and frees but not always the same
//! [`Event::EmptyCache`](super::Event::EmptyCache)s.
//!
//! # Note [Self-consistent dump]
//!
//! Tools rebuild the state at the start of the trace by undoing it from the dump's `segments`
//! (memory_viz does, and so does [`read_snapshot`](super::snapshot::read_snapshot)). A dump is
//! consistent when that gives an empty allocator: every block live at the end was allocated by an
//! entry, and the mapped bytes of `segments` are the sum of the `segment_map` minus
//! `segment_unmap` sizes. Both hold by construction: the replay starts from a fresh allocator,
//! records every step, and mapping entries are the differences between successive pictures of the
//! allocator's mapped memory, the last of which is the one `segments` draws.

mod build;
mod mapped;
pub mod pickle_writer;
pub(crate) mod recorder;

use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::snapshot::Snapshot;

use super::pickle::Value;
pub use pickle_writer::PickleWriteError;

/// What a trace entry records (PyTorch's `TraceEntry::Action`, the kinds a replay produces).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Action {
    /// A block was handed out (`alloc`).
    Alloc,
    /// The program freed a block (`free_requested`).
    FreeRequested,
    /// The block's memory is reusable (`free_completed`).
    FreeCompleted,
    /// Pages were mapped into an expandable segment (`segment_map`).
    SegmentMap,
    /// Pages were unmapped from an expandable segment (`segment_unmap`).
    SegmentUnmap,
    /// An allocation failed (`oom`).
    Oom,
}

impl Action {
    /// The name PyTorch's snapshots use.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// One entry of the history.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TraceEntry {
    /// What happened.
    pub action: Action,
    /// The block's (or mapped range's) first address; for [`Action::Oom`], the bytes free on the
    /// device (written as `device_free`, as PyTorch stores it in the same field).
    pub addr: u64,
    /// Bytes: requested for blocks, mapped or unmapped for segments, the rounded request for OOMs.
    pub size: u64,
    /// The stream (its raw value: the trace's stream number on Sim).
    pub stream: u64,
    /// When: the index of the replayed event that caused it (non-decreasing).
    pub time_us: u64,
}

/// A replay's history and final state, ready to write as a PyTorch memory snapshot.
#[derive(Clone, Debug)]
pub struct SnapshotDump {
    /// Every entry, in order.
    pub entries: Vec<TraceEntry>,
    /// The allocator's segments after the last event (expandable segments, unmapped holes
    /// included: the dump keeps only their mapped runs).
    pub final_state: Snapshot,
    /// The configuration the policy replayed with.
    pub config: ExpandableConfig,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string applied on top of it, if any.
    pub alloc_conf: Option<String>,
    /// The most bytes mapped at the end of any replayed event (PyTorch's peak reserved memory;
    /// read from the allocator's statistics, not from the entries).
    pub peak_mapped_bytes: u64,
}

impl SnapshotDump {
    /// The snapshot as a value: a dict with `segments`, `device_traces`, `allocator_settings`
    /// and `external_annotations` (empty).
    pub fn to_value(&self) -> Value {
        build::snapshot_value(self)
    }

    /// The snapshot as pickle bytes (protocol 4) that memory_viz and `pickle.load` read. Fails
    /// only on a `PYTORCH_CUDA_ALLOC_CONF` of 4 GiB or more.
    pub fn to_pickle(&self) -> Result<Vec<u8>, PickleWriteError> {
        pickle_writer::dumps(&self.to_value())
    }
}
