//! Optimizers with PyTorch's update formulas (torch.optim.SGD, Adam, AdamW, default
//! arguments as there). State is kept per parameter name.

use crate::error::{Result, RtxError};
use crate::module::{Grads, Module};
use crate::tensor::{Tensor, fmt_dims};
use std::collections::HashMap;

pub trait Optimizer {
    /// Updates every parameter that has a gradient in `grads`; others are left alone.
    fn step<M: Module>(&mut self, model: &mut M, grads: &Grads) -> Result<()>;
}

/// Applies `update(name, param, grad)` to each parameter with a gradient.
fn for_each_param<M: Module>(
    model: &mut M,
    grads: &Grads,
    mut update: impl FnMut(&str, &mut [f32], &[f32]),
) -> Result<()> {
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
        let g = match g.f32_contiguous() {
            Ok(g) => g,
            Err(e) => {
                first_err = Some(e);
                return;
            }
        };
        // In place when the model alone holds the parameter's buffer (the usual case after
        // `loss_and_grads`); otherwise on a copy that replaces it.
        if let Some(p) = t.f32_in_place() {
            update(name, p, &g);
            return;
        }
        let mut p = match t.to_vec_f32() {
            Ok(p) => p,
            Err(e) => {
                first_err = Some(e);
                return;
            }
        };
        update(name, &mut p, &g);
        match Tensor::from_vec(p, t.shape()) {
            Ok(n) => *t = n,
            Err(e) => first_err = Some(e),
        }
    });
    first_err.map_or(Ok(()), Err)
}

/// torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay.
#[derive(Clone, Debug)]
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    buffers: HashMap<String, Vec<f32>>,
}

impl Sgd {
    pub fn new(lr: f32) -> Sgd {
        Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            buffers: HashMap::new(),
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
        let buffers = &mut self.buffers;
        for_each_param(model, grads, |name, p, g| {
            if momentum == 0.0 {
                let update = |p: &mut [f32], g: &[f32], _: &mut [f32], _: &mut [f32]| {
                    for (p, &g) in p.iter_mut().zip(g) {
                        *p -= lr * (g + wd * *p);
                    }
                };
                elementwise_in_chunks(p, g, &mut [], &mut [], update);
                return;
            }
            // PyTorch starts the momentum buffer at the first gradient, undamped.
            let first = !buffers.contains_key(name);
            if first {
                buffers.insert(name.to_string(), vec![0.0; p.len()]);
            }
            let Some(buffer) = buffers.get_mut(name) else {
                return;
            };
            let update = |p: &mut [f32], g: &[f32], b: &mut [f32], _: &mut [f32]| {
                for ((p, &g), b) in p.iter_mut().zip(g).zip(b) {
                    let d = g + wd * *p;
                    *b = if first {
                        d
                    } else {
                        momentum * *b + (1.0 - dampening) * d
                    };
                    let step = if nesterov { d + momentum * *b } else { *b };
                    *p -= lr * step;
                }
            };
            elementwise_in_chunks(p, g, buffer, &mut [], update);
        })
    }
}

#[derive(Clone, Debug)]
struct AdamState {
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

/// torch.optim.Adam (L2 weight decay added to the gradient) and, with `decoupled`, AdamW.
#[derive(Clone, Debug)]
pub struct Adam {
    pub lr: f32,
    pub betas: (f32, f32),
    pub eps: f32,
    pub weight_decay: f32,
    decoupled: bool,
    state: HashMap<String, AdamState>,
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
            state: HashMap::new(),
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
        let state = &mut self.state;
        for_each_param(model, grads, |name, p, g| {
            if !state.contains_key(name) {
                state.insert(
                    name.to_string(),
                    AdamState {
                        m: vec![0.0; p.len()],
                        v: vec![0.0; p.len()],
                        t: 0,
                    },
                );
            }
            let Some(st) = state.get_mut(name) else {
                return;
            };
            st.t += 1;
            let bc1 = 1.0 - b1.powi(st.t);
            let bc2 = 1.0 - b2.powi(st.t);
            let update = |p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
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
            };
            elementwise_in_chunks(p, g, &mut st.m, &mut st.v, update);
        })
    }
}

/// Elements per piece when an update runs in parallel; fixed, and every element's update
/// depends on that element alone, so results never depend on the thread count.
const UPDATE_CHUNK: usize = 16 * 1024;

/// Runs an elementwise update over a parameter, its gradient and up to two state buffers of
/// the same length (empty when unused): in parallel pieces for large parameters, in one pass
/// otherwise.
fn elementwise_in_chunks(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    update: impl Fn(&mut [f32], &[f32], &mut [f32], &mut [f32]) + Sync + Send,
) {
    use rayon::prelude::*;
    if p.len() <= 4 * UPDATE_CHUNK {
        update(p, g, m, v);
        return;
    }
    const C: usize = UPDATE_CHUNK;
    let pieces = p.par_chunks_mut(C).zip(g.par_chunks(C));
    match (m.is_empty(), v.is_empty()) {
        (true, _) => pieces.for_each(|(p, g)| update(p, g, &mut [], &mut [])),
        (false, true) => pieces
            .zip(m.par_chunks_mut(C))
            .for_each(|((p, g), m)| update(p, g, m, &mut [])),
        (false, false) => pieces
            .zip(m.par_chunks_mut(C))
            .zip(v.par_chunks_mut(C))
            .for_each(|(((p, g), m), v)| update(p, g, m, v)),
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
}
