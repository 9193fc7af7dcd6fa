//! Pieces of a training loop that are not the model: learning-rate schedules and gradient
//! clipping by global norm, with PyTorch's meanings, so training code does not write them.

use crate::error::{Result, RtxError};
use crate::module::Grads;
use crate::tensor::{DType, Tensor};

/// A learning rate for each optimizer step (counted from 0).
pub trait Schedule {
    fn lr(&self, step: usize) -> f32;
}

/// The same rate at every step.
#[derive(Clone, Copy, Debug)]
pub struct Constant(pub f32);

impl Schedule for Constant {
    fn lr(&self, _step: usize) -> f32 {
        self.0
    }
}

/// From `base / warmup` at step 0 up to `base` at step `warmup - 1`, linearly, then `base`
/// (`LinearLR` from `1/warmup` to 1 over the warm-up).
#[derive(Clone, Copy, Debug)]
pub struct LinearWarmup {
    pub base: f32,
    pub warmup: usize,
}

impl Schedule for LinearWarmup {
    fn lr(&self, step: usize) -> f32 {
        if step >= self.warmup {
            return self.base;
        }
        self.base * (step + 1) as f32 / self.warmup as f32
    }
}

/// Cosine decay from `base` at step 0 to `min` at step `steps` (and after), PyTorch's
/// `CosineAnnealingLR` with `eta_min = min`, `T_max = steps`.
#[derive(Clone, Copy, Debug)]
pub struct Cosine {
    pub base: f32,
    pub min: f32,
    pub steps: usize,
}

impl Schedule for Cosine {
    fn lr(&self, step: usize) -> f32 {
        let progress = step.min(self.steps) as f32 / self.steps.max(1) as f32;
        self.min + (self.base - self.min) * 0.5 * (1.0 + (std::f32::consts::PI * progress).cos())
    }
}

/// A linear warm-up, then cosine decay over the remaining steps: the usual transformer
/// schedule.
#[derive(Clone, Copy, Debug)]
pub struct WarmupCosine {
    pub base: f32,
    pub min: f32,
    pub warmup: usize,
    pub steps: usize,
}

impl Schedule for WarmupCosine {
    fn lr(&self, step: usize) -> f32 {
        if step < self.warmup {
            return LinearWarmup {
                base: self.base,
                warmup: self.warmup,
            }
            .lr(step);
        }
        Cosine {
            base: self.base,
            min: self.min,
            steps: self.steps.saturating_sub(self.warmup),
        }
        .lr(step - self.warmup)
    }
}

/// The f64 sum of the squares of `values`, in eight interleaved accumulators (one chain of
/// dependent additions ran at a quarter of the speed and held up every training step).
fn sum_of_squares(values: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = values.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f64::from(v) * f64::from(v);
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(tail) {
        *lane += f64::from(v) * f64::from(v);
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// Scales every gradient by `max_norm / total` when their global L2 norm `total` is above
/// `max_norm` (`torch.nn.utils.clip_grad_norm_`), and returns `total` (before clipping). The
/// norm is summed in f64. A non-finite norm leaves the gradients unchanged and is returned, so
/// the caller can skip the step.
pub fn clip_grad_norm(grads: &mut Grads, max_norm: f32) -> Result<f32> {
    if max_norm.is_nan() || max_norm <= 0.0 {
        return Err(RtxError::Invalid(format!(
            "clip_grad_norm needs a positive max_norm, found {max_norm}"
        )));
    }
    let mut sum = 0.0f64;
    for (_, g) in grads.iter() {
        sum += match g.dtype() {
            // On a device: the squares summed there, one value read back.
            _ if !g.device().is_cpu() => {
                let all = rtx_ir::Op::Sum {
                    axes: (0..g.rank()).collect(),
                    keepdim: false,
                };
                let squares = g.mul(g)?;
                f64::from(crate::ops::run_op(&all, &[&squares], &mut crate::Ctx::eval())?.item()?)
            }
            DType::F32 => sum_of_squares(&g.f32_contiguous()?),
            _ => sum_of_squares(&g.to_vec_f32()?),
        };
    }
    let total = sum.sqrt() as f32;
    if !total.is_finite() || total <= max_norm {
        return Ok(total);
    }
    // PyTorch adds 1e-6 to the norm so a tiny one cannot blow the scale up.
    let factor = max_norm / (total + 1e-6);
    let scale = Tensor::scalar(factor);
    for g in grads.tensors_mut() {
        // In place where the gradient owns its buffer (a compiled call's always do): a
        // product into a new buffer cost a pass over every gradient's memory more.
        match g.f32_in_place() {
            Some(values) => values.iter_mut().for_each(|v| *v *= factor),
            None => *g = g.mul(&scale.to(&g.device())?)?,
        }
    }
    Ok(total)
}
