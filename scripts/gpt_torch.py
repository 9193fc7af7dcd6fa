"""The character-level GPT of models/src/gpt.rs in PyTorch, with the same parameter names
(`blocks.0.attn.q.weight`, ...), layouts and formulas: pre-norm blocks, causal attention over
4 heads of 32, GELU with the tanh approximation, LayerNorm eps 1e-5, a biased linear head.
Used by scripts/bench_peers.py (the `gpt_step` benchmark) and scripts/gpt_interop.py (the
fixtures of models/tests/gpt_interop.rs, at a tiny size)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 84, 128, 4, 4, 64


class SelfAttention(nn.Module):
    def __init__(self, width=WIDTH, heads=HEADS):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape

        def heads(y):
            return y.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, width=WIDTH):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width=WIDTH, heads=HEADS):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = FeedForward(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=VOCAB, width=WIDTH, heads=HEADS, layers=LAYERS, context=CONTEXT):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, idx, targets):
        logits = self.forward(idx)
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))
