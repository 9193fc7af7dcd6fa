//! Optimizers with PyTorch's update formulas (torch.optim.SGD, Adam, AdamW, default
//! arguments as there).
//!
//! A step is one multi-tensor kernel: every parameter with a gradient is gathered with its
//! state (in the model's parameter order), then one parallel pass runs the update over fixed
//! pieces of all of them, in place. Each element's update depends on that element alone, so
//! results never depend on the thread count. State is kept per parameter, in parameter order,
//! under the parameter's name.

use crate::error::{Result, RtxError};
use crate::module::{Grads, Module};
use crate::tensor::{Tensor, fmt_dims};
use rayon::iter::Either;
use rayon::prelude::*;
use std::borrow::Cow;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod device;
mod state;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use rtx_backends::kernel_meta::UpdateRule;
use state::{ParamState, States, align};

pub trait Optimizer {
    /// Updates every parameter that has a gradient in `grads`; others are left alone.
    fn step<M: Module>(&mut self, model: &mut M, grads: &Grads) -> Result<()>;

    /// The learning rate of the next step.
    fn lr(&self) -> f32;

    /// Sets the learning rate of the next steps (a schedule calls this each step).
    fn set_lr(&mut self, lr: f32);

    /// The per-parameter state, as tensors named `{param}.{buffer}` with PyTorch's buffer
    /// names (`exp_avg`, `exp_avg_sq`, `momentum_buffer`) in the parameter's shape, and
    /// `{param}.step` (an i64 scalar), for training checkpoints.
    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>>;

    /// Replaces the state with what `state_tensors` returned (all or nothing: a missing or
    /// malformed tensor is an error and leaves the state as it was). Hyperparameters are not
    /// part of the state; the caller builds the optimizer with the same ones.
    fn load_state_tensors(&mut self, tensors: &[(String, Tensor)]) -> Result<()>;
}

/// The allocations of a step's two lists (gathered parameters, and their slots), kept empty
/// between steps: a model with more parameters than fit inline (the GPT has 50) would
/// otherwise allocate both in every step.
#[derive(Default)]
struct Spare {
    gathered: Vec<(&'static mut Tensor, Cow<'static, [f32]>)>,
    slots: Vec<Slot<'static>>,
}

impl Clone for Spare {
    /// A copy starts with lists of its own.
    fn clone(&self) -> Spare {
        Spare::default()
    }
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spare")
    }
}

/// `v` emptied, as a list of another type of the same size and alignment on the same
/// allocation (the standard library collects a `filter_map` of a vector's `into_iter` in
/// place): how a list of borrowed slots outlives the borrows of one step.
fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// One parameter's part of a step: its values, its gradient, its state buffers (empty when
/// the optimizer keeps none) and per-parameter scalars.
struct Slot<'a> {
    param: &'a mut [f32],
    grad: &'a [f32],
    first: &'a mut [f32],
    second: &'a mut [f32],
    scalars: [f32; 2],
}

/// Elements per piece of the parallel pass; fixed, so the split depends on sizes only.
const PIECE: usize = 16 * 1024;

