#!/usr/bin/env bash
# GPU validation of the vmm_alloc Python package (needs a GPU, PyTorch >= 2.5 and an installed
# vmm_alloc: pip install vmm_alloc-*.whl, or pip install ./python). Runs a small transformer
# (STEPS steps, default 300, fixed seed) under PyTorch native, expandable_segments:True, vmm_alloc
# route A (install) and route B (pool), each in its own process, with fixed and then varying batch
# sizes; then an out-of-memory under each route; then the tools (tools.py: sleep and wake of 64 MiB
# of weights, a snapshot and a trace, CuPy through use_with_cupy). Prints a markdown section; exit
# code 1 on any failure (losses not identical to native, an error, an OOM without our report, a
# tool whose result is wrong).
set -euo pipefail
cd "$(dirname "$0")"
python3 -c "import vmm_alloc, torch; assert torch.cuda.is_available(), 'no GPU'" 
exec python3 run.py
