//! The training loop behind `models train --model gpt`: next-character batches from the
//! embedded Shakespeare corpus, AdamW with warm-up and cosine decay, gradient clipping,
//! validation loss over the whole validation split, a loss curve as CSV, and training
//! checkpoints from which a stopped run continues bit-identically (`rtx_core::resume`).

use crate::corpus::{Corpus, load_shakespeare};
use crate::gpt::{CONTEXT, Gpt};
use indicatif::{ProgressBar, ProgressStyle};
use rtx_core::batches::TokenBatches;
use rtx_core::prelude::*;
use rtx_core::resume::{TrainingMeta, load_training, save_training};
use rtx_core::schedule::{Schedule, WarmupCosine};
use rtx_core::train::{train_step, train_step_scaled};
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
    /// Write `step,seconds,train_loss,val_loss` rows here (appended to when resuming).
    pub csv: Option<PathBuf>,
    pub progress: bool,
    /// Save a training checkpoint (weights, optimizer state, step, RNG state, data position)
    /// here every `checkpoint_every` steps and when training stops.
    pub checkpoint: Option<PathBuf>,
    pub checkpoint_every: usize,
    /// Continue the run saved in this training checkpoint; the configuration must match
    /// the one it was saved with (the schedule and the data order depend on it).
    pub resume: Option<PathBuf>,
    /// Stop after this step, as if interrupted (the schedule still spans `steps`).
    pub stop_after: Option<usize>,
    /// The precision of products (`Ctx::with_precision`): f32, or bf16 / f16 with f32
    /// master weights; f16 runs with dynamic loss scaling (`LossScaler`).
    pub precision: Precision,
    /// Where the steps and evaluations run (`Device::Cpu`, or a GPU with the `wgpu`
    /// feature); the trained model comes back on the CPU.
    pub device: Device,
}

