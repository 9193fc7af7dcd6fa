//! Sampling text from a trained GPT: the next character is drawn from the last position's
//! logits, scaled by a temperature and cut by top-k and top-p (nucleus), with a seeded
//! generator so a seed gives the same text. The prompt runs through the model once, filling a
//! key/value cache (`gpt::KvCache`); each new character then costs one position's work. The
//! learned position table covers `CONTEXT` positions, so when the cache is full it restarts
//! from the last `KEEP` characters (one pass over them): every prediction sees between `KEEP`
//! and `CONTEXT` characters of context.

use crate::corpus::{VOCAB, Vocab};
use crate::gpt::{CONTEXT, Gpt, KvCache};

/// Characters kept when a full cache restarts.
pub const KEEP: usize = 48;
use rtx_core::prelude::*;

/// How the next character is drawn.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// Logits are divided by it; 0 picks the most likely character.
    pub temperature: f32,
    /// Keep only the `k` most likely characters (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the most likely characters whose probabilities add up to `p` (`None` or 1: all).
    pub top_p: Option<f32>,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.8,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Checks the settings; errors name the bad value.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(RtxError::Invalid(format!(
                "the temperature must be a finite number >= 0, found {}",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(RtxError::Invalid(
                "top-k must keep at least 1 character, found 0".into(),
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(RtxError::Invalid(format!(
                "top-p must be in (0, 1], found {p}"
            )));
        }
        Ok(())
    }
}

/// The index drawn from `logits` under `s`, using `rng` (0 for an empty slice).
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> usize {
    if logits.is_empty() {
        return 0;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Most likely first; ties by index, so the order is the same on every machine.
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.temperature == 0.0 || logits.len() == 1 {
        return order[0];
    }
    if let Some(k) = s.top_k {
        order.truncate(k.max(1));
    }
    let top = f64::from(logits[order[0]]);
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - top) / f64::from(s.temperature)).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = s.top_p {
        let mut mass = 0.0;
        let keep = probs
            .iter()
            .position(|&q| {
                mass += q;
                mass >= f64::from(p)
            })
            .map_or(probs.len(), |i| i + 1);
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut r = rng.next_f64() * total;
    for (i, &p) in probs.iter().enumerate() {
        if r < p {
            return order[i];
        }
        r -= p;
    }
    order[order.len() - 1]
}

/// Generates `max_tokens` characters after `prompt`, calling `emit` with each as it comes.
pub fn generate(
    model: &Gpt,
    vocab: &Vocab,
    prompt: &str,
    max_tokens: usize,
    s: &Sampling,
    mut emit: impl FnMut(char),
) -> Result<String> {
    s.validate()?;
    if vocab.len() != VOCAB {
        return Err(RtxError::Invalid(format!(
            "the GPT predicts {VOCAB} characters, the vocabulary has {}",
            vocab.len()
        )));
    }
    let mut ids = vocab.encode(prompt)?;
    if ids.is_empty() {
        return Err(RtxError::Invalid(
            "the prompt is empty: give at least one character to continue".into(),
        ));
    }
    let mut rng = Rng::new(s.seed);
    let mut out = String::new();
    let mut cache = KvCache::new();
    let window = &ids[ids.len().saturating_sub(CONTEXT)..];
    let mut logits = model.decode(
        &mut cache,
        &Tensor::from_i64(window.to_vec(), &[1, window.len()])?,
    )?;
    for step in 0..max_tokens {
        let values = logits.to_vec_f32()?;
        let last = &values[values.len().saturating_sub(VOCAB)..];
        let id = sample(last, s, &mut rng) as i64;
        ids.push(id);
        let c = vocab.char(id).ok_or_else(|| {
            RtxError::Invalid(format!("the model produced id {id} outside the vocabulary"))
        })?;
        emit(c);
        out.push(c);
        if step + 1 == max_tokens {
            break;
        }
        logits = if cache.len() == CONTEXT {
            cache.clear();
            let window = &ids[ids.len() - KEEP..];
            model.decode(&mut cache, &Tensor::from_i64(window.to_vec(), &[1, KEEP])?)?
        } else {
            model.decode(&mut cache, &Tensor::from_i64(vec![id], &[1, 1])?)?
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_zero_picks_the_largest_logit() {
        let s = Sampling {
            temperature: 0.0,
            ..Sampling::default()
        };

        assert_eq!(sample(&[0.1, 2.0, -1.0], &s, &mut Rng::new(0)), 1);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let s = Sampling {
            temperature: 5.0,
            top_k: Some(1),
            ..Sampling::default()
        };
        let mut rng = Rng::new(3);

        for _ in 0..20 {
            assert_eq!(sample(&[0.1, 2.0, 1.9], &s, &mut rng), 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities about 0.88, 0.12, 0.00..: p = 0.5 keeps the first alone.
        let s = Sampling {
            temperature: 1.0,
            top_p: Some(0.5),
            ..Sampling::default()
        };
        let mut rng = Rng::new(4);

        for _ in 0..20 {
            assert_eq!(sample(&[3.0, 1.0, -5.0], &s, &mut rng), 0);
        }
    }

    #[test]
    fn sampling_follows_the_probabilities() {
        let s = Sampling {
            temperature: 1.0,
            ..Sampling::default()
        };
        let mut rng = Rng::new(5);
        let logits = [0.0f32, (3.0f32).ln()];

        let ones = (0..4000)
            .filter(|_| sample(&logits, &s, &mut rng) == 1)
            .count();

        // P(1) = 3/4.
        assert!((2850..3150).contains(&ones), "{ones} of 4000");
    }

    #[test]
    fn an_empty_slice_draws_index_zero() {
        assert_eq!(sample(&[], &Sampling::default(), &mut Rng::new(0)), 0);
    }

    #[test]
    fn bad_settings_are_errors_naming_the_value() {
        let bad = Sampling {
            top_p: Some(1.5),
            ..Sampling::default()
        };

        assert!(bad.validate().unwrap_err().to_string().contains("1.5"));
    }
}
