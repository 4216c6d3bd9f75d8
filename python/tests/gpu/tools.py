"""One check of the package's tools under real PyTorch or CuPy, in this process; prints one JSON
line. Each runs in its own process: route A (install) must come before any CUDA allocation.

python tools.py MODE DIR
  MODE: sleep     64 MiB of weights allocated under sleepable(): sleep() gives the device their
                  memory back and wake() brings their values back (route A)
        snapshot  record_memory_history() + dump_snapshot() + write_trace() of a few tensors
                  (route A): a pickle PyTorch's tools read and a file vmm-replay reads
        cupy      CuPy's allocations through use_with_cupy(): results right, and counted by us
  DIR: where the snapshot mode writes its files
"""
import gc
import json
import os
import pickle
import sys

MODE, DIR = sys.argv[1], sys.argv[2]
MIB = 1 << 20


def sleep():
    import torch
    import vmm_alloc

    vmm_alloc.install()
    n = 16 * MIB  # float32: 64 MiB, every value exact
    with vmm_alloc.sleepable("weights"):
        w = torch.arange(n, device="cuda", dtype=torch.float32)
    other = torch.full((MIB,), 3.0, device="cuda")
    torch.cuda.synchronize()
    mapped = vmm_alloc.memory_stats(0)["vmm.sleep.mapped_bytes"]
    free_awake = torch.cuda.mem_get_info()[0]
    vmm_alloc.sleep("weights")
    free_asleep = torch.cuda.mem_get_info()[0]
    asleep = vmm_alloc.memory_stats(0)["vmm.sleep.asleep_bytes"]
    vmm_alloc.wake("weights")
    same = bool(torch.equal(w, torch.arange(n, device="cuda", dtype=torch.float32)))
    w.mul_(2)  # usable after wake
    return {
        "mapped": mapped,
        "asleep": asleep,
        "released": free_asleep - free_awake,
        "same": same,
        "usable": float(w[-1].item()) == 2.0 * (n - 1),
        "other_intact": float(other.sum().item()) == 3.0 * MIB,
        "want": 64 * MIB,
    }


def snapshot():
    import torch
    import vmm_alloc

    vmm_alloc.install()
    vmm_alloc.record_memory_history()
    a = torch.empty(MIB // 4, device="cuda")  # 1 MiB
    b = torch.empty(7 * MIB // 4, device="cuda")  # 7 MiB
    del a
    torch.cuda.synchronize()
    vmm_alloc.record_memory_history(enabled=False)
    snap, trace = os.path.join(DIR, "snapshot.pickle"), os.path.join(DIR, "trace.vmmtrace")
    vmm_alloc.dump_snapshot(snap)
    vmm_alloc.write_trace(trace)
    with open(snap, "rb") as f:
        s = pickle.load(f)
    with open(trace, "rb") as f:
        magic = f.read(8).decode("latin-1")
    live = [blk["requested_size"] for seg in s.get("segments", []) for blk in seg["blocks"]
            if blk["state"] == "active_allocated"]
    del b
    return {
        "keys": sorted(s),
        "actions": [e["action"] for e in s.get("device_traces", [[]])[0]],
        "live": live,
        "trace_magic": magic,
    }


def cupy_check():
    try:
        import cupy
    except ImportError:
        return {"skipped": "CuPy is not installed"}
    import vmm_alloc

    vmm_alloc.use_with_cupy()
    n = MIB
    a = cupy.arange(n, dtype=cupy.float64)
    b = a * 2
    total = float(b.sum())
    during = vmm_alloc.memory_allocated(0)
    del a, b
    gc.collect()
    cupy.cuda.Device().synchronize()
    return {
        "sum_right": total == float(n * (n - 1)),  # 2 * (0 + 1 + ... + n-1), exact in float64
        "allocated_during": during,
        "allocated_after": vmm_alloc.memory_allocated(0),
        "want": 16 * MIB,
    }


print(json.dumps({"mode": MODE, **{"sleep": sleep, "snapshot": snapshot, "cupy": cupy_check}[MODE]()}))