/// Gathers every parameter of `model` with a gradient in `grads`, aligns `states` to them
/// (`buffers` state buffers each), and runs `update(param, grad, first, second, scalars)`
/// over all of them in one pass; `scalars(state)` gives each parameter's scalars after its
/// step count was incremented.
fn multi_tensor_step<M: Module>(
    model: &mut M,
    grads: &Grads,
    states: &mut States,
    buffers: usize,
    scalars: impl Fn(&ParamState) -> [f32; 2],
    update: impl Fn(&mut [f32], &[f32], &mut [f32], &mut [f32], [f32; 2]) + Sync,
) -> Result<()> {
    // Parameters with a gradient, in visit order, with their gradient's values. A gradient
    // that is not contiguous is copied (compiled models return contiguous ones).
    let States(list, spare) = states;
    let mut gathered: Vec<(&mut Tensor, Cow<'_, [f32]>)> =
        recycle(std::mem::take(&mut spare.gathered));
    let mut first_err = None;
    model.visit_params_mut("", &mut |name, t| {
        if first_err.is_some() {
            return;
        }
        let Some(g) = grads.get(name) else { return };
        if g.shape() != t.shape() {
            first_err = Some(RtxError::ShapeMismatch {
                context: format!("gradient of `{name}`"),
                expected: fmt_dims(t.shape()),
                found: fmt_dims(g.shape()),
            });
            return;
        }
        match g.f32_contiguous() {
            Ok(values) => match align(list, gathered.len(), name, t.shape(), buffers) {
                Ok(()) => gathered.push((t, values)),
                Err(e) => first_err = Some(e),
            },
            Err(e) => first_err = Some(e),
        }
    });
    if let Some(e) = first_err {
        spare.gathered = recycle(gathered);
        return Err(e);
    }
    let mut slots: Vec<Slot<'_>> = recycle(std::mem::take(&mut spare.slots));
    let result = fill_and_run(&mut gathered, list, &mut slots, &scalars, &update);
    spare.slots = recycle(slots);
    spare.gathered = recycle(gathered);
    result
}

/// Lends each gathered parameter with its gradient and state to `slots` and runs the update
/// over them.
fn fill_and_run<'a>(
    gathered: &'a mut [(&mut Tensor, Cow<'_, [f32]>)],
    list: &'a mut [ParamState],
    slots: &mut Vec<Slot<'a>>,
    scalars: &impl Fn(&ParamState) -> [f32; 2],
    update: &(impl Fn(&mut [f32], &[f32], &mut [f32], &mut [f32], [f32; 2]) + Sync),
) -> Result<()> {
    for ((t, grad), state) in gathered.iter_mut().zip(list.iter_mut()) {
        // In place when the model alone holds the parameter's buffer (the usual case after
        // `loss_and_grads`); otherwise the parameter gets a copy of its own first.
        if t.f32_in_place().is_none() {
            let copy = Tensor::from_vec(t.to_vec_f32()?, t.shape())?;
            **t = copy;
        }
        state.steps += 1;
        let scalars = scalars(state);
        let param = t.f32_in_place().ok_or_else(|| {
            RtxError::Invalid("a parameter's buffer is shared after copying it".into())
        })?;
        slots.push(Slot {
            param,
            grad,
            first: &mut state.first,
            second: &mut state.second,
            scalars,
        });
    }
    let total: usize = slots.iter().map(|s| s.param.len()).sum();
    if total <= 4 * PIECE {
        for s in slots.iter_mut() {
            update(s.param, s.grad, s.first, s.second, s.scalars);
        }
        return Ok(());
    }
    slots
        .par_iter_mut()
        .flat_map(|s| {
            let pieces = s.param.len().div_ceil(PIECE);
            let scalars = s.scalars;
            s.param
                .par_chunks_mut(PIECE)
                .zip(s.grad.par_chunks(PIECE))
                .zip(state_pieces(s.first, pieces))
                .zip(state_pieces(s.second, pieces))
                .map(move |(((p, g), a), b)| (p, g, a, b, scalars))
        })
        .for_each(|(p, g, a, b, scalars)| update(p, g, a, b, scalars));
    Ok(())
}

/// A state buffer in `PIECE` pieces, or `pieces` empty slices when the optimizer keeps none.
fn state_pieces(
    buffer: &mut [f32],
    pieces: usize,
) -> impl IndexedParallelIterator<Item = &mut [f32]> {
    if buffer.is_empty() {
        Either::Left(rayon::iter::repeat_n((), pieces).map(|_| <&mut [f32]>::default()))
    } else {
        Either::Right(buffer.par_chunks_mut(PIECE))
    }
}

/// torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay.
#[derive(Clone, Debug)]
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    states: States,
}

impl Sgd {
    pub fn new(lr: f32) -> Sgd {
        Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            states: States::default(),
        }
    }
    pub fn momentum(mut self, m: f32) -> Sgd {
        self.momentum = m;
        self
    }
    pub fn nesterov(mut self, on: bool) -> Sgd {
        self.nesterov = on;
        self
    }
    pub fn weight_decay(mut self, wd: f32) -> Sgd {
        self.weight_decay = wd;
        self
    }
    pub fn dampening(mut self, d: f32) -> Sgd {
        self.dampening = d;
        self
    }
}

impl Optimizer for Sgd {
    fn step<M: Module>(&mut self, model: &mut M, grads: &Grads) -> Result<()> {
        let (lr, momentum, dampening, nesterov, wd) = (
            self.lr,
            self.momentum,
            self.dampening,
            self.nesterov,
            self.weight_decay,
        );
        let buffers = usize::from(momentum != 0.0);
        // scalars[0] is 1 on a parameter's first step: PyTorch starts the momentum buffer at
        // the first gradient, undamped.
        let first_step = |s: &ParamState| [if s.steps == 1 { 1.0 } else { 0.0 }, 0.0];
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if device::on_device(model) {
            return device::step(model, grads, &mut self.states, buffers, |s| {
                UpdateRule::Sgd {
                    lr,
                    momentum,
                    dampening,
                    nesterov,
                    weight_decay: wd,
                    first_step: s.steps == 1,
                }
            });
        }
        multi_tensor_step(
            model,
            grads,
            &mut self.states,
            buffers,
            first_step,
            |p, g, buf, _, [first, _]| {
                if momentum == 0.0 {
                    for (p, &g) in p.iter_mut().zip(g) {
                        *p -= lr * (g + wd * *p);
                    }
                    return;
                }
                for ((p, &g), b) in p.iter_mut().zip(g).zip(buf) {
                    let d = g + wd * *p;
                    *b = if first == 1.0 {
                        d
                    } else {
                        momentum * *b + (1.0 - dampening) * d
                    };
                    let step = if nesterov { d + momentum * *b } else { *b };
                    *p -= lr * step;
                }
            },
        )
    }

