"""Route A (install) and route B (pool) against the fake torch, on the Host backend."""


def test_install_sets_every_hook_and_allocations_hold_bytes(run):
    p = run("""
        alloc = vmm_alloc.install()
        raw = alloc.allocator()
        assert sorted(raw.hooks) == ['base_alloc', 'end_allocate_to_pool', 'init', 'memory_fraction',
                                     'record_stream', 'release_pool', 'reset'], raw.hooks
        assert raw.begin_pool_addr
        blocks = [torch.cuda._alloc(n) for n in (1, 4096, 3 << 20, 50 << 20)]
        for i, b in enumerate(blocks):
            ctypes.memset(b.ptr, i + 1, b.size)
            assert ctypes.string_at(b.ptr, b.size) == bytes([i + 1]) * b.size
        assert torch.cuda._alloc(0).ptr == 0
        torch.cuda._record_stream(blocks[1], 3)
        print('allocated', torch.cuda.memory_allocated())
        for b in blocks:
            b.free()
        print('after', torch.cuda.memory_allocated())
    """)
    out = dict(line.split() for line in p.stdout.splitlines())
    assert int(out["allocated"]) >= (50 << 20) + (3 << 20) + 4096
    assert int(out["after"]) == 0


def test_install_after_a_cuda_allocation_says_what_to_do(run):
    p = run("""
        torch.cuda._alloc(100)
        try:
            vmm_alloc.install()
        except vmm_alloc.VmmAllocError as e:
            print(e)
        else:
            raise SystemExit('no error')
    """)
    assert "before the first CUDA allocation" in p.stdout
    assert "Can't swap an already initialized allocator" in p.stdout


def test_out_of_memory_under_install_is_an_exception_with_our_report(run):
    p = run("""
        vmm_alloc.install()
        keep = torch.cuda._alloc(100 << 20)
        try:
            torch.cuda._alloc(200 << 20)
        except RuntimeError as e:
            assert vmm_alloc.is_out_of_memory(e)
            print(e)
        else:
            raise SystemExit('no exception')
        print('num_ooms', torch.cuda.memory_stats()['num_ooms'])
    """, ours="capacity_mb:256")
    assert p.stdout.startswith("CUDA out of memory. Tried to allocate 200.00 MiB")
    assert "vmm_alloc: reserved" in p.stdout and "Advice:" in p.stdout
    assert "num_ooms 1" in p.stdout


def test_empty_cache_and_memory_fraction_reach_the_hooks(run):
    p = run("""
        vmm_alloc.install()
        torch.cuda.set_per_process_memory_fraction(0.5)
        assert vmm_alloc.config()['memory_fraction'] == 0.5
        b = torch.cuda._alloc(30 << 20)
        b.free()
        print('reserved', torch.cuda.memory_reserved())
        torch.cuda.empty_cache()
        print('emptied', torch.cuda.memory_reserved())
    """)
    out = dict(line.split() for line in p.stdout.splitlines())
    assert int(out["reserved"]) >= 30 << 20
    assert int(out["emptied"]) == 0


def test_private_pools_are_refused_under_install(run):
    p = run("""
        vmm_alloc.install()
        try:
            with torch.cuda.graph_capture_pool():
                pass
        except RuntimeError as e:
            print(e)
        else:
            raise SystemExit('no error')
    """)
    assert "private memory pools" in p.stdout and "vmm_alloc.pool()" in p.stdout


def test_pool_route_gets_segments_from_us_and_oom_is_torchs(run):
    p = run("""
        pool = vmm_alloc.pool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.cuda._alloc(5 << 20)
            ctypes.memset(a.ptr, 7, a.size)
            assert ctypes.string_at(a.ptr, 16) == bytes([7]) * 16
            try:
                torch.cuda._alloc(300 << 20)
            except torch.OutOfMemoryError as e:
                print('oom', e)
        print('reserved', vmm_alloc.memory_reserved(0))
        print('allocated', vmm_alloc.memory_allocated(0))
        pool.release()
        print('released', vmm_alloc.memory_allocated(0))
    """)
    lines = dict(l.split(' ', 1) for l in p.stdout.splitlines())
    assert lines["oom"].startswith("CUDA out of memory")
    assert int(lines["allocated"]) == 20 << 20  # one 20 MiB segment for a 5 MiB tensor
    assert int(lines["released"]) == 0
