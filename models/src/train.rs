//! The training loop behind `models train`: seeded split, shuffled mini-batches, the compiled
//! loss-and-gradient function of the model, an optimizer step, and accuracy per epoch.

use crate::cnn::Cnn;
use crate::data::{Digits, PIXELS, load_digits};
use crate::mlp::Mlp;
use indicatif::{ProgressBar, ProgressStyle};
use rtx_core::prelude::*;
use rtx_core::schedule::{Cosine, Schedule};
use rtx_core::train::{train_step, train_step_scaled};
use std::time::Instant;

/// The held-out split is fixed, whatever the training seed, so runs are comparable.
pub const SPLIT_SEED: u64 = 0;
pub const TEST_FRACTION: f64 = 0.2;

/// How a digit classifier is run here: its name, input layout and training settings. The
/// model itself (forward, loss, gradients) is `rtx_core::Model`, which `#[model]` implements.
pub trait Classifier: Model + Sized {
    const NAME: &'static str;
    /// Shape of a batch of `b` images as this model takes them.
    fn input_shape(b: usize) -> Vec<usize>;
    /// Epochs, batch size and learning rate that reach the accuracy bar in the time budget.
    fn defaults() -> (usize, usize, f32);
}

impl Classifier for Mlp {
    const NAME: &'static str = "mlp";
    fn input_shape(b: usize) -> Vec<usize> {
        vec![b, PIXELS]
    }
    fn defaults() -> (usize, usize, f32) {
        (60, 32, 2e-3)
    }
}

impl Classifier for Cnn {
    const NAME: &'static str = "cnn";
    fn input_shape(b: usize) -> Vec<usize> {
        vec![b, 1, 8, 8]
    }
    fn defaults() -> (usize, usize, f32) {
        (40, 32, 3e-3)
    }
}

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub epochs: Option<usize>,
    pub seed: u64,
    /// Show a progress bar (the CLI does; tests do not).
    pub progress: bool,
    /// Print one line per epoch.
    pub verbose: bool,
    /// The precision of products (`Ctx::with_precision`); f16 scales the loss.
    pub precision: Precision,
    /// Where the steps run (`Device::Cpu`, or a GPU with the `wgpu` feature); the trained
    /// model comes back on the CPU.
    pub device: Device,
}

#[derive(Clone, Debug)]
pub struct TrainReport {
    pub model: &'static str,
    pub epochs: usize,
    /// Mean training loss of each epoch.
    pub epoch_losses: Vec<f32>,
    pub test_accuracy: f64,
    pub seconds: f64,
}

fn to_error(e: crate::data::DataError) -> RtxError {
    RtxError::Invalid(format!("digits data: {e}"))
}

/// Fraction of rows whose arg-max logit is the label.
pub fn accuracy<M: Classifier>(model: &M, data: &Digits) -> Result<f64> {
    accuracy_on(model, data, &Device::Cpu)
}

/// [`accuracy`] with the forward pass on `device` (where the model's parameters are).
pub fn accuracy_on<M: Classifier>(model: &M, data: &Digits, device: &Device) -> Result<f64> {
    if data.len == 0 {
        return Ok(0.0);
    }
    let idx: Vec<usize> = (0..data.len).collect();
    let (x, y) = data.batch(&idx);
    let logits = model
        .forward(&Tensor::from_vec(x, &M::input_shape(data.len))?.to(device)?)?
        .to_vec_f32()?;
    let correct = logits
        .chunks(10)
        .zip(&y)
        .filter(|(row, label)| {
            let best = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                );
            best.0 as i64 == **label
        })
        .count();
    Ok(correct as f64 / data.len as f64)
}

/// Per-pixel mean and standard deviation over a set (constant pixels get std 1).
pub fn pixel_stats(d: &Digits) -> (Vec<f32>, Vec<f32>) {
    let n = d.len.max(1) as f64;
    let mut mean = vec![0f64; PIXELS];
    let mut sq = vec![0f64; PIXELS];
    for img in d.images.chunks(PIXELS) {
        for (i, &v) in img.iter().enumerate() {
            mean[i] += v as f64;
            sq[i] += (v as f64) * (v as f64);
        }
    }
    let mean: Vec<f64> = mean.iter().map(|m| m / n).collect();
    let std = sq.iter().zip(&mean).map(|(s, m)| {
        let var = (s / n - m * m).max(0.0);
        if var < 1e-12 { 1.0 } else { var.sqrt() as f32 }
    });
    (mean.iter().map(|&m| m as f32).collect(), std.collect())
}

