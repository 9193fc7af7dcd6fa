//! The training loop behind `models train --model gpt`: next-character batches from the
//! embedded Shakespeare corpus, AdamW with warm-up and cosine decay, gradient clipping,
//! validation loss over the whole validation split, a loss curve as CSV.

use crate::corpus::{Corpus, load_shakespeare};
use crate::gpt::{CONTEXT, Gpt};
use indicatif::{ProgressBar, ProgressStyle};
use rtx_core::batches::TokenBatches;
use rtx_core::prelude::*;
use rtx_core::schedule::{Schedule, WarmupCosine, clip_grad_norm};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GptConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Stop earlier, after this many seconds of training (evaluation excluded).
    pub max_seconds: Option<f64>,
    pub batch: usize,
    pub lr: f32,
    pub warmup: usize,
    /// Validation every this many steps (and after the last).
    pub eval_every: usize,
    /// Validation batches per evaluation; `None` is the whole validation split.
    pub eval_batches: Option<usize>,
    pub seed: u64,
    /// Write `step,seconds,train_loss,val_loss` rows here.
    pub csv: Option<PathBuf>,
    pub progress: bool,
}

impl Default for GptConfig {
    fn default() -> GptConfig {
        GptConfig {
            steps: 5500,
            max_seconds: None,
            batch: 32,
            lr: 1e-3,
            warmup: 100,
            eval_every: 500,
            eval_batches: None,
            seed: 0,
            csv: None,
            progress: false,
        }
    }
}

/// One row of the loss curve.
#[derive(Clone, Debug)]
pub struct CurvePoint {
    pub step: usize,
    /// Training seconds so far (evaluation excluded).
    pub seconds: f64,
    /// Mean training loss since the previous point.
    pub train_loss: f32,
    pub val_loss: Option<f32>,
}

#[derive(Clone, Debug)]
pub struct GptReport {
    pub steps: usize,
    pub val_loss: f32,
    /// Training tokens per second (evaluation excluded).
    pub tokens_per_s: f64,
    /// Training seconds (evaluation excluded).
    pub seconds: f64,
    pub curve: Vec<CurvePoint>,
}

/// Mean loss over `batches` (each weighted by its size).
pub fn mean_loss(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<f32> {
    let (mut total, mut count) = (0.0f64, 0usize);
    for (x, y) in batches {
        let n = x.numel();
        total += model.loss(x, y)?.item()? as f64 * n as f64;
        count += n;
    }
    Ok((total / count.max(1) as f64) as f32)
}

/// Trains a fresh seeded GPT on the corpus; returns it with the report.
pub fn train_gpt(cfg: &GptConfig) -> Result<(Gpt, GptReport)> {
    let Corpus {
        train, validation, ..
    } = load_shakespeare()?;
    train_gpt_on(cfg, &train, &validation)
}

/// Trains on the given token streams (tests pass small ones).
pub fn train_gpt_on(
    cfg: &GptConfig,
    train: &[i64],
    validation: &[i64],
) -> Result<(Gpt, GptReport)> {
    let train_batches = TokenBatches::new(train, CONTEXT, cfg.batch)?;
    let mut val_batches = TokenBatches::new(validation, CONTEXT, cfg.batch)?.sequential()?;
    if let Some(n) = cfg.eval_batches {
        val_batches.truncate(n.max(1));
    }
    let mut model = Gpt::init(cfg.seed);
    let mut opt = AdamW::new(cfg.lr).weight_decay(0.1).betas(0.9, 0.99);
    let schedule = WarmupCosine {
        base: cfg.lr,
        min: 0.1 * cfg.lr,
        warmup: cfg.warmup,
        steps: cfg.steps,
    };
    let mut ctx = Ctx::train(cfg.seed);
    let bar = if cfg.progress {
        let b = ProgressBar::new(cfg.steps as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps {msg}",
        ) {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let mut csv = match &cfg.csv {
        Some(path) => {
            let mut f = std::fs::File::create(path)
                .map_err(|e| RtxError::Invalid(format!("cannot write {}: {e}", path.display())))?;
            writeln!(f, "step,seconds,train_loss,val_loss").map_err(io_error)?;
            Some(f)
        }
        None => None,
    };
    let mut curve = Vec::new();
    let (mut seconds, mut tokens) = (0.0f64, 0usize);
    let (mut window_loss, mut window_steps) = (0.0f64, 0usize);
    let mut epoch = 0u64;
    let mut epoch_batches = Vec::new().into_iter();
    let mut step = 0;
    let mut val_loss = f32::NAN;
    while step < cfg.steps {
        let started = Instant::now();
        let (x, y) = match epoch_batches.next() {
            Some(b) => b,
            None => {
                epoch_batches = train_batches.shuffled(cfg.seed ^ epoch)?.into_iter();
                epoch += 1;
                continue;
            }
        };
        opt.set_lr(schedule.lr(step));
        let (loss, mut grads) = model.loss_and_grads(&mut ctx, &x, &y)?;
        clip_grad_norm(&mut grads, 1.0)?;
        opt.step(&mut model, &grads)?;
        let loss = loss.item()?;
        if !loss.is_finite() {
            return Err(RtxError::Invalid(format!(
                "the training loss is {loss} at step {step}: lower the learning rate"
            )));
        }
        seconds += started.elapsed().as_secs_f64();
        tokens += x.numel();
        window_loss += loss as f64;
        window_steps += 1;
        step += 1;
        bar.inc(1);
        let out_of_time = cfg.max_seconds.is_some_and(|s| seconds >= s);
        if step % cfg.eval_every == 0 || step == cfg.steps || out_of_time {
            val_loss = mean_loss(&model, &val_batches)?;
            let point = CurvePoint {
                step,
                seconds,
                train_loss: (window_loss / window_steps.max(1) as f64) as f32,
                val_loss: Some(val_loss),
            };
            (window_loss, window_steps) = (0.0, 0);
            bar.set_message(format!(
                "train {:.3} val {:.3} {:.0} tok/s",
                point.train_loss,
                val_loss,
                tokens as f64 / seconds.max(1e-9)
            ));
            if let Some(f) = csv.as_mut() {
                writeln!(
                    f,
                    "{},{:.3},{:.5},{:.5}",
                    point.step, point.seconds, point.train_loss, val_loss
                )
                .map_err(io_error)?;
            }
            curve.push(point);
        }
        if out_of_time {
            break;
        }
    }
    bar.finish_and_clear();
    let report = GptReport {
        steps: step,
        val_loss,
        tokens_per_s: tokens as f64 / seconds.max(1e-9),
        seconds,
        curve,
    };
    Ok((model, report))
}

fn io_error(e: std::io::Error) -> RtxError {
    RtxError::Invalid(format!("writing the loss curve: {e}"))
}