impl Default for GptConfig {
    fn default() -> GptConfig {
        GptConfig {
            steps: 5500,
            max_seconds: None,
            batch: 32,
            lr: 3e-3,
            warmup: 100,
            eval_every: 500,
            eval_batches: None,
            seed: 0,
            csv: None,
            progress: false,
            checkpoint: None,
            checkpoint_every: 500,
            resume: None,
            stop_after: None,
            precision: Precision::F32,
            device: Device::Cpu,
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
    /// Training seconds (evaluation excluded), including those before a resume.
    pub seconds: f64,
    pub curve: Vec<CurvePoint>,
    /// The training loss of every step this run took (after a resume, from there on).
    pub losses: Vec<f32>,
    /// f16: steps skipped because a gradient overflowed the loss scale (the whole run's).
    pub skipped_steps: u64,
}

/// Mean loss over `batches` (each weighted by its size).
pub fn mean_loss(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<f32> {
    rtx_core::train::mean_loss(model, batches)
}

/// Trains a fresh seeded GPT on the corpus; returns it with the report.
pub fn train_gpt(cfg: &GptConfig) -> Result<(Gpt, GptReport)> {
    let Corpus {
        train, validation, ..
    } = load_shakespeare()?;
    train_gpt_on(cfg, &train, &validation)
}

/// Where a run stands between two steps: what a training checkpoint adds to the weights and
/// the optimizer state so that a resumed run takes exactly the steps it would have taken.
#[derive(Clone, Debug, Default)]
struct Progress {
    step: usize,
    /// Epochs whose shuffled order has been drawn; the current one is `epoch - 1`.
    epoch: u64,
    /// Batches of the current epoch already trained on.
    position: usize,
    /// The dropout seed stream of `Ctx`.
    rng: u64,
    seconds: f64,
    tokens: usize,
    window_loss: f64,
    window_steps: usize,
    val_loss: f32,
    /// f16: the loss scaler's state.
    scaler: Option<LossScaler>,
}

impl Progress {
    fn to_meta(&self, cfg: &GptConfig) -> TrainingMeta {
        let mut m = TrainingMeta::new();
        m.set("step", self.step)
            .set("epoch", self.epoch)
            .set("position", self.position)
            .set("rng", self.rng)
            .set("seconds", self.seconds)
            .set("tokens", self.tokens)
            .set("window_loss", self.window_loss)
            .set("window_steps", self.window_steps)
            .set("val_loss", self.val_loss)
            .set("config.steps", cfg.steps)
            .set("config.batch", cfg.batch)
            .set("config.lr", cfg.lr)
            .set("config.warmup", cfg.warmup)
            .set("config.seed", cfg.seed)
            .set("config.context", CONTEXT)
            .set("config.precision", cfg.precision.name());
        if let Some(scaler) = &self.scaler {
            let (scale, good, skipped) = scaler.state();
            m.set("loss_scale", scale)
                .set("loss_scale.good_steps", good)
                .set("loss_scale.skipped", skipped);
        }
        m
    }

    /// The progress saved in `m`, after checking that `cfg` is the configuration it ran with.
    fn from_meta(m: &TrainingMeta, cfg: &GptConfig) -> Result<Progress> {
        let same = |key: &str, flag: &str, now: String| -> Result<()> {
            let saved = m.raw(key).unwrap_or("(none)");
            if saved != now {
                return Err(RtxError::Invalid(format!(
                    "cannot resume: the checkpoint's run used {flag} {saved}, this one {now}; resume with the same settings (the schedule and the data order depend on them)"
                )));
            }
            Ok(())
        };
        same("config.steps", "--steps", cfg.steps.to_string())?;
        same("config.batch", "--batch", cfg.batch.to_string())?;
        same("config.lr", "--lr", cfg.lr.to_string())?;
        same("config.warmup", "warm-up", cfg.warmup.to_string())?;
        same("config.seed", "--seed", cfg.seed.to_string())?;
        same("config.context", "context", CONTEXT.to_string())?;
        // Checkpoints from before mixed precision ran at f32.
        let precision = m.raw("config.precision").unwrap_or("f32");
        if precision != cfg.precision.name() {
            return Err(RtxError::Invalid(format!(
                "cannot resume: the checkpoint's run used --precision {precision}, this one {}; resume with the same settings",
                cfg.precision.name()
            )));
        }
        let scaler = match cfg.precision {
            Precision::F16 => {
                let mut scaler = LossScaler::new();
                scaler.set_state(
                    m.get("loss_scale")?,
                    m.get("loss_scale.good_steps")?,
                    m.get("loss_scale.skipped")?,
                )?;
                Some(scaler)
            }
            _ => None,
        };
        Ok(Progress {
            step: m.get("step")?,
            epoch: m.get("epoch")?,
            position: m.get("position")?,
            rng: m.get("rng")?,
            seconds: m.get("seconds")?,
            tokens: m.get("tokens")?,
            window_loss: m.get("window_loss")?,
            window_steps: m.get("window_steps")?,
            val_loss: m.get("val_loss")?,
            scaler,
        })
    }
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
    if !cfg.device.is_cpu() {
        val_batches = val_batches
            .iter()
            .map(|(x, y)| Ok((x.to(&cfg.device)?, y.to(&cfg.device)?)))
            .collect::<Result<_>>()?;
    }
    let mut model = Gpt::init(cfg.seed);
    model.to(&cfg.device)?;
    let mut opt = AdamW::new(cfg.lr).weight_decay(0.1).betas(0.9, 0.99);
    let schedule = WarmupCosine {
        base: cfg.lr,
        min: 0.1 * cfg.lr,
        warmup: cfg.warmup,
        steps: cfg.steps,
    };
    let mut ctx = Ctx::train(cfg.seed).with_precision(cfg.precision);
    let mut at = Progress {
        rng: ctx.rng_state(),
        val_loss: f32::NAN,
        // bf16 has f32's range: like PyTorch, only f16 scales the loss.
        scaler: (cfg.precision == Precision::F16).then(LossScaler::new),
        ..Progress::default()
    };
    let mut epoch_batches = Vec::new().into_iter();
    if let Some(path) = &cfg.resume {
        let meta = load_training(path, &mut model, &mut opt)?;
        at = Progress::from_meta(&meta, cfg)?;
        ctx.set_rng_state(at.rng);
        if at.epoch > 0 {
            let mut batches = train_batches.shuffled(cfg.seed ^ (at.epoch - 1))?;
            batches.drain(..at.position.min(batches.len()));
            epoch_batches = batches.into_iter();
        }
    }
    let bar = if cfg.progress {
        let b = ProgressBar::new(cfg.steps as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps {msg}",
        ) {
            b.set_style(style);
        }
        b.set_position(at.step as u64);
        b
    } else {
        ProgressBar::hidden()
    };
    let mut csv = match &cfg.csv {
        Some(path) => Some(open_curve(path, cfg.resume.is_some())?),
        None => None,
    };
    let save = |model: &Gpt, opt: &AdamW, at: &Progress| -> Result<()> {
        match &cfg.checkpoint {
            Some(path) => save_training(path, model, opt, &at.to_meta(cfg)),
            None => Ok(()),
        }
    };
    let mut curve = Vec::new();
    let mut losses = Vec::new();
    let last = cfg.stop_after.map_or(cfg.steps, |s| s.min(cfg.steps));
    while at.step < last {
        let started = Instant::now();
        let (x, y) = match epoch_batches.next() {
            Some(b) => b,
            None => {
                epoch_batches = train_batches.shuffled(cfg.seed ^ at.epoch)?.into_iter();
                at.epoch += 1;
                at.position = 0;
                continue;
            }
        };
        at.position += 1;
        let lr = schedule.lr(at.step);
        let (x, y) = (x.to(&cfg.device)?, y.to(&cfg.device)?);
        let batch = (&x, &y);
        let loss = match at.scaler.as_mut() {
            Some(scaler) => {
                train_step_scaled(&mut model, &mut opt, &mut ctx, batch, lr, Some(1.0), scaler)?.0
            }
            None => train_step(&mut model, &mut opt, &mut ctx, batch, lr, Some(1.0))?,
        };
        at.seconds += started.elapsed().as_secs_f64();
        at.tokens += x.numel();
        at.window_loss += loss as f64;
        at.window_steps += 1;
        at.step += 1;
        at.rng = ctx.rng_state();
        losses.push(loss);
        bar.inc(1);
        let out_of_time = cfg.max_seconds.is_some_and(|s| at.seconds >= s);
        let finished = at.step == cfg.steps || out_of_time;
        // A stop before the end (`stop_after`) evaluates nothing, so the resumed run's curve
        // is the uninterrupted one's.
        if at.step.is_multiple_of(cfg.eval_every.max(1)) || finished {
            at.val_loss = mean_loss(&model, &val_batches)?;
            let point = CurvePoint {
                step: at.step,
                seconds: at.seconds,
                train_loss: (at.window_loss / at.window_steps.max(1) as f64) as f32,
                val_loss: Some(at.val_loss),
            };
            (at.window_loss, at.window_steps) = (0.0, 0);
            bar.set_message(format!(
                "train {:.3} val {:.3} {:.0} tok/s",
                point.train_loss,
                at.val_loss,
                at.tokens as f64 / at.seconds.max(1e-9)
            ));
            if let Some(f) = csv.as_mut() {
                writeln!(
                    f,
                    "{},{:.3},{:.5},{:.5}",
                    point.step, point.seconds, point.train_loss, at.val_loss
                )
                .map_err(io_error)?;
            }
            curve.push(point);
        }
        if at.step.is_multiple_of(cfg.checkpoint_every.max(1)) || finished || at.step == last {
            save(&model, &opt, &at)?;
        }
        if out_of_time {
            break;
        }
    }
    bar.finish_and_clear();
    let report = GptReport {
        steps: at.step,
        val_loss: at.val_loss,
        tokens_per_s: at.tokens as f64 / at.seconds.max(1e-9),
        seconds: at.seconds,
        curve,
        losses,
        skipped_steps: at.scaler.as_ref().map_or(0, |s| s.skipped_steps()),
    };
    model.to(&Device::Cpu)?;
    Ok((model, report))
}

/// The loss-curve CSV: a new file with its header, or, when resuming, the existing one to
/// append to.
fn open_curve(path: &std::path::Path, resuming: bool) -> Result<std::fs::File> {
    let cannot =
        |e: std::io::Error| RtxError::Invalid(format!("cannot write {}: {e}", path.display()));
    if resuming && path.exists() {
        return std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(cannot);
    }
    let mut f = std::fs::File::create(path).map_err(cannot)?;
    writeln!(f, "step,seconds,train_loss,val_loss").map_err(io_error)?;
    Ok(f)
}

fn io_error(e: std::io::Error) -> RtxError {
    RtxError::Invalid(format!("writing the loss curve: {e}"))
}
