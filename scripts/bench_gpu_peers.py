#!/usr/bin/env python3
"""rtx's CUDA benchmarks next to PyTorch on the same GPU, in one invocation.

Runs `models bench --filter cuda` (a binary built with `--features cuda`), then the same work
in PyTorch on `cuda:0`, timed the same way (CUDA events around REPS back-to-back launches,
WARMUP_ROUNDS untimed rounds, the median and minimum per launch over ROUNDS rounds), and
prints one markdown table with the ratios, plus the issue's GPU bars:

- bf16 GEMM at n = 4096: rtx (cuBLAS through `CudaDevice::gemm_bf16`) against `torch.matmul`
  on bfloat16 tensors, at least 0.9x;
- the fused elementwise chain at least 0.8x of the copy bandwidth measured in the same run;
- the GPT training step at least 1.5x faster than PyTorch eager.

Training steps (`cuda_mlp_step`: the digits MLP, batch 256; `cuda_gpt_step`: the GPT of
`scripts/gpt_torch.py`, batch 32) are timed on the host from the call until the device is
idle again (`torch.cuda.synchronize()` after each step; rtx's `Gpu::finish`), median of the
timed steps, in PyTorch eagerly and under `torch.compile`.

f32 products run at full f32 on both sides (`torch.backends.cuda.matmul.allow_tf32 = False`,
cuBLAS's default math mode in rtx). The chain runs in PyTorch eagerly (five kernels) and under
`torch.compile` (one Triton kernel) when that works on the machine.

    python3 scripts/bench_gpu_peers.py --rtx-bin target/release/models
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

REPS = 10
ROUNDS = 15
WARMUP_ROUNDS = 3


def run_rtx(binary):
    out = subprocess.run(
        [binary, "bench", "--filter", "cuda"], capture_output=True, text=True, check=True
    ).stdout
    results = {}
    for line in out.splitlines():
        if line.startswith("#"):
            print(line)
            continue
        if not line.startswith("bench="):
            continue
        fields = dict(kv.split("=", 1) for kv in line.split())
        name = fields.pop("bench")
        config = " ".join(f"{k}={fields[k]}" for k in ("dtype", "n", "batch") if k in fields)
        results[(name, config)] = fields
    return results


def measure(torch, work):
    """Per-launch microseconds (median, minimum) of `work` on the current stream."""
    for _ in range(WARMUP_ROUNDS * REPS):
        work()
    samples = []
    for _ in range(ROUNDS):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPS):
            work()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / REPS)
    samples.sort()
    return samples[len(samples) // 2], samples[0]


def host_steps(torch, step, warmup, iters):
    """Median and minimum microseconds of `step` from its call until the device is idle."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples), min(samples)


def torch_steps(torch, dev, results):
    """The MLP and GPT training steps of `models bench --filter cuda_`, eager and compiled."""
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpt_torch

    def mlp_step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(256, 64, device=dev)
        y = torch.randint(0, 10, (256,), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    def gpt_step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
        idx = torch.randint(0, gpt_torch.VOCAB, (32, gpt_torch.CONTEXT + 1), device=dev)
        x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
        loss = model.loss

        def step():
            opt.zero_grad(set_to_none=True)
            loss(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        return step

    def mlp():
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10)
        ).to(dev).train()

    for name, make, build, batch in (
        ("cuda_mlp_step", mlp, mlp_step, 256),
        ("cuda_gpt_step", lambda: gpt_torch.Gpt().to(dev).train(), gpt_step, 32),
    ):
        for mode in ("eager", "compiled"):
            model = make()
            if mode == "compiled":
                try:
                    if name == "cuda_mlp_step":
                        model = torch.compile(model)
                    else:
                        model.loss = torch.compile(model.loss)
                except Exception as e:  # noqa: BLE001
                    print(f"# torch.compile unavailable for {name}: {e}")
                    continue
            try:
                med, low = host_steps(torch, build(model), 20, 200)
            except Exception as e:  # noqa: BLE001
                print(f"# {name} ({mode}) failed: {e}")
                continue
            key = name if mode == "eager" else name + "_compiled"
            results[(key, f"batch={batch}")] = {"median_us": med, "min_us": low}


