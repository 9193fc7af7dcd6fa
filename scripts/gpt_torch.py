"""The character-level GPT of models/src/gpt.rs in PyTorch, with the same parameter names
(`blocks.0.attn.q.weight`, ...), layouts and formulas: pre-norm blocks, causal attention over
4 heads of 32, GELU with the tanh approximation, LayerNorm eps 1e-5, a biased linear head.
Used by scripts/bench_peers.py (the `gpt_step` benchmark)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 84, 128, 4, 4, 64


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(WIDTH, WIDTH)
        self.k = nn.Linear(WIDTH, WIDTH)
        self.v = nn.Linear(WIDTH, WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape

        def heads(y):
            return y.view(b, t, HEADS, c // HEADS).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = SelfAttention()
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = FeedForward()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, idx, targets):
        logits = self.forward(idx)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
