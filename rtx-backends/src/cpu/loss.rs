//! Cross-entropy over class logits, with its gradient.

use rayon::prelude::*;

use crate::layout::Layout;

use super::strided::{PARALLEL_THRESHOLD, contiguous_cow, with_f64_scratch};

/// A label outside `0..classes`, reported with its position in the batch.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelOutOfRange {
    pub index: usize,
    pub label: i64,
    pub classes: usize,
}

impl std::fmt::Display for LabelOutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "label {} at index {} is outside 0..{}",
            self.label, self.index, self.classes
        )
    }
}

impl std::error::Error for LabelOutOfRange {}

/// Labels are data, not shapes, so the IR cannot check them: this is the one kernel check.
fn check_labels(labels: &[i64], classes: usize) -> Result<(), LabelOutOfRange> {
    match labels
        .iter()
        .position(|&label| label < 0 || label as u64 >= classes as u64)
    {
        Some(index) => Err(LabelOutOfRange {
            index,
            label: labels[index],
            classes,
        }),
        None => Ok(()),
    }
}

/// log(sum(exp(row))) in f64, shifted by the row max so exp cannot overflow.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// Mean over N of -log_softmax(logits)[n, label[n]]; logits [N, C]. Error if any label is outside 0..C.
pub fn cross_entropy(logits: &[f32], l: &Layout, labels: &[i64]) -> Result<f32, LabelOutOfRange> {
    let (rows, classes) = (l.shape[0], l.shape[1]);
    check_labels(labels, classes)?;
    let x = contiguous_cow(logits, l);
    let row_loss = |n: usize| {
        let row = &x[n * classes..(n + 1) * classes];
        log_sum_exp(row) - row[labels[n] as usize] as f64
    };
    // Per-row losses first, then one in-order sum, so the total never depends on the split.
    let total = if rows * classes > PARALLEL_THRESHOLD {
        with_f64_scratch(|losses| {
            (0..rows)
                .into_par_iter()
                .map(row_loss)
                .collect_into_vec(losses);
            losses.iter().sum::<f64>()
        })
    } else {
        (0..rows).map(row_loss).sum::<f64>()
    };
    Ok((total / rows as f64) as f32)
}

/// d/dlogits of the above times scalar upstream grad g: (softmax - onehot) * g / N. Same error.
pub fn cross_entropy_grad(
    logits: &[f32],
    l: &Layout,
    labels: &[i64],
    g: f32,
) -> Result<Vec<f32>, LabelOutOfRange> {
    let (rows, classes) = (l.shape[0], l.shape[1]);
    check_labels(labels, classes)?;
    let x = contiguous_cow(logits, l);
    let scale = g as f64 / rows as f64;
    let mut out = crate::pool::take(rows * classes);
    if classes == 0 {
        return Ok(out);
    }
    let fill_row = |n: usize, dst: &mut [f32]| {
        let row = &x[n * classes..(n + 1) * classes];
        let log_total = log_sum_exp(row);
        let label = labels[n] as usize;
        for (c, (d, &v)) in dst.iter_mut().zip(row).enumerate() {
            let one_hot = if c == label { 1.0 } else { 0.0 };
            *d = (((v as f64 - log_total).exp() - one_hot) * scale) as f32;
        }
    };
    if out.len() > PARALLEL_THRESHOLD {
        out.par_chunks_mut(classes)
            .enumerate()
            .for_each(|(n, dst)| fill_row(n, dst));
    } else {
        out.chunks_mut(classes)
            .enumerate()
            .for_each(|(n, dst)| fill_row(n, dst));
    }
    Ok(out)
}
