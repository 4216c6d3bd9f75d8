#!/usr/bin/env bash
# CI test of scripts/gpu-validate.sh on a machine without a GPU (run by .ci/run): argument
# handling, the build phase (bundle complete, stripped, small), the cudarc example saying
# "no GPU" and exiting 0, and the report written for no GPU (exit 3) and for a GPU where every
# step fails (a stand-in nvidia-smi claims a device; exit 1, each failure in GPU.md).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
V="$ROOT/scripts/gpu-validate.sh"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fails=0
check() { # description, then a command that must succeed
    local what="$1"; shift
    if "$@"; then echo "ok     $what"; else echo "FAILED $what"; fails=$((fails + 1)); fi
}
exits() { # expected code, then the command
    local want="$1"; shift
    "$@" >"$TMP/last.log" 2>&1
    local got=$?
    ((got == want)) || { echo "       exit $got, wanted $want:"; sed 's/^/       /' "$TMP/last.log" | tail -n 15; }
    ((got == want))
}

check "unknown argument: usage, exit 2" exits 2 "$V" --bogus
check "--build without a directory: exit 2" exits 2 "$V" --build
check "--out with --build: exit 2" exits 2 "$V" --build "$TMP/x" --out "$TMP/y"
check "--run of a missing directory: exit 2" exits 2 "$V" --run "$TMP/missing"
mkdir -p "$TMP/empty"
check "--run of a directory that is no bundle: exit 2" exits 2 "$V" --run "$TMP/empty"

B="$TMP/bundle"
check "--build makes a bundle" exits 0 "$V" --build "$B"
for f in bin/conformance bin/cuda_buffer bin/cuda_pressure bin/gpu bin/cudarc_buffer cudarc_buffer.expected MANIFEST gpu-validate.sh; do
    check "bundle has $f" test -e "$B/$f"
done
size_kib="$(du -sk "$B" | cut -f1)"
check "bundle is well under 60 MiB ($((size_kib / 1024)) MiB)" test "$size_kib" -lt $((40 * 1024))
check "binaries are stripped" bash -c "! readelf -S '$B/bin/conformance' | grep -qE '\.debug_(info|line)'"
check "the bundled cudarc example says 'no GPU' and exits 0" \
    bash -c "'$B/bin/cudarc_buffer' | grep -q '^no GPU: ' && '$B/bin/cudarc_buffer' >/dev/null"

NOGPU="$TMP/nogpu-bin" FAKE="$TMP/fake-bin"
mkdir -p "$NOGPU" "$FAKE"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed: no devices were found" >&2\nexit 9\n' >"$NOGPU/nvidia-smi"
cat >"$FAKE/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
    *name,memory.total*) echo "Stand-in GPU, 81559 MiB" ;;
    *driver_version*) echo "580.00.00" ;;
    *) echo "| NVIDIA-SMI 580.00.00  Driver Version: 580.00.00  CUDA Version: 13.0 |" ;;
esac
SH
chmod +x "$NOGPU/nvidia-smi" "$FAKE/nvidia-smi"

check "--run without a GPU: exit 3" exits 3 env PATH="$NOGPU:$PATH" "$B/gpu-validate.sh" --run "$B" --out "$TMP/out1"
check "... and GPU.md says 'no GPU'" grep -q '\*\*no GPU\*\*' "$TMP/out1/GPU.md"
check "... and names the bundle's commit" grep -q '^commit ' "$TMP/out1/GPU.md"

check "--run where every GPU step fails: exit 1" exits 1 env PATH="$FAKE:$PATH" "$B/gpu-validate.sh" --run "$B" --out "$TMP/out2"
R="$TMP/out2/GPU.md"
check "... GPU.md names device, driver and CUDA version" \
    bash -c "grep -q 'device: Stand-in GPU' '$R' && grep -q 'driver: 580.00.00' '$R' && grep -q 'CUDA version (driver): 13.0' '$R'"
for step in "Cuda conformance suite" "DeviceBuffer GPU tests" "Pressure soak on the GPU" "cudarc example" "GPU benches"; do
    check "... reports '$step' as FAIL" grep -q "^| $step | FAIL |" "$R"
done
check "... reports the PyTorch checks as not present (no python/tests/gpu/run.sh)" \
    bash -c "[[ -x '$ROOT/python/tests/gpu/run.sh' ]] || grep -q '^| PyTorch GPU checks | not present |' '$R'"
check "... has a Failures section with the failing tests" \
    bash -c "grep -q '^## Failures' '$R' && grep -q 'cuda_buffer.log' '$R'"

# A step that passes keeps its log out of the Failures section even when the log says "error" (a
# test named so): the first GPU run listed two passing suites there.
P="$TMP/passing-bundle"
cp -r "$B" "$P"
printf '#!/bin/sh\necho "test buffer::reports_error_values ... ok"\necho "test result: ok. 1 passed; 0 failed"\n' >"$P/bin/cuda_buffer"
# A passing soak prints its run; the report carries its figures.
printf '#!/bin/sh\necho "SoakReport { served: 735, out_of_memory: 95, checked: 468, stats: MemoryStats { alias_rescues: 77 } }"\necho "test result: ok. 1 passed; 0 failed"\n' >"$P/bin/cuda_pressure"
check "--run where one step passes and the others fail: exit 1" exits 1 env PATH="$FAKE:$PATH" "$P/gpu-validate.sh" --run "$P" --out "$TMP/out3"
R="$TMP/out3/GPU.md"
check "... reports the passing step as PASS" grep -q '^| DeviceBuffer GPU tests | PASS |' "$R"
check "... and the soak's run in its row" \
    grep -q '^| Pressure soak on the GPU | PASS | ok. 1 passed; 0 failed; 735 requests served, 95 refused, 468 blocks checked, 77 alias rescues |' "$R"
check "... its Failures section names the failed steps and not the passing one" \
    bash -c "sed -n '/^## Failures/,\$p' '$R' | grep -q '^### Cuda conformance suite' &&
        ! sed -n '/^## Failures/,\$p' '$R' | grep -qE 'DeviceBuffer|cuda_buffer|Pressure soak'"

if ((fails)); then
    echo "test-gpu-validate: $fails check(s) FAILED"
    exit 1
fi
echo "test-gpu-validate: all checks passed"
