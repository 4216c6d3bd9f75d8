"""One training run in this process, under one allocator; prints one JSON line.

python train.py MODE LOOP STEPS
  MODE: native | expandable | route_a | route_b      LOOP: fixed | varying | oom
"""
import json
import os
import sys
import time

MODE, LOOP, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
if MODE == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

if MODE == "route_a":
    import vmm_alloc

    vmm_alloc.install()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda:0")


class Model(torch.nn.Module):
    def __init__(self, vocab=8192, d=512, layers=6, heads=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.body(self.emb(x)))


def batches(step):
    g = torch.Generator().manual_seed(step)
    if LOOP == "varying":
        b = [4, 48, 12, 64, 8, 33, 96, 20][step % 8]
        t = [128, 512, 256, 64, 384, 200, 96, 448][(step * 3) % 8]
    else:
        b, t = 32, 256
    return torch.randint(0, 8192, (b, t), generator=g)


def run():
    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times = [], []
    for step in range(STEPS):
        x = batches(step).to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def peak_reserved():
    if MODE == "route_a":
        import vmm_alloc

        return vmm_alloc.max_memory_reserved(0)
    return torch.cuda.max_memory_reserved(0)


if LOOP == "oom":
    import contextlib

    free, total = torch.cuda.mem_get_info()
    ctx = contextlib.nullcontext()
    if MODE == "route_b":
        import vmm_alloc

        ctx = torch.cuda.use_mem_pool(vmm_alloc.pool())
    try:
        with ctx:
            torch.empty(int(total * 2), dtype=torch.uint8, device=dev)
        print(json.dumps({"mode": MODE, "oom": "no exception"}))
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"mode": MODE, "oom_type": type(e).__name__, "oom": str(e)[:2000]}))
    sys.exit(0)

if MODE == "route_b":
    import vmm_alloc

    pool = vmm_alloc.pool()
    with torch.cuda.use_mem_pool(pool):
        losses, times = run()
else:
    losses, times = run()

steady = sorted(times[len(times) // 5:])
print(json.dumps({
    "mode": MODE, "loop": LOOP, "losses": losses,
    "peak_reserved": peak_reserved(),
    "median_step_ms": 1000 * steady[len(steady) // 2],
}))
