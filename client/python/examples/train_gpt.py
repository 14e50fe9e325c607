"""A small GPT trained on text Python ships (its own standard library sources), with attention
through the DistFlashAttn Service beside the same model with local SDPA.

    python3 client/python/examples/train_gpt.py --steps 50                 # starts 2 cpu workers
    python3 client/python/examples/train_gpt.py --coordinator HOST:PORT     # an existing cluster

Both models start from the same weights and see the same batches; each step prints the two
losses, their difference and the time per step. The service model's attention layers are
dfa.torch.Attention modules (one session per layer, kept across steps: a step makes no
CreateSession/Release calls); the local model calls torch.nn.functional.scaled_dot_product_attention.
--dtype bf16 runs both under torch.autocast(bfloat16). --compile wraps both in
torch.compile(fullgraph=True). Needs torch, numpy and the dfa package (pip install client/python).
The daemons come from --bin-dir or $DFA_BIN_DIR (a build folder) when no --coordinator is given.

On a GPU: --device cuda trains both models on the GPU; the local cluster then starts
--workers GPU workers (--backend, default cudnn) whose device memory pool takes
--worker-memory of the GPU (--device_memory_limit: the training process shares it), and the
layers' CUDA tensors go to the workers by CUDA IPC, never through host memory
(stats["ipc_bytes"]).

    python3 client/python/examples/train_gpt.py --device cuda --workers 1 --dtype bf16
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import dfa
import dfa.torch


def corpus(max_bytes):
    """Bytes of the standard library's .py files (sorted by name) up to max_bytes."""
    root = os.path.dirname(os.__file__)
    out, total = [], 0
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        out.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return np.frombuffer(b"".join(out)[:max_bytes], dtype=np.uint8)


