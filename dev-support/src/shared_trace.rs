//! The shared PyTorch trace the replay benches use (`replay.rs` on Sim, `gpu.rs` on Cuda).

use std::path::{Path, PathBuf};

use vmm_replay::snapshot::read_snapshot_file;
use vmm_replay::Trace;

/// The largest file in `$VMM_TRACES_DIR`, by default `../shared/traces/pytorch` of the source tree
/// (by size; its device with the most events), or why there is none. The variable lets a bench
/// binary copied to another machine (`scripts/gpu-validate.sh`) find the traces shipped with it.
pub fn largest() -> Result<Trace, String> {
    let dir = std::env::var_os("VMM_TRACES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/pytorch")
        });
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let largest: Option<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "pickle"))
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max();
    let (_, path) = largest.ok_or_else(|| format!("{}: no .pickle file", dir.display()))?;
    let traces = read_snapshot_file(&path).map_err(|e| format!("{}: {e:?}", path.display()))?;
    traces
        .into_iter()
        .max_by_key(|t| t.events.len())
        .ok_or_else(|| format!("{}: no device trace", path.display()))
}
