"""PyTorch interop fixtures for models/tests/gpt_interop.rs, and the reverse check.

    /work/venv-bench/bin/python scripts/gpt_interop.py            # regenerate the fixtures
    /work/venv-bench/bin/python scripts/gpt_interop.py --check-rtx-checkpoint gpt.safetensors

The first form builds a tiny GPT (scripts/gpt_torch.py: width 16, 2 heads, 2 blocks, context
8, vocabulary 84) with seed 0 and writes, under models/tests/fixtures/:
- gpt_tiny.safetensors: its state_dict in f32 (PyTorch's names, which are rtx's);
- gpt_tiny_expected.safetensors: a fixed batch (`idx`, `targets`, i64 [2, 8]), and, computed
  in float64 from those f32 weights, the `logits` [2, 8, 84], the cross-entropy `loss` and
  the gradient of the loss for every parameter (`grad.<name>`).
The second loads an rtx checkpoint of the full-size GPT (`models train --model gpt --save`)
into the PyTorch model with strict=True and prints its validation-free loss on a batch.
CI does not run this script; it needs torch and safetensors.
"""

import argparse
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "tests", "fixtures")
TINY = dict(vocab=84, width=16, heads=2, layers=2, context=8)


def fixtures():
    torch.manual_seed(0)
    model = gpt_torch.Gpt(**TINY)
    # Random LayerNorm gains and biases too, so their layout is checked, not just their init.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    weights = {n: p.detach().contiguous() for n, p in model.state_dict().items()}
    os.makedirs(FIXTURES, exist_ok=True)
    save_file(weights, os.path.join(FIXTURES, "gpt_tiny.safetensors"))

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY["vocab"], (2, TINY["context"] + 1), generator=g)
    idx, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    exact = gpt_torch.Gpt(**TINY).double()
    exact.load_state_dict({n: t.double() for n, t in weights.items()}, strict=True)
    logits = exact(idx)
    loss = exact.loss(idx, targets)
    loss.backward()
    expected = {"idx": idx, "targets": targets, "logits": logits.detach().float(),
                "loss": loss.detach().float().reshape(())}
    for n, p in exact.named_parameters():
        expected[f"grad.{n}"] = p.grad.float().contiguous()
    save_file(expected, os.path.join(FIXTURES, "gpt_tiny_expected.safetensors"))
    print(f"wrote {len(weights)} weights and {len(expected)} expected tensors to {FIXTURES}; "
          f"loss {loss.item():.6f}")


def check_rtx_checkpoint(path):
    model = gpt_torch.Gpt()
    # A training checkpoint (`train --checkpoint`) also holds the optimizer's state under
    # `optimizer.`; the model's own tensors are the rest.
    tensors = load_file(path)
    weights = {n: t for n, t in tensors.items() if not n.startswith("optimizer.")}
    model.load_state_dict(weights, strict=True)
    ids = torch.randint(0, gpt_torch.VOCAB, (4, gpt_torch.CONTEXT + 1),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = model.loss(ids[:, :-1], ids[:, 1:])
    print(f"{path}: loaded into PyTorch with strict=True "
          f"({sum(p.numel() for p in model.parameters())} parameters, "
          f"{len(tensors) - len(weights)} optimizer tensors set aside); "
          f"loss on random ids {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check-rtx-checkpoint", metavar="PATH")
    args = parser.parse_args()
    if args.check_rtx_checkpoint:
        check_rtx_checkpoint(args.check_rtx_checkpoint)
    else:
        fixtures()


if __name__ == "__main__":
    main()