/// Scales every pixel to zero mean and unit variance with the training set's statistics.
pub fn standardize(d: &mut Digits, mean: &[f32], std: &[f32]) {
    for img in d.images.chunks_mut(PIXELS) {
        for i in 0..PIXELS {
            img[i] = (img[i] - mean[i]) / std[i];
        }
    }
}

/// The fixed train/test split, both standardized with the training set's pixel statistics:
/// what training sees and what every accuracy figure is measured on.
pub fn prepared_split() -> Result<(Digits, Digits)> {
    let data = load_digits().map_err(to_error)?;
    let (mut train_set, mut test_set) = data.split(TEST_FRACTION, SPLIT_SEED);
    let (mean, std) = pixel_stats(&train_set);
    standardize(&mut train_set, &mean, &std);
    standardize(&mut test_set, &mean, &std);
    Ok((train_set, test_set))
}

/// Accuracy of `model` on the held-out split, prepared as in training.
pub fn held_out_accuracy<M: Classifier>(model: &M) -> Result<f64> {
    accuracy(model, &prepared_split()?.1)
}

/// Trains a fresh `M` (seeded) with Adam and returns it with the report.
pub fn train<M: Classifier>(cfg: &TrainConfig) -> Result<(M, TrainReport)> {
    let (train_set, test_set) = prepared_split()?;
    let (default_epochs, batch, lr) = M::defaults();
    let epochs = cfg.epochs.unwrap_or(default_epochs);
    let mut model = M::init(cfg.seed);
    model.to(&cfg.device)?;
    let mut opt = Adam::new(lr);
    let mut rng = Rng::new(cfg.seed ^ 0x5EED);
    let mut ctx = Ctx::train(cfg.seed).with_precision(cfg.precision);
    let mut scaler = (cfg.precision == Precision::F16).then(LossScaler::new);
    let start = Instant::now();
    let batches = train_set.len.div_ceil(batch);
    let bar = if cfg.progress {
        let b = ProgressBar::new((epochs * batches) as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} batches {msg}",
        ) {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let mut epoch_losses = Vec::with_capacity(epochs);
    for epoch in 1..=epochs {
        // Cosine decay per epoch from `lr` to 5% of it over the run.
        let epoch_lr = Cosine {
            base: lr,
            min: 0.05 * lr,
            steps: epochs,
        }
        .lr(epoch - 1);
        let mut order: Vec<usize> = (0..train_set.len).collect();
        rng.shuffle(&mut order);
        let mut total = 0.0f64;
        for chunk in order.chunks(batch) {
            let (x, y) = train_set.batch(chunk);
            let x = Tensor::from_vec(x, &M::input_shape(chunk.len()))?.to(&cfg.device)?;
            let y = Tensor::from_i64(y, &[chunk.len()])?.to(&cfg.device)?;
            let batch = (&x, &y);
            let loss = match scaler.as_mut() {
                Some(s) => {
                    train_step_scaled(&mut model, &mut opt, &mut ctx, batch, epoch_lr, None, s)?.0
                }
                None => train_step(&mut model, &mut opt, &mut ctx, batch, epoch_lr, None)?,
            };
            total += loss as f64 * chunk.len() as f64;
            bar.inc(1);
        }
        let mean = (total / train_set.len as f64) as f32;
        epoch_losses.push(mean);
        let acc = accuracy_on(&model, &test_set, &cfg.device)?;
        bar.set_message(format!("epoch {epoch} loss {mean:.4} test_acc {acc:.4}"));
        if cfg.verbose {
            bar.suspend(|| {
                println!(
                    "epoch {epoch:>3}/{epochs}  loss {mean:.4}  test_accuracy {acc:.4}  {:.1}s",
                    start.elapsed().as_secs_f64()
                )
            });
        }
    }
    bar.finish_and_clear();
    let test_accuracy = accuracy_on(&model, &test_set, &cfg.device)?;
    model.to(&Device::Cpu)?;
    let report = TrainReport {
        model: M::NAME,
        epochs,
        epoch_losses,
        test_accuracy,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((model, report))
}
