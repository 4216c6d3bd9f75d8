//! Trace recording and snapshot dumps: the only module that uses `vmm_replay` (the
//! readers, writers and pickle encoder), so it is the one place to repoint when they move.
//!
//! While recording is on, every allocation, free, `empty_cache` and out-of-memory of a device is
//! kept twice: as a [`Trace`] (`vmm-replay` replays the file written by [`write_trace`]) and as
//! PyTorch trace entries (`device_traces` of the snapshot [`dump_snapshot`] writes, which
//! pytorch.org/memory_viz draws). Recording starts warm: the blocks live at the start become the
//! trace's initial blocks, so their frees are matched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use vmm_alloc::config::ExpandableConfig;
use vmm_alloc::snapshot::{BlockState, Snapshot};
use vmm_alloc::{Allocation, DevAddr};
use vmm_replay::dump::{Action, SnapshotDump, TraceEntry};
use vmm_replay::native::write_native_file;
use vmm_replay::{Event, InitialBlock, StartState, Trace};

/// One device's recording.
struct DeviceRecord {
    initial: Vec<InitialBlock>,
    events: Vec<Event>,
    entries: Vec<TraceEntry>,
    /// Live blocks by address: (id, requested size, stream).
    live: HashMap<u64, (u64, u64, u64)>,
    next_id: u64,
    skipped_frees: u64,
    max_entries: usize,
    started: Instant,
}

impl DeviceRecord {
    fn new(state: &Snapshot, max_entries: usize) -> Self {
        let mut r = Self {
            initial: Vec::new(),
            events: Vec::new(),
            entries: Vec::new(),
            live: HashMap::new(),
            next_id: 0,
            skipped_frees: 0,
            max_entries,
            started: Instant::now(),
        };
        for seg in &state.segments {
            for b in &seg.blocks {
                if b.state == BlockState::ActiveAllocated {
                    let id = r.take_id();
                    let (size, stream) = (b.requested_size as u64, seg.stream.raw());
                    r.initial.push(InitialBlock { id, size, stream });
                    r.live.insert(b.address.get(), (id, size, stream));
                }
            }
        }
        r
    }

    fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    fn entry(&mut self, action: Action, addr: u64, size: u64, stream: u64) {
        if self.entries.len() >= self.max_entries {
            // A ring buffer, as PyTorch's `max_entries`: the oldest entries go.
            let drop = self.entries.len() + 1 - self.max_entries;
            self.entries.drain(..drop.min(self.entries.len()));
        }
        let time_us = self.started.elapsed().as_micros() as u64;
        self.entries.push(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
        });
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static RECORDS: Mutex<Option<HashMap<u32, DeviceRecord>>> = Mutex::new(None);

/// Whether recording is on (one relaxed load: the hot path's only cost when it is off).
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Starts recording (dropping what an earlier recording kept); `states` are the devices open
/// now, whose live blocks become the initial blocks. Devices opened later start empty.
pub fn start(states: Vec<(u32, Snapshot)>, max_entries: usize) {
    let mut records = RECORDS.lock();
    let map = records.insert(HashMap::new());
    for (device, state) in states {
        map.insert(device, DeviceRecord::new(&state, max_entries.max(1)));
    }
    ACTIVE.store(true, Ordering::SeqCst);
}

/// Stops recording; what was recorded stays available to write until the next start.
pub fn stop() {
    ACTIVE.store(false, Ordering::SeqCst);
}

fn with_device(device: u32, f: impl FnOnce(&mut DeviceRecord)) {
    let mut records = RECORDS.lock();
    if !active() {
        return;
    }
    if let Some(map) = records.as_mut() {
        let max = map
            .values()
            .map(|r| r.max_entries)
            .max()
            .unwrap_or(usize::MAX);
        f(map
            .entry(device)
            .or_insert_with(|| DeviceRecord::new(&Snapshot::default(), max)));
    }
}

/// Records an allocation.
pub fn on_alloc(device: u32, a: &Allocation) {
    with_device(device, |r| {
        let (size, stream) = (a.requested() as u64, a.stream().raw());
        let id = r.take_id();
        r.events.push(Event::Alloc { id, size, stream });
        r.live.insert(a.ptr().get(), (id, size, stream));
        r.entry(Action::Alloc, a.ptr().get(), size, stream);
    });
}

/// Records a free of `ptr` (after it succeeded).
pub fn on_free(device: u32, ptr: DevAddr) {
    with_device(device, |r| match r.live.remove(&ptr.get()) {
        Some((id, size, stream)) => {
            r.events.push(Event::Free { id });
            r.entry(Action::FreeRequested, ptr.get(), size, stream);
            r.entry(Action::FreeCompleted, ptr.get(), size, stream);
        }
        None => r.skipped_frees += 1,
    });
}

/// Records an out-of-memory failure of a `size`-byte request with `device_free` bytes free.
pub fn on_oom(device: u32, size: u64, stream: u64, device_free: u64) {
    with_device(device, |r| r.entry(Action::Oom, device_free, size, stream));
}

/// Records an `empty_cache` call.
pub fn on_empty_cache(device: u32) {
    with_device(device, |r| r.events.push(Event::EmptyCache));
}

/// Writes device `device`'s recorded trace in `vmm-replay`'s native format.
pub fn write_trace(device: u32, path: &str, alloc_conf: Option<String>) -> Result<(), String> {
    let records = RECORDS.lock();
    let r = records
        .as_ref()
        .and_then(|m| m.get(&device))
        .ok_or_else(|| {
            format!("vmm_alloc: nothing recorded on device {device}: call record_memory_history() first")
        })?;
    let trace = Trace {
        name: format!("vmm_alloc-device{device}"),
        initial: r.initial.clone(),
        events: r.events.clone(),
        start: if r.initial.is_empty() {
            StartState::Empty
        } else {
            StartState::Warm
        },
        skipped_frees: r.skipped_frees,
        recorded: None,
        alloc_conf,
        skipped: Default::default(),
    };
    write_native_file(path, &trace).map_err(|e| e.to_string())
}

/// Writes a PyTorch memory snapshot of `state` (with the recorded entries of `device`, if any)
/// to `path` as a pickle memory_viz opens.
pub fn dump_snapshot(
    device: u32,
    path: &str,
    state: Snapshot,
    config: ExpandableConfig,
    alloc_conf: Option<String>,
    peak_reserved: u64,
) -> Result<(), String> {
    let entries = RECORDS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&device))
        .map(|r| r.entries.clone())
        .unwrap_or_default();
    let dump = SnapshotDump {
        entries,
        final_state: state,
        config,
        alloc_conf,
        peak_mapped_bytes: peak_reserved,
    };
    let bytes = dump.to_pickle().map_err(|e| e.to_string())?;
    std::fs::write(path, bytes).map_err(|e| format!("vmm_alloc: cannot write {path}: {e}"))
}
