"""Statistics, the torch patch, snapshots, traces, sleep/wake and configuration errors."""
import pickle
from pathlib import Path

FAKE_CUPY = Path(__file__).resolve().parent / "fake_cupy"


def test_patched_torch_stats_report_ours_and_the_summary_has_pytorchs_layout(run):
    p = run("""
        vmm_alloc.install(patch_stats=False)
        try:
            torch.cuda.memory_stats()
        except RuntimeError as e:
            print('unpatched:', e)
        vmm_alloc.patch_torch_stats()
        b = torch.cuda._alloc(3 << 20)
        s = torch.cuda.memory_stats()
        assert s['allocated_bytes.all.current'] == torch.cuda.memory_allocated() >= 3 << 20
        assert torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved() > 0
        assert s['vmm.driver_calls.cuMemCreate'] >= 1 and 0 <= s['vmm.fragmentation'] < 1
        b.free()
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated() == 0
        print(torch.cuda.memory_summary())
        vmm_alloc.unpatch_torch_stats()
        try:
            torch.cuda.memory_allocated()
        except RuntimeError:
            print('unpatched again')
    """)
    assert "unpatched: CUDAPluggableAllocator does not yet support getDeviceStats" in p.stdout
    assert "|                  PyTorch CUDA memory summary, device ID 0                 |" in p.stdout
    assert "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |" in p.stdout
    assert "| Allocated memory      |" in p.stdout and "|       from large pool |" in p.stdout
    assert all(len(l) == 77 for l in p.stdout.splitlines() if l.startswith("|")), p.stdout
    assert "unpatched again" in p.stdout


def test_snapshot_opens_with_pickle_and_trace_is_vmm_replay_format(run, tmp_path):
    snap, trace = tmp_path / "s.pickle", tmp_path / "t.vmmtrace"
    run(f"""
        vmm_alloc.install()
        vmm_alloc.record_memory_history()
        a = torch.cuda._alloc(1 << 20)
        b = torch.cuda._alloc(7 << 20)
        a.free()
        vmm_alloc.record_memory_history(enabled=False)
        vmm_alloc.dump_snapshot({str(snap)!r})
        vmm_alloc.write_trace({str(trace)!r})
    """)
    s = pickle.loads(snap.read_bytes())
    assert set(s) >= {"segments", "device_traces", "allocator_settings"}
    actions = [e["action"] for e in s["device_traces"][0]]
    assert actions == ["alloc", "alloc", "free_requested", "free_completed"]
    assert s["device_traces"][0][1]["size"] == 7 << 20
    live = [blk for seg in s["segments"] for blk in seg["blocks"] if blk["state"] == "active_allocated"]
    assert [blk["requested_size"] for blk in live] == [7 << 20]
    assert trace.read_bytes().startswith(b"VMMTRACE")


def test_sleep_releases_memory_and_wake_restores_contents(run):
    p = run("""
        vmm_alloc.install()
        with vmm_alloc.sleepable('weights'):
            w = torch.cuda._alloc(6 << 20)
        other = torch.cuda._alloc(1 << 20)
        ctypes.memset(w.ptr, 0x5A, w.size)
        s = vmm_alloc.memory_stats(0)
        print('mapped', s['vmm.sleep.mapped_bytes'])
        vmm_alloc.sleep('weights')
        s = vmm_alloc.memory_stats(0)
        print('asleep', s['vmm.sleep.asleep_bytes'], s['vmm.sleep.mapped_bytes'])
        vmm_alloc.wake('weights')
        assert ctypes.string_at(w.ptr, w.size) == b'\\x5a' * w.size
        w.free(); other.free()
        print('left', vmm_alloc.memory_stats(0)['vmm.sleep.allocations'])
    """)
    lines = dict(l.split(' ', 1) for l in p.stdout.splitlines())
    assert int(lines["mapped"]) == 6 << 20
    assert lines["asleep"] == f"{6 << 20} 0"
    assert lines["left"] == "0"


def test_bad_configuration_is_refused_with_the_variable_named(run):
    p = run("""
        try:
            vmm_alloc.install()
        except vmm_alloc.VmmAllocError as e:
            print(e)
    """, ours="remap_defrag:perhaps")
    assert "VMM_ALLOC_CONF" in p.stdout and "remap_defrag takes True or False" in p.stdout
    p = run("""
        try:
            vmm_alloc.configure(conf='max_split_size_mb:1')
        except vmm_alloc.VmmAllocError as e:
            print(e)
    """)
    assert "PYTORCH_CUDA_ALLOC_CONF" in p.stdout


def test_pytorch_conf_applies(run):
    p = run("""
        print(vmm_alloc.config()['large_page'])
    """, conf="expandable_segments:True,large_segment_size_mb:64")
    assert p.stdout.strip() == str(64 << 20)


def test_cupy_allocations_come_from_us_and_are_freed_when_cupy_drops_them(run):
    # The fake CuPy's UnownedMemory takes no weak references, as the real one: the allocation
    # must be freed through the owner it keeps alive (a weakref.finalize on it raised TypeError
    # on the H200, 2026-11-27).
    fake_cupy = str(FAKE_CUPY)
    p = run(f"""
        import gc, sys
        sys.path.insert(0, {fake_cupy!r})
        import cupy
        assert cupy.FAKE
        vmm_alloc.use_with_cupy()
        a = cupy.arange(1 << 17)
        print('during', vmm_alloc.memory_allocated(0), sum(a.view()))
        del a
        gc.collect()
        print('after', vmm_alloc.memory_allocated(0))
    """)
    lines = dict(l.split(' ', 1) for l in p.stdout.splitlines())
    n = 1 << 17
    assert lines["during"] == f"{8 * n} {float(n * (n - 1) // 2)}"
    assert lines["after"] == "0"
