#!/usr/bin/env python3
"""Run `models bench` (rtx) and the same work in PyTorch and NumPy, then print one table.

Usage (from anywhere; CI does not run this script):

    python3 -m venv /work/venv-bench                 # outside the repository
    /work/venv-bench/bin/pip install numpy torch
    /work/venv-bench/bin/python scripts/bench_peers.py [--filter NAME] [--threads 2]
        [--rtx-bin target/release/models]

Without --rtx-bin the script builds the rtx program (`cargo build --release -p models`) and
runs it as `cargo run --release -q -p models -- bench --filter <group>` in the repository
root. The work goes group by group: one group in rtx, then in each peer, then the next group,
so that load from elsewhere on the machine, which drifts, hits both sides of a ratio alike.
A peer that cannot be imported is skipped with a printed note.

What is measured, on every side: the same shapes, untimed warm-up iterations (a few, and at least
0.3 s), then
timed iterations one by one (time.perf_counter here, std::time::Instant in rtx), stopping at
a per-bench iteration count or time budget (at least 3 iterations); the figure is the median.
The plans below mirror models/src/bench.rs; keep the two in sync.

All frameworks get the same number of threads: torch.set_num_threads(N), OPENBLAS/OMP/MKL
_NUM_THREADS=N for NumPy's BLAS, RAYON_NUM_THREADS=N for rtx (default N = 2).

Ratios are printed as `speedup = peer_time / rtx_time` (for throughputs, rtx_rate /
peer_rate, the same thing): above 1 rtx is faster, below 1 the peer is.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
STREAM_LEN = 16 * 1024 * 1024
GEMM_SIZES = [256, 512, 1024, 2048]
MIN_ITERS = 3

# (warmup, iters, budget in ms), as in models/src/bench.rs.
PLANS = {
    "mlp_step_64_128_10": (20, 300, 3000),
    "mlp_step_64_1024_1024_10": (3, 50, 5000),
    "cnn_step": (10, 300, 3000),
    "cnn_layer": (20, 500, 1500),
    "mlp_forward": (50, 2000, 2000),
    "gpt_step": (3, 30, 6000),
    "elementwise_chain": (2, 20, 6000),
    "copy": (2, 30, 3000),
    256: (10, 200, 2000),
    512: (3, 60, 2500),
    1024: (2, 20, 3000),
    2048: (1, 5, 4000),
}

# Groups measured together, as in models/src/bench.rs; --filter keeps a group when it is part
# of any of its names.
GROUPS = [
    ["mlp_step_64_128_10"],
    ["mlp_step_64_1024_1024_10"],
    ["mlp_forward"],
    ["gpt_step"],
    ["cnn_step"],
    ["cnn_layer"],
    ["elementwise_chain", "copy"],
    ["gemm"],
    ["gemm_bf16"],
    ["gemm_f16"],
    ["gemm_shape"],
]

# (m, k, n) of the gemm_shape group, as in models/src/bench.rs.
GEMM_SHAPES = [(256, 64, 128), (256, 128, 10), (256, 1024, 1024), (1024, 128, 512)]


# Decimal places of each figure, as models/src/bench.rs prints them.
DIGITS = {"median_us": 1, "min_us": 1, "gbps": 2, "gflops": 1, "ratio_to_copy": 3, "tokens_per_s": 0}


# Warm-up lasts at least this long (seconds), as MIN_WARMUP in models/src/bench/mod.rs.
MIN_WARMUP_S = 0.3


def measure(plan, work):
    """Median and minimum wall time of `work()` in microseconds, and the iteration count."""
    warmup, iters, budget_ms = plan
    warming, warmed = time.perf_counter(), 0
    while warmed < warmup or time.perf_counter() - warming < MIN_WARMUP_S:
        work()
        warmed += 1
    samples = []
    started = time.perf_counter()
    while len(samples) < max(iters, MIN_ITERS):
        t = time.perf_counter()
        work()
        samples.append((time.perf_counter() - t) * 1e6)
        if len(samples) >= MIN_ITERS and (time.perf_counter() - started) * 1e3 >= budget_ms:
            break
    return {"median_us": statistics.median(samples), "min_us": min(samples), "iters": len(samples)}


def gbps(micros):
    """Effective bandwidth of one read and one write of STREAM_LEN f32, in GB/s."""
    return 2 * STREAM_LEN * 4 / (micros * 1e-6) / 1e9


def gflops(n, micros):
    return 2 * n**3 / (micros * 1e-6) / 1e9


# ---------------------------------------------------------------------------------- rtx


def rtx_command(args):
    if args.rtx_bin:
        return [args.rtx_bin, "bench"]
    return ["cargo", "run", "--release", "-q", "-p", "models", "--", "bench"]


def run_rtx(args, group):
    """Runs the rtx bench program for one group; returns {(name, config): fields}."""
    cmd = rtx_command(args) + ["--filter", group[0]]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"`{' '.join(cmd)}` failed with exit status {proc.returncode}")
    results = {}
    for line in proc.stdout.splitlines():
        if not line.startswith("bench="):
            continue
        print(f"rtx   {line}", flush=True)
        fields = dict(part.split("=", 1) for part in line.split())
        results[(fields["bench"], config_of(fields))] = fields
    return results


def config_of(fields):
    """The part of a result line that tells two results of one bench apart."""
    if "op" in fields and "m" in fields:
        return f"m={fields['m']} k={fields['k']} n={fields['n']} op={fields['op']}"
    if "layer" in fields:
        return f"layer={fields['layer']} op={fields['op']}"
    for key in ("batch", "n"):
        if key in fields:
            return f"{key}={fields[key]}"
    return ""


def add_stream_figures(out, chain, copy):
    chain["gbps"] = gbps(chain["median_us"])
    copy["gbps"] = gbps(copy["median_us"])
    chain["ratio_to_copy"] = chain["gbps"] / copy["gbps"]
    out[("elementwise_chain", f"n={STREAM_LEN}")] = chain
    out[("copy", f"n={STREAM_LEN}")] = copy


def shape_plan(m, k, n):
    return (3, 50, 2000) if 2 * m * k * n > 1e8 else (20, 500, 1000)


def gemm_shape_operands(randn, m, k, n):
    """The three forms of `models bench --filter gemm_shape`: nn, nt (B read from a row-major
    [n, k] weight), tn (A read from a row-major [k, m] activation)."""
    return [
        ("nn", randn(m, k), randn(k, n)),
        ("nt", randn(m, k), randn(n, k).T),
        ("tn", randn(k, m).T, randn(k, n)),
    ]


def gemm_shape_results(matmul, randn):
    out = {}
    for m, k, n in GEMM_SHAPES:
        for form, a, b in gemm_shape_operands(randn, m, k, n):
            r = measure(shape_plan(m, k, n), lambda: matmul(a, b))
            r["gflops"] = 2 * m * k * n / (r["median_us"] * 1e-6) / 1e9
            out[("gemm_shape", f"m={m} k={k} n={n} op={form}")] = r
    return out


# -------------------------------------------------------------------------------- torch


class TorchPeer:
    """The rtx workloads in eager PyTorch. Each method runs one group and returns
    {(name, config): fields}."""

    name = "torch"

    def __init__(self, torch, threads):
        import torch.nn as nn
        import torch.nn.functional as F

        self.torch, self.nn, self.F = torch, nn, F
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, eager")

    def run(self, group):
        return getattr(self, group[0])()

    def train_step(self, name, model, x_shape):
        # As in rtx: train mode (dropout on), cross-entropy, AdamW(lr=1e-3, weight_decay=0.01).
        torch, F = self.torch, self.F
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(*x_shape)
        y = torch.randint(0, 10, (x_shape[0],))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        return {(name, f"batch={x_shape[0]}"): measure(PLANS[name], step)}

    def mlp(self):
        # models/src/mlp.rs: fc2(dropout(relu(fc1(x)), 0.3)).
        nn = self.nn
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10))

    def mlp_step_64_128_10(self):
        return self.train_step("mlp_step_64_128_10", self.mlp(), (256, 64))

    def mlp_step_64_1024_1024_10(self):
        # models/src/bench_models.rs, WideMlp: no dropout.
        nn = self.nn
        wide = nn.Sequential(
            nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        return self.train_step("mlp_step_64_1024_1024_10", wide, (256, 64))

    def mlp_forward(self):
        torch = self.torch
        model = self.mlp().eval()
        out = {}
        for batch in (1, 256):
            x = torch.randn(batch, 64)

            def forward():
                # rtx's `forward` builds no backward either.
                with torch.no_grad():
                    model(x)

            out[("mlp_forward", f"batch={batch}")] = measure(PLANS["mlp_forward"], forward)
        return out

    def gpt_step(self):
        # models/src/gpt.rs via scripts/gpt_torch.py; as `models train --model gpt`: batch 32
        # of 64 random ids, AdamW(1e-3, betas (0.9, 0.99), weight decay 0.1), clipping at 1.
        torch = self.torch
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpt_torch

        model = gpt_torch.Gpt().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
        idx = torch.randint(0, gpt_torch.VOCAB, (32, gpt_torch.CONTEXT + 1))
        x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

        def step():
            opt.zero_grad(set_to_none=True)
            model.loss(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        fields = measure(PLANS["gpt_step"], step)
        fields["tokens_per_s"] = 32 * gpt_torch.CONTEXT / (fields["median_us"] * 1e-6)
        return {("gpt_step", "batch=32"): fields}

    def cnn_step(self):
        # models/src/cnn.rs: conv-relu-pool, conv-relu-pool, flatten, dropout 0.25, linear.
        nn = self.nn
        cnn = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, stride=1, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.25), nn.Linear(128, 10),
        )
        return self.train_step("cnn_step", cnn, (32, 1, 8, 8))

    def cnn_layer(self):
        # The CNN's layers alone at batch 32 (and a wider ResNet-style layer at batch 8), as
        # `models bench --filter cnn_layer` runs them:
        # each convolution's forward and both gradients (ATen's convolution_backward, one
        # output at a time), each 2x2 max pool forward and its gradient (from the indices the
        # forward saved, as autograd does).
        torch, F = self.torch, self.F
        plan, out = PLANS["cnn_layer"], {}
        aten = torch.ops.aten

        def record(layer, op, work):
            out[("cnn_layer", f"layer={layer} op={op}")] = measure(plan, work)

        with torch.no_grad():
            for layer, x_shape, w_shape in (
                ("conv1", (32, 1, 8, 8), (16, 1, 3, 3)),
                ("conv2", (32, 16, 4, 4), (32, 16, 3, 3)),
                ("wide", (8, 64, 32, 32), (64, 64, 3, 3)),
            ):
                x, w = torch.randn(*x_shape), torch.randn(*w_shape)
                g = torch.randn(x_shape[0], w_shape[0], x_shape[2], x_shape[3])
                args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
                record(layer, "forward", lambda: F.conv2d(x, w, padding=1))
                record(layer, "grad_input",
                       lambda: aten.convolution_backward(g, x, w, None, *args, [True, False, False]))
                record(layer, "grad_weight",
                       lambda: aten.convolution_backward(g, x, w, None, *args, [False, True, False]))
            for layer, x_shape in (("pool1", (32, 16, 8, 8)), ("pool2", (32, 32, 4, 4))):
                x = torch.randn(*x_shape)
                y, idx = F.max_pool2d(x, 2, return_indices=True)
                g = torch.randn(*y.shape)
                record(layer, "forward", lambda: F.max_pool2d(x, 2))
                record(layer, "grad_input", lambda: aten.max_pool2d_with_indices_backward(
                    g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx))
        return out

    def elementwise_chain(self):
        torch = self.torch
        x = torch.rand(STREAM_LEN) * 2 - 1
        # The five ops of BenchKernels::chain, eagerly: each one a kernel and a fresh buffer.
        chain = measure(PLANS["elementwise_chain"], lambda: torch.relu(x * 2.0 + 1.0) * 0.5 - 0.25)
        dst = torch.ones(STREAM_LEN)
        copy = measure(PLANS["copy"], lambda: dst.copy_(x))
        out = {}
        add_stream_figures(out, chain, copy)
        return out

    def gemm(self):
        torch = self.torch
        out = {}
        for n in GEMM_SIZES:
            a, b = torch.randn(n, n), torch.randn(n, n)
            r = measure(PLANS[n], lambda: torch.matmul(a, b))
            r["gflops"] = gflops(n, r["median_us"])
            out[("gemm", f"n={n}")] = r
        return out

    def gemm_shape(self):
        torch = self.torch
        return gemm_shape_results(torch.matmul, lambda *s: torch.randn(*s))

    def gemm_bf16(self):
        # bf16 operands; torch returns bf16 (accumulating in f32 inside oneDNN).
        return self.gemm_half("gemm_bf16", self.torch.bfloat16)

    def gemm_f16(self):
        # f16 operands; torch returns f16.
        return self.gemm_half("gemm_f16", self.torch.float16)

    def gemm_half(self, name, dtype):
        torch = self.torch
        out = {}
        for n in GEMM_SIZES:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            r = measure(PLANS[n], lambda: torch.matmul(a, b))
            r["gflops"] = gflops(n, r["median_us"])
            out[(name, f"n={n}")] = r
        return out


# -------------------------------------------------------------------------------- numpy


class NumpyPeer:
    """GEMM (NumPy's BLAS: OpenBLAS in the PyPI wheel) and the eager elementwise chain. NumPy
    has no autograd, so it has no training-step or model figures."""

    name = "numpy"

    def __init__(self, np):
        self.np = np
        self.rng = np.random.default_rng(0)
        blas = "?"
        try:
            blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
        except Exception:  # Older NumPy: the BLAS name is only informative.
            pass
        print(f"# numpy {np.__version__}, BLAS {blas}")

    def run(self, group):
        method = getattr(self, group[0], None)
        return method() if method else {}

    def elementwise_chain(self):
        np = self.np
        x = (self.rng.random(STREAM_LEN, dtype=np.float32) * 2 - 1).astype(np.float32)
        two, one, half, quarter = (np.float32(v) for v in (2.0, 1.0, 0.5, 0.25))
        chain = measure(
            PLANS["elementwise_chain"], lambda: np.maximum(x * two + one, 0) * half - quarter
        )
        dst = np.ones(STREAM_LEN, dtype=np.float32)
        copy = measure(PLANS["copy"], lambda: np.copyto(dst, x))
        out = {}
        add_stream_figures(out, chain, copy)
        return out

    def gemm(self):
        np = self.np
        out = {}
        for n in GEMM_SIZES:
            a = self.rng.standard_normal((n, n), dtype=np.float32)
            b = self.rng.standard_normal((n, n), dtype=np.float32)
            r = measure(PLANS[n], lambda: a @ b)
            r["gflops"] = gflops(n, r["median_us"])
            out[("gemm", f"n={n}")] = r
        return out

    def gemm_shape(self):
        np = self.np
        return gemm_shape_results(
            lambda a, b: a @ b, lambda *s: self.rng.standard_normal(s, dtype=np.float32)
        )


# -------------------------------------------------------------------------------- table


def speedup(rtx, peer):
    """peer_time / rtx_time, as text; '-' when either side is missing."""
    if rtx is None or peer is None:
        return "-"
    return f"{peer['median_us'] / float(rtx['median_us']):.3f}"


def fmt(fields, key, digits):
    if fields is None or key not in fields:
        return "-"
    return f"{float(fields[key]):.{digits}f}"


def print_tables(rtx, peers):
    names = [name for name, _ in peers]
    keys = list(rtx)
    for _, results in peers:
        keys += [k for k in results if k not in keys]

    print()
    print("Times: median microseconds per iteration; speedup = peer_time / rtx_time "
          "(> 1: rtx faster, < 1: peer faster)")
    header = ["bench", "config", "rtx us"] + [f"{n} us" for n in names]
    header += [f"speedup vs {n}" for n in names]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for key in keys:
        r = rtx.get(key)
        cells = [key[0], key[1], fmt(r, "median_us", 1)]
        cells += [fmt(results.get(key), "median_us", 1) for _, results in peers]
        cells += [speedup(r, results.get(key)) for _, results in peers]
        print("| " + " | ".join(cells) + " |")

    rows = []
    for key in keys:
        for unit, digits in (("gflops", 1), ("gbps", 2), ("ratio_to_copy", 3)):
            if any(unit in (res.get(key) or {}) for res in [rtx] + [p for _, p in peers]):
                cells = [key[0], key[1], unit, fmt(rtx.get(key), unit, digits)]
                cells += [fmt(results.get(key), unit, digits) for _, results in peers]
                rows.append(cells)
    if not rows:
        return
    print()
    print("Throughput: GEMM in GFLOP/s (2 n^3 flops), elementwise in GB/s of one read + one "
          "write of 16M f32; ratio_to_copy = chain GB/s / the same framework's copy GB/s")
    header = ["bench", "config", "unit", "rtx"] + names
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", help="only benches whose name contains this string")
    parser.add_argument("--threads", type=int, default=2, help="threads for every framework")
    parser.add_argument("--rtx-bin", help="a built `models` binary instead of `cargo run`")
    args = parser.parse_args()

    # Before numpy or torch start their thread pools.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    groups = [g for g in GROUPS if args.filter is None or any(args.filter in n for n in g)]
    if not groups:
        sys.exit(f"no benchmark name contains `{args.filter}`")

    print(f"# rtx: {' '.join(rtx_command(args))} --filter <group>, "
          f"RAYON_NUM_THREADS={args.threads}")
    if not args.rtx_bin:
        # Build first, so that compiling is not timed and its output comes before the figures.
        build = ["cargo", "build", "--release", "-q", "-p", "models"]
        if subprocess.run(build, cwd=REPO_ROOT).returncode != 0:
            sys.exit("building the rtx bench program failed")
    peers = []
    try:
        import torch

        peers.append(TorchPeer(torch, args.threads))
    except ImportError as e:
        print(f"# note: skipping PyTorch ({e})")
    try:
        import numpy

        peers.append(NumpyPeer(numpy))
    except ImportError as e:
        print(f"# note: skipping NumPy ({e})")

    # Other work on the machine skews every figure (OpenMP's spinning threads most), so the
    # load is printed for the reader to judge a run by, and each group runs in rtx and then
    # in every peer before the next group starts, so drifting background load hits the two
    # sides of a ratio alike.
    print(f"# load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    rtx = {}
    peer_results = [(p.name, {}) for p in peers]
    for group in groups:
        rtx.update(run_rtx(args, group))
        for peer, (_, results) in zip(peers, peer_results):
            measured = peer.run(group)
            for (name, config), fields in measured.items():
                figures = " ".join(
                    f"{k}={v:.{DIGITS[k]}f}" if k in DIGITS else f"{k}={v}"
                    for k, v in fields.items()
                )
                print(f"{peer.name:<5} bench={name} {config} {figures}", flush=True)
            results.update(measured)
    print(f"# load average at end: {os.getloadavg()[0]:.2f}")
    print_tables(rtx, peer_results)


if __name__ == "__main__":
    main()
