#!/usr/bin/env bash
# One command that validates everything of vmm-alloc that needs a GPU, and writes GPU.md.
#
#   scripts/gpu-validate.sh --build DIR          on a machine with cargo (no GPU needed): build the
#                                                test, example and bench binaries, copy them
#                                                (stripped) with a MANIFEST, the expected example
#                                                output and the largest shared trace into DIR
#   scripts/gpu-validate.sh --run DIR [--out O]  on the GPU machine (no Rust, no network needed):
#                                                run the bundle, write O/GPU.md (O defaults to DIR/out)
#   scripts/gpu-validate.sh [--out O]            both, on a machine with cargo and a GPU
#
# What runs: the Cuda conformance suite (`conformance --include-ignored cuda`), the DeviceBuffer
# GPU tests (`cuda_buffer --include-ignored`), the pressure soak with kernels in flight
# (`cuda_pressure --include-ignored`), the cudarc example against
# examples/cudarc_buffer.expected, python/tests/gpu/run.sh when the Python package provides it (else
# "not present"), and last the GPU benches (benches/gpu.rs, criterion --quick: growth per GiB vs the
# raw driver loop, hot path vs cuMemAllocAsync, churn, replay of the largest shared trace, and last
# 1 and 2 threads on two streams, with the ratio in bench-extra/gpu.json's `threads`).
#
# VMM_CUDA_VERSION=13000 (say) builds with cudarc's `cuda-13000` bindings (`--features
# cudarc/cuda-13000`, the command-line form of a user's own cudarc line) instead of cudarc's
# fallback (nvcc's version, else 13.4), e.g. if a driver older than the bindings lacks a symbol.
#
# Exit codes: 0 everything passed; 1 a step failed (GPU.md says which and why); 2 bad arguments or
# a broken bundle; 3 no GPU here (GPU.md says so; nothing was run).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH_TIMEOUT="${VMM_BENCH_TIMEOUT:-420}" # seconds for the GPU benches
STEP_TIMEOUT="${VMM_STEP_TIMEOUT:-300}"   # seconds for each other step
PYTHON_TIMEOUT="${VMM_PYTHON_TIMEOUT:-600}" # seconds for the PyTorch checks (10 training runs; an
                                            # H200 took 135 s for STEPS=120, so ~5 min for 300)

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# ---------------------------------------------------------------------------------------- build
# The executable cargo built for target `name`, from its JSON messages (jq, else python3).
artifact() {
    if command -v jq >/dev/null; then
        jq -r --arg n "$2" 'select(.reason == "compiler-artifact" and .target.name == $n
            and .executable != null) | .executable' "$1" | tail -n 1
    else
        python3 -c 'import json, sys
exes = [m["executable"] for m in map(json.loads, open(sys.argv[1]))
        if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[2]
        and m.get("executable")]
print(exes[-1] if exes else "")' "$1" "$2"
    fi
}

