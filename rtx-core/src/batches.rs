//! Batches of next-token windows over a token stream, for language models.
//!
//! A stream of `n` tokens holds `(n - 1) / context` non-overlapping windows: window `w` is
//! tokens `w * context .. (w + 1) * context` as input and the same shifted by one as target.
//! Training visits them in a seeded shuffle per epoch; evaluation in order. Batches are
//! `[batch, context]` i64 tensors, ready for `cross_entropy(logits [B, T, C], targets [B, T])`.

use crate::error::{Result, RtxError};
use crate::rng::Rng;
use crate::tensor::Tensor;

/// Next-token batches over `tokens`.
pub struct TokenBatches<'a> {
    tokens: &'a [i64],
    context: usize,
    batch: usize,
}

impl<'a> TokenBatches<'a> {
    /// Windows of `context` tokens, `batch` of them per batch. The stream must hold at least
    /// one window and its target (`context + 1` tokens).
    pub fn new(tokens: &'a [i64], context: usize, batch: usize) -> Result<TokenBatches<'a>> {
        if context == 0 || batch == 0 {
            return Err(RtxError::Invalid(format!(
                "TokenBatches needs a context and a batch of at least 1, found {context} and {batch}"
            )));
        }
        if tokens.len() < context + 1 {
            return Err(RtxError::Invalid(format!(
                "a stream of {} tokens is shorter than one window of {context} and its next token",
                tokens.len()
            )));
        }
        Ok(TokenBatches {
            tokens,
            context,
            batch,
        })
    }

    /// How many non-overlapping windows the stream holds.
    pub fn windows(&self) -> usize {
        (self.tokens.len() - 1) / self.context
    }

    /// The batches of one training epoch: every window once, in an order shuffled by `seed`
    /// (the same seed gives the same order); the last batch may be smaller.
    pub fn shuffled(&self, seed: u64) -> Result<Vec<(Tensor, Tensor)>> {
        let mut order: Vec<usize> = (0..self.windows()).collect();
        Rng::new(seed).shuffle(&mut order);
        self.batches(&order)
    }

    /// Every window once, in stream order (validation over the whole split).
    pub fn sequential(&self) -> Result<Vec<(Tensor, Tensor)>> {
        let order: Vec<usize> = (0..self.windows()).collect();
        self.batches(&order)
    }

    fn batches(&self, order: &[usize]) -> Result<Vec<(Tensor, Tensor)>> {
        let t = self.context;
        order
            .chunks(self.batch)
            .map(|chunk| {
                let (mut x, mut y) = (
                    Vec::with_capacity(chunk.len() * t),
                    Vec::with_capacity(chunk.len() * t),
                );
                for &w in chunk {
                    x.extend_from_slice(&self.tokens[w * t..(w + 1) * t]);
                    y.extend_from_slice(&self.tokens[w * t + 1..(w + 1) * t + 1]);
                }
                Ok((
                    Tensor::from_i64(x, &[chunk.len(), t])?,
                    Tensor::from_i64(y, &[chunk.len(), t])?,
                ))
            })
            .collect()
    }
}
