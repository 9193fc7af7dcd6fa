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
#[derive(Debug)]
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

        /// Each position's keys, per head: what a decoding cache keeps.
        fn keys<B, T>(&self, x: [B, T, 128]) -> [B, 4, T, 32] {
            split_heads(self.k(x), 4)
        }

        /// Each position's values, per head.
        fn values<B, T>(&self, x: [B, T, 128]) -> [B, 4, T, 32] {
            split_heads(self.v(x), 4)
        }

        /// One new position attending to `S` cached ones (its own key and value last): no
        /// mask, every cached position comes before it.
        fn attend<B, S>(&self, x: [B, 1, 128], k: [B, 4, S, 32], v: [B, 4, S, 32]) -> [B, 1, 128] {
            let q = split_heads(self.q(x), 4);
            self.proj(merge_heads(attention(q, k, v)))
        }
    }
}

/// The position-wise MLP: 4x wider, GELU (tanh form, as GPT-2).
#[model]
#[derive(Debug)]
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
#[derive(Debug)]
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

        /// The keys the attention of this block computes for `x`.
        fn keys<B, T>(&self, x: [B, T, 128]) -> [B, 4, T, 32] {
            self.attn.keys(self.ln1(x))
        }

        /// The values the attention of this block computes for `x`.
        fn values<B, T>(&self, x: [B, T, 128]) -> [B, 4, T, 32] {
            self.attn.values(self.ln1(x))
        }

        /// `forward` for one new position, given the block's cached keys and values
        /// (the new position's included).
        fn decode<B, S>(&self, x: [B, 1, 128], k: [B, 4, S, 32], v: [B, 4, S, 32]) -> [B, 1, 128] {
            let x = x + self.attn.attend(self.ln1(x), k, v);
            x + self.mlp(self.ln2(x))
        }
    }
}

#[model]
#[derive(Debug)]
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

        /// Token plus position embeddings (the positions given, for decoding with a cache).
        fn embed<B, T>(&self, idx: i64[B, T], pos: i64[B, T]) -> [B, T, 128] {
            self.wte(idx) + self.wpe(pos)
        }

        /// Next-character logits from the last block's output.
        fn logits<B, T>(&self, x: [B, T, 128]) -> [B, T, 84] {
            self.head(self.ln_f(x))
        }

        /// Mean cross-entropy of the next-character predictions against `targets`.
        fn loss<B, T>(&self, idx: i64[B, T], targets: i64[B, T]) -> [] {
            cross_entropy(self.forward(idx), targets)
        }
    }
}

/// Keys and values of the positions decoded so far, per block (`[B, HEADS, S, 32]` each), so
/// that each new position costs one position's work instead of the whole sequence's.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position (to start over, or to restart from a shorter window).
    pub fn clear(&mut self) {
        *self = KvCache::default();
    }
}

impl Gpt {
    /// Logits `[B, n, 84]` for `idx` (`[B, n]`), the `n` positions that follow the ones
    /// `cache` holds, which it then holds too. Equal, to rounding, to the matching positions
    /// of `forward` over the whole sequence. An empty cache takes the first positions in one
    /// pass (the prompt); later positions go one at a time.
    pub fn decode(&self, cache: &mut KvCache, idx: &Tensor) -> Result<Tensor> {
        let (batch, n) = match idx.shape() {
            &[b, n] if n > 0 => (b, n),
            other => {
                return Err(RtxError::ShapeMismatch {
                    context: "Gpt::decode tokens".into(),
                    expected: "[batch, positions] with at least one position".into(),
                    found: format!("{other:?}"),
                });
            }
        };
        if cache.len + n > CONTEXT {
            return Err(RtxError::Invalid(format!(
                "the cache holds {} positions and {n} more would pass the context of {CONTEXT}; clear it and decode the last positions again",
                cache.len
            )));
        }
        if let Some(k) = cache.keys.first()
            && k.shape()[0] != batch
        {
            return Err(RtxError::ShapeMismatch {
                context: "Gpt::decode batch".into(),
                expected: format!("{} sequences, as the cache holds", k.shape()[0]),
                found: format!("{batch}"),
            });
        }
        if cache.is_empty() {
            return self.prefill(cache, idx);
        }
        let tokens = idx.to_vec_i64()?;
        let mut logits = Vec::with_capacity(n);
        for j in 0..n {
            let column: Vec<i64> = (0..batch).map(|b| tokens[b * n + j]).collect();
            let token = Tensor::from_i64(column, &[batch, 1])?;
            let pos = Tensor::from_i64(vec![cache.len as i64; batch], &[batch, 1])?;
            let mut x = self.embed(&token, &pos)?;
            for (i, block) in self.blocks.iter().enumerate() {
                let keys = Tensor::concat(&[&cache.keys[i], &block.keys(&x)?], 2)?;
                let values = Tensor::concat(&[&cache.values[i], &block.values(&x)?], 2)?;
                x = block.decode(&x, &keys, &values)?;
                (cache.keys[i], cache.values[i]) = (keys, values);
            }
            cache.len += 1;
            logits.push(self.logits(&x)?);
        }
        let parts: Vec<&Tensor> = logits.iter().collect();
        Tensor::concat(&parts, 1)
    }

    /// The first positions in one causal pass, keeping each block's keys and values.
    fn prefill(&self, cache: &mut KvCache, idx: &Tensor) -> Result<Tensor> {
        let (batch, n) = (idx.shape()[0], idx.shape()[1]);
        let pos: Vec<i64> = (0..batch).flat_map(|_| 0..n as i64).collect();
        let mut x = self.embed(idx, &Tensor::from_i64(pos, &[batch, n])?)?;
        for block in &self.blocks {
            cache.keys.push(block.keys(&x)?);
            cache.values.push(block.values(&x)?);
            x = block.forward(&x)?;
        }
        cache.len = n;
        self.logits(&x)
    }
}

// The constants above document the literals in the model; keep them in step.
const _: () = assert!(WIDTH == 128 && HEADS == 4 && LAYERS == 4 && CONTEXT == 64 && VOCAB == 84);