build() {
    local dir="$1"
    command -v cargo >/dev/null || { echo "gpu-validate: --build needs cargo" >&2; exit 2; }
    mkdir -p "$dir/bin" "$dir/traces/pytorch" || exit 2
    cd "$ROOT" || exit 2
    local json features=()
    json="$(mktemp)"
    [[ -n "${VMM_CUDA_VERSION:-}" ]] && features=(--features "cudarc/cuda-$VMM_CUDA_VERSION")
    echo "gpu-validate: building (cargo, release)..."
    if ! cargo test --release --no-run --message-format=json-render-diagnostics "${features[@]}" \
        --test conformance --test cuda_buffer --test cuda_pressure >"$json" ||
        ! cargo bench --no-run --message-format=json-render-diagnostics "${features[@]}" \
            --bench gpu >>"$json" ||
        ! cargo build --release --message-format=json-render-diagnostics "${features[@]}" \
            --example cudarc_buffer >>"$json" ||
        ! cargo build --release -p vmm-alloc-capi >/dev/null; then
        echo "gpu-validate: the build failed" >&2
        rm -f "$json"
        exit 1
    fi
    # Each binary's path, from cargo's own record of what it built.
    local name exe
    for name in conformance cuda_buffer cuda_pressure gpu cudarc_buffer; do
        exe="$(artifact "$json" "$name")"
        if [[ -z "$exe" || ! -x "$exe" ]]; then
            echo "gpu-validate: cargo built no binary named $name" >&2
            rm -f "$json"
            exit 1
        fi
        cp "$exe" "$dir/bin/$name" && strip "$dir/bin/$name" || exit 1
    done
    rm -f "$json"
    cp "$ROOT/examples/cudarc_buffer.expected" "$dir/" || exit 1
    local traces="${VMM_TRACES_DIR:-$ROOT/../shared/traces/pytorch}" largest=""
    if [[ -d "$traces" ]]; then
        largest="$(ls -S "$traces"/*.pickle 2>/dev/null | head -n 1)"
        [[ -n "$largest" ]] && cp "$largest" "$dir/traces/pytorch/"
    fi
    if [[ -x "$ROOT/python/tests/gpu/run.sh" ]]; then
        # The package as pip would install it: the libraries cargo just built beside its modules
        # (the GPU machine has no Rust to build them; run_bundle puts python/ on PYTHONPATH).
        rm -rf "$dir/python" && cp -r "$ROOT/python" "$dir/python" || exit 1
        rm -rf "$dir/python/build" "$dir"/python/*.egg-info # a local pip build's leftovers
        cp "$ROOT/target/release/libvmm_alloc_capi.so" "$ROOT/target/release/libvmm_alloc_torch.so" \
            "$dir/python/vmm_alloc/" || exit 1
        strip "$dir"/python/vmm_alloc/*.so || exit 1
    fi
    cp "$0" "$dir/gpu-validate.sh"
    {
        echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
        echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm), $(rustc --version 2>/dev/null), CUDA bindings: ${VMM_CUDA_VERSION:-cudarc fallback (nvcc, else 13.4)}"
        if [[ -n "$largest" ]]; then
            echo "trace $(basename "$largest")"
        else
            echo "trace none (no shared traces on the build machine: gpu_replay replays a built-in workload only)"
        fi
        (cd "$dir" && find bin -type f -exec sha256sum {} + | sort -k 2)
    } >"$dir/MANIFEST"
    echo "gpu-validate: bundle in $dir ($(du -sh "$dir" | cut -f1)); run it with: $dir/gpu-validate.sh --run $dir"
}

# ------------------------------------------------------------------------------------------ run
# Each step's name, status, details and its log (the Failures section shows the logs of the failed
# steps only: a passing suite's log may well contain "error" in a test's name).
declare -a STEP_NAMES=() STEP_STATUS=() STEP_DETAIL=() STEP_LOG=()
record() { STEP_NAMES+=("$1"); STEP_STATUS+=("$2"); STEP_DETAIL+=("$3"); STEP_LOG+=("${4:-}"); }

# The libtest summary of a log ("N passed; M failed; ..."), or its last line.
summary_of() {
    local sum soak rescues
    sum="$(grep -E '^test result:' "$1" | tail -n 1 | sed 's/^test result: //')"
    # The pressure soak prints its run (tests/common/pressure_soak.rs): what it did goes in too.
    soak="$(grep -oE 'SoakReport \{ served: [0-9]+, out_of_memory: [0-9]+, checked: [0-9]+' "$1" | tail -n 1 |
        sed -E 's/SoakReport \{ served: ([0-9]+), out_of_memory: ([0-9]+), checked: ([0-9]+)/\1 requests served, \2 refused, \3 blocks checked/')"
    rescues="$(grep -oE 'alias_rescues: [0-9]+' "$1" | tail -n 1 | sed 's/alias_rescues: //')"
    [[ -n "$soak" && -n "$rescues" ]] && soak="$soak, $rescues alias rescues"
    echo "$sum${soak:+; $soak}"
}

test_step() { # name, log name, command...
    local name="$1" log="$OUT/logs/$2.log"
    shift 2
    timeout "$STEP_TIMEOUT" "$@" >"$log" 2>&1
    local rc=$? sum
    sum="$(summary_of "$log")"
    if ((rc == 0)) && [[ -n "$sum" ]]; then
        record "$name" PASS "$sum"
    else
        local failed
        failed="$(grep -E '^test .* FAILED$|^---- ' "$log" | head -n 8 | tr '\n' ';')"
        ((rc == 124)) && failed="timed out after ${STEP_TIMEOUT}s; $failed"
        record "$name" FAIL "exit $rc; ${sum:-no summary}; $failed see logs/$(basename "$log")" "$log"
    fi
}

run_bundle() {
    local dir="$1"
    for f in bin/conformance bin/cuda_buffer bin/cuda_pressure bin/gpu bin/cudarc_buffer cudarc_buffer.expected MANIFEST; do
        [[ -e "$dir/$f" ]] || { echo "gpu-validate: $dir is not a bundle (no $f); make one with --build" >&2; exit 2; }
    done
    mkdir -p "$OUT/logs" || exit 2
    local device="" driver="" cuda=""
    if command -v nvidia-smi >/dev/null && device="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)" && [[ -n "$device" ]]; then
        driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
        cuda="$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -n 1 | sed 's/CUDA Version: //')"
    else
        write_report "$dir" "no GPU" "" ""
        echo "gpu-validate: no GPU here (nvidia-smi finds none); nothing was run. Report: $OUT/GPU.md"
        exit 3
    fi

    test_step "Cuda conformance suite" conformance "$dir/bin/conformance" --include-ignored cuda
    test_step "DeviceBuffer GPU tests" cuda_buffer "$dir/bin/cuda_buffer" --include-ignored --test-threads=1
    test_step "Pressure soak on the GPU" cuda_pressure "$dir/bin/cuda_pressure" --include-ignored --nocapture

    local log="$OUT/logs/cudarc_example.log"
    timeout "$STEP_TIMEOUT" "$dir/bin/cudarc_buffer" >"$log" 2>"$OUT/logs/cudarc_example.stderr"
    local rc=$?
    if ((rc == 0)) && diff -u "$dir/cudarc_buffer.expected" "$log" >"$OUT/logs/cudarc_example.diff"; then
        record "cudarc example" PASS "output equals cudarc_buffer.expected"
    else
        record "cudarc example" FAIL "exit $rc; output differs from the expected: $(head -n 12 "$OUT/logs/cudarc_example.diff" | tr '\n' ';')" \
            "$OUT/logs/cudarc_example.stderr"
    fi

    # The PyTorch checks before the benches: correctness first, so a bench that runs long (and a
    # caller's overall timeout) cannot cost them.
    if [[ -x "$dir/python/tests/gpu/run.sh" ]]; then
        log="$OUT/logs/python_gpu.log"
        VMM_BUNDLE="$dir" PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}" \
            timeout "$PYTHON_TIMEOUT" "$dir/python/tests/gpu/run.sh" >"$log" 2>&1
        rc=$?
        if ((rc == 0)); then
            record "PyTorch GPU checks" PASS "$(tail -n 1 "$log")"
        else
            ((rc == 124)) && rc="timed out after ${PYTHON_TIMEOUT}s"
            record "PyTorch GPU checks" FAIL "exit $rc; $(tail -n 5 "$log" | tr '\n' ';')" "$log"
        fi
    else
        record "PyTorch GPU checks" "not present" "python/tests/gpu/run.sh is not in the bundle"
    fi

    log="$OUT/logs/gpu_bench.log"
    # No earlier run's baseline (an --out used twice): criterion would add "change:" reports.
    rm -rf "$OUT/target/criterion"
    (cd "$OUT" && VMM_TRACES_DIR="$dir/traces/pytorch" CARGO_TARGET_DIR="$OUT/target" \
        timeout "$BENCH_TIMEOUT" "$dir/bin/gpu" --bench --quick --noplot) >"$log" 2>&1
    rc=$?
    # The expandable policies depend on no address, so their replays on the device and on a Sim of
    # it must agree (classic's may not: the driver orders reservations otherwise).
    local differ
    differ="$(grep -E '^sim-check (expandable|pytorch-expandable|expandable-2MiB-pages) .*: DIFFERENT$' "$log")"
    if ((rc == 0)) && [[ -n "$differ" ]]; then
        record "GPU benches" FAIL "the Sim predicted other figures than the device: $(tr '\n' ';' <<<"$differ") see logs/gpu_bench.log" "$log"
    elif ((rc == 0)) && ! grep -q 'SKIPPED' "$log"; then
        record "GPU benches" PASS "$(grep -cE '^gpu_[a-z_]+/[^ ]+( +time:.*)?$' "$log") measurements, $(grep -c '^sim-check .*: same$' "$log") of $(grep -c '^sim-check ' "$log") replays as the Sim predicted (below)"
    else
        ((rc == 124)) && rc="timed out after ${BENCH_TIMEOUT}s"
        record "GPU benches" FAIL "exit $rc; $(grep -m 3 -E 'SKIPPED|panicked|error' "$log" | tr '\n' ';') see logs/gpu_bench.log" "$log"
    fi

    write_report "$dir" "$device" "$driver" "$cuda"
    local failed=0 i
    for i in "${!STEP_STATUS[@]}"; do
        [[ "${STEP_STATUS[$i]}" == FAIL ]] && failed=$((failed + 1))
    done
    if ((failed)); then
        echo "gpu-validate: $failed step(s) FAILED. Report: $OUT/GPU.md"
        exit 1
    fi
    echo "gpu-validate: every step passed. Report: $OUT/GPU.md"
}

write_report() { # bundle, device ("no GPU" when none), driver, cuda version
    local dir="$1" device="$2" driver="$3" cuda="$4" i
    {
        echo "# GPU validation"
        echo
        echo "Written by \`scripts/gpu-validate.sh --run\` on $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(uname -n)."
        echo
        if [[ "$device" == "no GPU" ]]; then
            echo "**no GPU**: \`nvidia-smi\` finds no device on this machine, so nothing was run."
            echo "Run the bundle on a machine with an NVIDIA GPU and driver."
        else
            echo "* device: $device"
            echo "* driver: $driver"
            echo "* CUDA version (driver): $cuda"
        fi
        echo
        echo "Bundle:"
        echo
        echo '```text'
        sed -n '1,3p' "$dir/MANIFEST"
        echo '```'
        if ((${#STEP_NAMES[@]})); then
            echo
            echo "| step | result | details |"
            echo "|---|---|---|"
            for i in "${!STEP_NAMES[@]}"; do
                echo "| ${STEP_NAMES[$i]} | ${STEP_STATUS[$i]} | ${STEP_DETAIL[$i]//|/\\|} |"
            done
        fi
        if [[ -s "$OUT/logs/gpu_bench.log" ]]; then
            echo
            echo "## Bench figures (criterion --quick: estimates, not BENCHMARKS.md quality)"
            echo
            echo '```text'
            # A benchmark's name line and its time/throughput lines.
            grep -E '^[A-Za-z0-9_./-]+ *$|^[A-Za-z0-9_./-]+ +time:|^ +(time|thrpt):|SKIPPED|skipped' "$OUT/logs/gpu_bench.log"
            echo '```'
            if grep -q '^sim-check ' "$OUT/logs/gpu_bench.log"; then
                echo
                echo "The same replays on a Sim of this device (expandable policies must agree; classic's"
                echo "best fit breaks ties by address, and the driver orders addresses otherwise):"
                echo
                echo '```text'
                grep '^sim-check ' "$OUT/logs/gpu_bench.log"
                echo '```'
            fi
            if [[ -s "$OUT/target/bench-extra/gpu.json" ]]; then
                echo
                echo "What each run needed (\`bench-extra/gpu.json\`):"
                echo
                echo '```json'
                cat "$OUT/target/bench-extra/gpu.json"
                echo '```'
            fi
        fi
        local failed=() f
        for i in "${!STEP_STATUS[@]}"; do
            [[ "${STEP_STATUS[$i]}" == FAIL ]] && failed+=("$i")
        done
        if ((${#failed[@]})); then
            echo
            echo "## Failures"
            for i in "${failed[@]}"; do
                f="${STEP_LOG[$i]}"
                echo
                echo "### ${STEP_NAMES[$i]}${f:+ (logs/$(basename "$f"))}"
                [[ -n "$f" && -s "$f" ]] || continue
                echo
                echo '```text'
                # The failing tests' reports where the log has any, else its end (a timeout, a crash).
                if grep -qE 'panicked|FAILED|^---- ' "$f"; then
                    grep -E -B2 -A12 'panicked|FAILED|^---- ' "$f" | head -n 80
                else
                    tail -n 30 "$f"
                fi
                echo '```'
            done
        fi
    } >"$OUT/GPU.md"
}

# ----------------------------------------------------------------------------------- arguments
MODE=both DIR="" OUT=""
while (($#)); do
    case "$1" in
        --build) MODE=build; DIR="${2:-}"; [[ -n "$DIR" ]] || usage; shift 2 ;;
        --run) MODE=run; DIR="${2:-}"; [[ -n "$DIR" ]] || usage; shift 2 ;;
        --out) OUT="${2:-}"; [[ -n "$OUT" ]] || usage; shift 2 ;;
        -h | --help) usage ;;
        *) echo "gpu-validate: unknown argument $1" >&2; usage ;;
    esac
done
[[ "$MODE" == build && -n "$OUT" ]] && { echo "gpu-validate: --out goes with --run" >&2; usage; }

case "$MODE" in
    build) build "$(mkdir -p "$DIR" && cd "$DIR" && pwd)" ;;
    run)
        [[ -d "$DIR" ]] || { echo "gpu-validate: no bundle directory $DIR" >&2; exit 2; }
        DIR="$(cd "$DIR" && pwd)"
        OUT="${OUT:-$DIR/out}"; mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
        run_bundle "$DIR" ;;
    both)
        BUNDLE="$(mktemp -d)"
        (build "$BUNDLE") || exit $?
        OUT="${OUT:-$ROOT}"; mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
        run_bundle "$BUNDLE" ;;
esac