    fn lr(&self) -> f32 {
        self.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }

    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.states.to_tensors(SGD_BUFFERS)
    }

    fn load_state_tensors(&mut self, tensors: &[(String, Tensor)]) -> Result<()> {
        let buffers = usize::from(self.momentum != 0.0);
        self.states = States::from_tensors(tensors, SGD_BUFFERS, buffers)?;
        Ok(())
    }
}

const SGD_BUFFERS: [&str; 2] = ["momentum_buffer", ""];
const ADAM_BUFFERS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// torch.optim.Adam (L2 weight decay added to the gradient) and, with `decoupled`, AdamW.
#[derive(Clone, Debug)]
pub struct Adam {
    pub lr: f32,
    pub betas: (f32, f32),
    pub eps: f32,
    pub weight_decay: f32,
    decoupled: bool,
    states: States,
}

impl Adam {
    /// Adam with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn new(lr: f32) -> Adam {
        Adam {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            states: States::default(),
        }
    }
    pub fn betas(mut self, b1: f32, b2: f32) -> Adam {
        self.betas = (b1, b2);
        self
    }
    pub fn eps(mut self, eps: f32) -> Adam {
        self.eps = eps;
        self
    }
    pub fn weight_decay(mut self, wd: f32) -> Adam {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for Adam {
    fn step<M: Module>(&mut self, model: &mut M, grads: &Grads) -> Result<()> {
        let (lr, (b1, b2), eps, wd, decoupled) = (
            self.lr,
            self.betas,
            self.eps,
            self.weight_decay,
            self.decoupled,
        );
        // Bias corrections of each parameter's step count.
        let corrections = |s: &ParamState| [1.0 - b1.powi(s.steps), 1.0 - b2.powi(s.steps)];
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if device::on_device(model) {
            return device::step(model, grads, &mut self.states, 2, |s| {
                let [c1, c2] = corrections(s);
                UpdateRule::Adam {
                    lr,
                    betas: (b1, b2),
                    eps,
                    weight_decay: wd,
                    decoupled,
                    corrections: (c1, c2),
                }
            });
        }
        multi_tensor_step(
            model,
            grads,
            &mut self.states,
            2,
            corrections,
            |p, g, m, v, [bc1, bc2]| {
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                    let mut gi = g;
                    if decoupled {
                        *p *= 1.0 - lr * wd;
                    } else {
                        gi += wd * *p;
                    }
                    *m = b1 * *m + (1.0 - b1) * gi;
                    *v = b2 * *v + (1.0 - b2) * gi * gi;
                    let denom = (*v / bc2).sqrt() + eps;
                    *p -= lr * (*m / bc1) / denom;
                }
            },
        )
    }

    fn lr(&self) -> f32 {
        self.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }

    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.states.to_tensors(ADAM_BUFFERS)
    }

    fn load_state_tensors(&mut self, tensors: &[(String, Tensor)]) -> Result<()> {
        self.states = States::from_tensors(tensors, ADAM_BUFFERS, 2)?;
        Ok(())
    }
}

/// torch.optim.AdamW: decoupled weight decay, default 0.01.
#[derive(Clone, Debug)]
pub struct AdamW(Adam);

impl AdamW {
    pub fn new(lr: f32) -> AdamW {
        AdamW(Adam {
            weight_decay: 0.01,
            decoupled: true,
            ..Adam::new(lr)
        })
    }
    pub fn betas(self, b1: f32, b2: f32) -> AdamW {
        AdamW(self.0.betas(b1, b2))
    }
    pub fn eps(self, eps: f32) -> AdamW {
        AdamW(self.0.eps(eps))
    }
    pub fn weight_decay(self, wd: f32) -> AdamW {
        AdamW(self.0.weight_decay(wd))
    }
}

impl Optimizer for AdamW {
    fn step<M: Module>(&mut self, model: &mut M, grads: &Grads) -> Result<()> {
        self.0.step(model, grads)
    }

    fn lr(&self) -> f32 {
        self.0.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.0.lr = lr;
    }

    fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.0.state_tensors()
    }

    fn load_state_tensors(&mut self, tensors: &[(String, Tensor)]) -> Result<()> {
        self.0.load_state_tensors(tensors)
    }
}