def run_torch(torch):
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda:0")
    results = {}
    for n in (1024, 2048, 4096, 8192):
        for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            a = torch.rand(n, n, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
            b = torch.rand(n, n, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
            c = torch.empty(n, n, device=dev, dtype=dtype)
            med, low = measure(torch, lambda: torch.matmul(a, b, out=c))
            results[("cuda_gemm", f"dtype={name} n={n}")] = {"median_us": med, "min_us": low}
            del a, b, c
    chain = lambda x: torch.relu(x * 2.0 + 1.0) * 0.5 - 0.25  # noqa: E731
    try:
        compiled = torch.compile(chain)
    except Exception as e:  # noqa: BLE001
        print(f"# torch.compile unavailable: {e}")
        compiled = None
    for n in (1 << 24, 1 << 28):
        x = torch.rand(n, device=dev).mul_(2).sub_(1)
        y = torch.empty_like(x)
        med, low = measure(torch, lambda: chain(x))
        results[("cuda_chain", f"n={n}")] = {"median_us": med, "min_us": low}
        if compiled is not None:
            try:
                med, low = measure(torch, lambda: compiled(x))
                results[("cuda_chain_compiled", f"n={n}")] = {"median_us": med, "min_us": low}
            except Exception as e:  # noqa: BLE001
                print(f"# torch.compile failed: {e}")
                compiled = None
        med, low = measure(torch, lambda: y.copy_(x))
        results[("cuda_copy", f"n={n}")] = {"median_us": med, "min_us": low}
        del x, y
    torch_steps(torch, dev, results)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtx-bin", default="target/release/models")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device")
    print(f"# card: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        print(f"# driver: {smi}")
    except (OSError, subprocess.CalledProcessError):
        pass
    rtx = run_rtx(args.rtx_bin)
    peer = run_torch(torch)
    print("| bench | config | rtx us | torch us | speedup vs torch | rtx figure |")
    print("|---|---|---|---|---|---|")
    for (name, config), r in sorted(rtx.items()):
        p = peer.get((name, config))
        rtx_us = float(r["median_us"])
        figure = next((f"{k}={r[k]}" for k in ("tflops", "gbps") if k in r), "")
        if "ratio_to_copy" in r:
            figure += f" ratio_to_copy={r['ratio_to_copy']}"
        if p:
            print(f"| {name} | {config} | {rtx_us:.1f} | {p['median_us']:.1f} | {p['median_us'] / rtx_us:.3f} | {figure} |")
        else:
            print(f"| {name} | {config} | {rtx_us:.1f} | - | - | {figure} |")
    for (name, config), p in sorted(peer.items()):
        if (name, config) not in rtx:
            print(f"| {name} (torch only) | {config} | - | {p['median_us']:.1f} | - | |")
    bf16 = rtx.get(("cuda_gemm", "dtype=bf16 n=4096"))
    torch_bf16 = peer.get(("cuda_gemm", "dtype=bf16 n=4096"))
    if bf16 and torch_bf16:
        ratio = torch_bf16["median_us"] / float(bf16["median_us"])
        print(f"bar: bf16 GEMM n=4096 at {ratio:.3f}x torch.matmul (wanted >= 0.9)")
    for compiled in ("", "_compiled"):
        gpt = rtx.get(("cuda_gpt_step", "batch=32"))
        torch_gpt = peer.get(("cuda_gpt_step" + compiled, "batch=32"))
        if gpt and torch_gpt:
            ratio = torch_gpt["median_us"] / float(gpt["median_us"])
            which = "torch.compile" if compiled else "PyTorch eager (wanted >= 1.5)"
            print(f"bar: GPT training step at {ratio:.3f}x {which}")
    for (name, config), r in sorted(rtx.items()):
        if name == "cuda_chain":
            print(f"bar: fused chain {config} at {float(r['ratio_to_copy']):.3f}x copy bandwidth (wanted >= 0.8)")
    if not rtx:
        sys.exit("the rtx binary printed no cuda results: was it built with --features cuda?")


if __name__ == "__main__":
    main()
