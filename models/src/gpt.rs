//! A character-level GPT (decoder-only transformer, GPT-2 layout with pre-norm blocks):
//! token and learned position embeddings, `LAYERS` blocks of causal self-attention and an
//! MLP, each behind a layer norm and a residual connection, a final layer norm and a linear
//! head over the vocabulary. Parameter names are PyTorch's (`blocks.0.attn.q.weight`), so
//! `scripts/gpt_interop.py` builds the same model in PyTorch from the same names.

use crate::corpus::VOCAB;
use rtx_core::prelude::*;

/// Width of the residual stream.
pub const WIDTH: usize = 128;
/// Attention heads per block (head size `WIDTH / HEADS`).
pub const HEADS: usize = 4;
/// Transformer blocks.
pub const LAYERS: usize = 4;
/// Longest sequence the position table covers.
pub const CONTEXT: usize = 64;

/// Multi-head causal self-attention: projections to queries, keys and values, attention per
/// head, and an output projection. (Three projections rather than one `[128, 384]` with
/// slices: the slices' gradients would be zero-padded to 384 columns and added.)
#[model]
pub struct SelfAttention {
    q: Linear<128, 128>,
    k: Linear<128, 128>,
    v: Linear<128, 128>,
    proj: Linear<128, 128>,
}

#[model]
impl SelfAttention {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 128]) -> [B, T, 128] {
            let q = split_heads(self.q(x), 4);
            let k = split_heads(self.k(x), 4);
            let v = split_heads(self.v(x), 4);
            self.proj(merge_heads(attention(q, k, v, causal = true)))
        }
    }
}

/// The position-wise MLP: 4x wider, GELU (tanh form, as GPT-2).
#[model]
pub struct FeedForward {
    fc: Linear<128, 512>,
    proj: Linear<512, 128>,
}

#[model]
impl FeedForward {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 128]) -> [B, T, 128] {
            self.proj(gelu_tanh(self.fc(x)))
        }
    }
}

/// One pre-norm transformer block.
#[model]
pub struct Block {
    ln1: LayerNorm<128>,
    attn: SelfAttention,
    ln2: LayerNorm<128>,
    mlp: FeedForward,
}

#[model]
impl Block {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 128]) -> [B, T, 128] {
            let x = x + self.attn(self.ln1(x));
            x + self.mlp(self.ln2(x))
        }
    }
}

#[model]
pub struct Gpt {
    wte: Embedding<84, 128>,
    wpe: Embedding<64, 128>,
    blocks: [Block; 4],
    ln_f: LayerNorm<128>,
    head: Linear<128, 84>,
}

#[model]
impl Gpt {
    graph! {
        /// Next-character logits at every position of `idx` (at most 64 positions).
        fn forward<B, T>(&self, idx: i64[B, T]) -> [B, T, 84] {
            let mut x = self.wte(idx) + self.wpe(positions(idx, 1));
            for block in &self.blocks {
                x = block(x);
            }
            self.head(self.ln_f(x))
        }

        /// Mean cross-entropy of the next-character predictions against `targets`.
        fn loss<B, T>(&self, idx: i64[B, T], targets: i64[B, T]) -> [] {
            cross_entropy(self.forward(idx), targets)
        }
    }
}

// The constants above document the literals in the model; keep them in step.
const _: () = assert!(WIDTH == 128 && HEADS == 4 && LAYERS == 4 && CONTEXT == 64 && VOCAB == 84);
