#!/usr/bin/env bash
# Does vmm-alloc build beside the rest of the CUDA Rust ecosystem? (issue 17, part 1)
#
# `cargo check`s, all in one shared target dir (target/ecosystem), no CUDA needed:
#   1. vmm-alloc alone, with no CUDA version asked for (cudarc's fallback);
#   2. for each CUDA version cudarc 0.19 knows, a small crate made in a temp dir that depends on
#      vmm-alloc by path and picks that version with its own cudarc line, the one documented way
#      (README, "From Rust with cudarc": vmm-alloc has no version features; cargo unifies);
#   3. such crates that depend on cudarc the way real users do
#      (cudarc's defaults + a version, candle's `dynamic-linking` +
#      `cuda-version-from-build-system`, a linked build with a pinned version, the 13.2+
#      `CUmemLocation` union), and hand a `CudaStream` of their cudarc to our `DeviceBuffer`, so
#      both name the same cudarc.
# Usage: scripts/check-ecosystem.sh [--quick]   (--quick: one 12.x and one 13.2+ version in step 2)
# Exit code: 0 when every build passes; 1 otherwise, after a summary naming each failure.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/ecosystem"
VERSIONS=(12000 12010 12020 12030 12040 12050 12060 12080 12090 13000 13010 13020 13030 13040)
[[ "${1:-}" == "--quick" ]] && VERSIONS=(12080 13020)
[[ $# -gt 0 && "$1" != "--quick" ]] && { echo "usage: $0 [--quick]" >&2; exit 2; }
CUDARC="0.19.10"
failures=()

run() { # name, then the command
    local name="$1"; shift
    local log; log="$(mktemp)"
    local start=$SECONDS
    if "$@" >"$log" 2>&1; then
        echo "ok     $name ($((SECONDS - start)) s)"
    else
        echo "FAILED $name"; tail -n 25 "$log" | sed 's/^/       /'
        failures+=("$name")
    fi
    rm -f "$log"
}

cd "$ROOT"
run "vmm-alloc, no CUDA-version feature (cudarc's fallback)" \
    cargo check --lib --no-default-features --features cuda --target-dir "$TARGET"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
user_crate() { # name, cudarc dependency spec
    local dir="$WORK/$1"
    mkdir -p "$dir/src"
    cat >"$dir/Cargo.toml" <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
vmm-alloc = { path = "$ROOT", default-features = false, features = ["cuda"] }
cudarc = $2

[workspace]
TOML
    cat >"$dir/src/lib.rs" <<'RS'
//! A user's crate: its own cudarc and vmm-alloc's buffers in the same calls.
use std::sync::Arc;

pub fn zeros(
    memory: &Arc<vmm_alloc::CudaMemory>,
    stream: &Arc<cudarc::driver::CudaStream>,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let mut buf = memory.alloc::<f32>(16, stream)?;
    stream.memset_zeros(&mut buf)?;
    Ok(stream.clone_dtoh(&buf)?)
}
RS
    cp "$ROOT/Cargo.lock" "$dir/Cargo.lock" # same versions as ours: no resolution, no download
    run "user crate $1: cudarc = $2" \
        cargo check --manifest-path "$dir/Cargo.toml" --target-dir "$TARGET"
}
for v in "${VERSIONS[@]}"; do
    user_crate "picks-$v" "{ version = \"$CUDARC\", default-features = false, features = [\"std\", \"driver\", \"cuda-$v\"] }"
done
user_crate plain-defaults-12080 "{ version = \"$CUDARC\", features = [\"cuda-12080\"] }"
user_crate plain-defaults-13000 "{ version = \"$CUDARC\", features = [\"cuda-13000\"] }"
user_crate union-13020 "{ version = \"$CUDARC\", default-features = false, features = [\"std\", \"driver\", \"dynamic-loading\", \"cuda-13020\"] }"
user_crate candle-like "{ version = \"$CUDARC\", default-features = false, features = [\"std\", \"cublas\", \"cublaslt\", \"curand\", \"driver\", \"nvrtc\", \"cuda-version-from-build-system\", \"dynamic-linking\"] }"
user_crate burn-like "{ version = \"$CUDARC\", default-features = false, features = [\"std\", \"driver\", \"nvrtc\", \"fallback-dynamic-loading\", \"cuda-version-from-build-system\", \"fallback-latest\"] }"
user_crate linked-12060 "{ version = \"$CUDARC\", default-features = false, features = [\"std\", \"driver\", \"dynamic-linking\", \"cuda-12060\"] }"

if ((${#failures[@]})); then
    echo "check-ecosystem: ${#failures[@]} build(s) FAILED: ${failures[*]}"
    exit 1
fi
echo "check-ecosystem: every build passed"
