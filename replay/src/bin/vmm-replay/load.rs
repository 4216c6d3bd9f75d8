//! Which reader a file needs: our native format by its magic bytes, a PyTorch snapshot by its
//! pickle header, an RMM log by its CSV header.

use std::path::Path;

use vmm_replay::{native, rmm_csv, snapshot, Trace, TraceError};

/// Reads every device trace in `path`.
pub fn load(path: &Path) -> Result<Vec<Trace>, TraceError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TraceError {
        file: file.clone(),
        message: format!("cannot read: {e}"),
    })?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("trace")
        .to_string();
    let tag = |mut e: TraceError| {
        e.file = file.clone();
        e
    };
    if bytes.is_empty() {
        return Err(TraceError {
            file,
            message: "the file is empty: expected a PyTorch memory snapshot (pickle), an RMM log (CSV) or a vmm-alloc trace".into(),
        });
    }
    if bytes.starts_with(native::MAGIC) {
        return native::read_native(&bytes, &name)
            .map(|t| vec![t])
            .map_err(tag);
    }
    // Pickle protocol 2+ starts with PROTO (0x80); PyTorch writes protocol 4.
    if bytes.first() == Some(&0x80) {
        let traces = snapshot::read_snapshot(&bytes, &name).map_err(tag)?;
        if traces.is_empty() {
            return Err(TraceError {
                file,
                message: "the snapshot has no trace entries and no segments: nothing to replay (record with torch.cuda.memory._record_memory_history() before the dump)".into(),
            });
        }
        return Ok(traces);
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| TraceError {
        file: file.clone(),
        message: "not a PyTorch snapshot (pickle), an RMM log (CSV) or a vmm-alloc trace".into(),
    })?;
    rmm_csv::read_rmm_csv(text, &name)
        .map(|t| vec![t])
        .map_err(tag)
}