class Block(torch.nn.Module):
    def __init__(self, d_model, heads, kv_heads, attention):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = torch.nn.Linear(d_model, d_model, bias=False)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d_model, d_model))
        self.attention = attention  # (q, k, v) in SDPA's [B, H, S, D] -> [B, H, S, D]

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = self.attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, make_attention, vocab=256, d_model=64, layers=2, heads=4, kv_heads=2,
                 seq=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.blocks = torch.nn.ModuleList(
            [Block(d_model, heads, kv_heads, make_attention()) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def local_attention():
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=q.shape[1] != k.shape[1])


def batches(data, steps, batch, seq, seed, device="cpu"):
    g = np.random.default_rng(seed)
    for _ in range(steps):
        starts = g.integers(0, len(data) - seq - 1, size=batch)
        x = np.stack([data[i:i + seq] for i in starts]).astype(np.int64)
        y = np.stack([data[i + 1:i + seq + 1] for i in starts]).astype(np.int64)
        yield torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def train(model, data, args, label, log=print):
    """Trains `model` for args.steps; returns (losses, seconds per step)."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model, fullgraph=True, backend=args.compile_backend)
    losses, times = [], []
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    for step, (x, y) in enumerate(batches(data, args.steps, args.batch, args.seq, args.seed,
                                          args.device)):
        t = time.perf_counter()
        for micro in range(args.accumulate):
            with autocast:
                loss = step_fn(x, y) / args.accumulate
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item() * args.accumulate)  # .item() waits for the GPU's work
        times.append(time.perf_counter() - t)
        if args.verbose:
            log("  %-7s step %3d  loss %.6f  %.1f ms" % (label, step, losses[-1], 1e3 * times[-1]))
    return losses, times


def build(make_attention, args):
    torch.manual_seed(args.seed)  # the same initial weights for both models
    return GPT(make_attention, d_model=args.d_model, layers=args.layers, heads=args.heads,
               kv_heads=args.kv_heads, seq=args.seq).to(args.device)


def run(args, log=print):
    """Both trainings; returns a dict with the loss curves, step times and layer stats."""
    torch.set_num_threads(args.torch_threads)
    data = corpus(args.corpus_kb * 1024)
    log("corpus: %d bytes of %s/*.py; model: %d layers, d_model %d, %d/%d heads, seq %d, "
        "batch %d, %s" % (len(data), os.path.dirname(os.__file__), args.layers, args.d_model,
                          args.heads, args.kv_heads, args.seq, args.batch, args.dtype))
    cluster = None
    if not args.coordinator:
        t = time.perf_counter()
        backend = args.backend or ("cudnn" if args.device == "cuda" else "cpu")
        worker_args = []
        if backend != "cpu" and args.worker_memory:
            worker_args.append("--device_memory_limit=%s" % args.worker_memory)
        cluster = dfa.LocalCluster(workers=args.workers, threads_per_worker=args.threads,
                                   backend=backend, bin_dir=args.bin_dir,
                                   worker_args=worker_args)
        args.coordinator = cluster.coordinator_address
        log("local cluster: 1 coordinator + %d %s workers%s, ready in %.2f s"
            % (args.workers, backend, " (%s)" % " ".join(worker_args) if worker_args else "",
               time.perf_counter() - t))
    try:
        client = dfa.Client(args.coordinator)
        service_layers = []

        def service_attention():
            m = dfa.torch.Attention(client, is_causal=True, layout="bhsd", enable_gqa=True,
                                    path=args.path)
            service_layers.append(m)
            return m

        local = build(local_attention, args)
        service = build(service_attention, args)
        loss_local, t_local = train(local, data, args, "local", log)
        sessions_before = client.status()["sessions"]
        loss_service, t_service = train(service, data, args, "service", log)
        stats = [m.stats for m in service_layers]
        sessions_after = client.status()["sessions"]
        for m in service_layers:
            m.release()
    finally:
        if cluster is not None:
            cluster.stop()
    log("step   loss(local SDPA)  loss(service)   |diff|      ms/step local  ms/step service")
    for i, (a, b) in enumerate(zip(loss_local, loss_service)):
        log("%4d   %14.6f  %14.6f   %9.2e   %12.1f  %14.1f"
            % (i, a, b, abs(a - b), 1e3 * t_local[i], 1e3 * t_service[i]))
    warm = slice(1, None) if args.steps > 1 else slice(None)
    log("mean ms/step after the first: local %.1f, service %.1f; service layers: %s"
        % (1e3 * np.mean(t_local[warm]), 1e3 * np.mean(t_service[warm]), stats))
    return {"local": loss_local, "service": loss_service, "t_local": t_local,
            "t_service": t_service, "layer_stats": stats,
            "sessions": (sessions_before, sessions_after)}


def tolerance(dtype):
    """|loss difference| allowed per step: fp32 differs by summation order only; bf16 rounds
    activations (2^-8 relative) on both sides, through different kernels."""
    return {"f32": 1e-4, "bf16": 3e-2}[dtype]


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coordinator", default="")
    p.add_argument("--bin-dir", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where both models train")
    p.add_argument("--backend", default="",
                   help="the local cluster's workers: cpu, cuda, cudnn (default: cudnn with "
                        "--device cuda, else cpu)")
    p.add_argument("--worker-memory", default="0.4",
                   help="GPU workers' --device_memory_limit (bytes like 40G or a fraction)")
    p.add_argument("--path", choices=("auto", "ipc", "shm", "grpc"), default="auto",
                   help="how the layers' tensors move (auto: CUDA IPC for CUDA tensors)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--corpus-kb", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True)")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless the two loss curves agree within the dtype's tolerance")
    p.add_argument("--verbose", action="store_true")
    return p


def main():
    args = parser().parse_args()
    r = run(args)
    worst = max(abs(a - b) for a, b in zip(r["local"], r["service"]))
    tol = tolerance(args.dtype)
    print("largest |loss difference| %.3g (tolerance %.3g for %s)" % (worst, tol, args.dtype))
    if args.check and not worst <= tol:
        sys.exit(1)


if __name__ == "__main__":
    main()
