"""GPU validation of the vmm_alloc package: each mode in its own process, a markdown report on
stdout, exit code 1 on any failure. See run.sh."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = int(os.environ.get("STEPS", "300"))
MODES = ["native", "expandable", "route_a", "route_b"]


def run(mode, loop, steps):
    p = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), mode, loop, str(steps)],
                       capture_output=True, text=True, timeout=1800)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "error": (p.stderr or p.stdout)[-1500:]}
    return json.loads(lines[-1])


def run_tool(mode, workdir):
    p = subprocess.run([sys.executable, os.path.join(HERE, "tools.py"), mode, workdir],
                       capture_output=True, text=True, timeout=600)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "error": (p.stderr or p.stdout)[-1500:]}
    return json.loads(lines[-1])


def judge_tool(r):
    """(passed, what it showed) for one tools.py result."""
    if "error" in r:
        return False, r["error"].strip().splitlines()[-1] if r["error"].strip() else "no output"
    if "skipped" in r:
        return True, "skipped: " + r["skipped"]
    if r["mode"] == "sleep":
        want = r["want"]
        ok = (r["mapped"] >= want and r["asleep"] >= want and r["released"] >= want
              and r["same"] and r["usable"] and r["other_intact"])
        return ok, (f"{r['mapped'] >> 20} MiB sleepable, {r['released'] >> 20} MiB back on the device "
                    f"while asleep, values {'restored' if r['same'] else 'NOT restored'} on wake, "
                    f"{'usable' if r['usable'] else 'NOT usable'} after, other tensors "
                    f"{'intact' if r['other_intact'] else 'CHANGED'}")
    if r["mode"] == "snapshot":
        ok = ({"segments", "device_traces", "allocator_settings"} <= set(r["keys"])
              and r["actions"][:3] == ["alloc", "alloc", "free_requested"]
              and (7 << 20) in r["live"] and r["trace_magic"] == "VMMTRACE")
        return ok, f"actions {r['actions']}, live requested sizes {r['live']}, trace starts {r['trace_magic']!r}"
    ok = r["sum_right"] and r["allocated_during"] >= r["want"] and r["allocated_after"] < r["allocated_during"]
    return ok, (f"result {'right' if r['sum_right'] else 'WRONG'}, {r['allocated_during'] >> 20} MiB "
                f"allocated by us during, {r['allocated_after'] >> 20} MiB after")


def main():
    failures = []
    print("## vmm_alloc from PyTorch (GPU)\n")
    import torch

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, {STEPS} steps\n")
    for loop in ["fixed", "varying"]:
        results = {m: run(m, loop, STEPS) for m in MODES}
        print(f"### {loop} batch sizes\n")
        print("| mode | peak reserved (MiB) | median step (ms) | losses vs native |")
        print("|---|---:|---:|---|")
        base = results["native"].get("losses")
        for m in MODES:
            r = results[m]
            if "error" in r:
                failures.append(f"{loop}/{m}: {r['error']}")
                print(f"| {m} | error | | |")
                continue
            if base is None:
                same = "n/a"
            else:
                diff = max(abs(a - b) for a, b in zip(r["losses"], base))
                same = "identical" if diff == 0 else f"max diff {diff:.3g}"
                if diff != 0:
                    failures.append(f"{loop}/{m}: losses differ from native (max {diff:.3g})")
            print(f"| {m} | {r['peak_reserved'] / 2**20:.0f} | {r['median_step_ms']:.2f} | {same} |")
        print()
    print("### out of memory\n")
    for m in ["route_a", "route_b"]:
        r = run(m, "oom", 0)
        text = r.get("oom", r.get("error", ""))
        ok = "CUDA out of memory" in text and (m != "route_a" or "vmm_alloc: reserved" in text)
        if not ok:
            failures.append(f"oom/{m}: {text[:300]}")
        print(f"* {m}: {r.get('oom_type', '?')}: `{text.splitlines()[0] if text else ''}` -> {'ok' if ok else 'FAILED'}")
    print()
    print("### tools (sleep and wake, snapshot and trace, CuPy)\n")
    with tempfile.TemporaryDirectory() as workdir:
        for mode in ["sleep", "snapshot", "cupy"]:
            ok, shown = judge_tool(run_tool(mode, workdir))
            if not ok:
                failures.append(f"tools/{mode}: {shown}")
            print(f"* {mode}: {shown} -> {'ok' if ok else 'FAILED'}")
    print()
    if failures:
        print("### FAILURES\n")
        for f in failures:
            print(f"* {f}")
        sys.exit(1)
    print("All GPU checks passed.")


if __name__ == "__main__":
    main()
