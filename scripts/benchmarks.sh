#!/usr/bin/env bash
# Regenerates BENCHMARKS.md with one command: runs every bench (`cargo bench`: hot_path, churn,
# replay, growth, threads, buffer, gpu; the GPU one prints "gpu benches SKIPPED: ..." without a
# GPU), then writes the report from the results (replay/examples/bench_report/). `cargo bench` from
# the root runs the benches of the library (hot_path, growth, threads, buffer) and of replay/
# (churn, replay, gpu), which need traces.
#
#   scripts/benchmarks.sh                 # benchmark everything, then write BENCHMARKS.md
#   scripts/benchmarks.sh --report-only   # write BENCHMARKS.md from the last run's results
#   scripts/benchmarks.sh -- ARGS...      # ARGS go to every bench (e.g. --measurement-time 1)
#
# Results live in $CARGO_TARGET_DIR (default target/): criterion/ and bench-extra/. A full run
# deletes both first, so no result of an earlier run (or of a bench that was renamed or skipped
# this time) is reported as new; this also drops criterion's saved baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"

if [[ "${1:-}" == "--report-only" ]]; then
    shift
else
    rm -rf "$target/criterion" "$target/bench-extra"
    cargo bench "$@"
fi
exec cargo run --release --quiet --example bench_report -- \
    --target "$target" --command "scripts/benchmarks.sh"
