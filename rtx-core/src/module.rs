//! `Module`: what every layer and every `#[model]` struct is: seeded init and a visitor over
//! its parameters with PyTorch-style dotted names (`fc1.weight`).

use crate::rng::Rng;
use crate::tensor::Tensor;

pub trait Module {
    /// Fresh parameters drawn from `rng` with PyTorch's default scheme for each layer.
    fn init_with(rng: &mut Rng) -> Self
    where
        Self: Sized;

    /// Calls `f` on every parameter, in declaration order, with its dotted name under `prefix`.
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor));

    /// Like `visit_params`, with mutable access (optimizers, checkpoint loading).
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor));

    /// Seeded init: the same seed gives the same parameters on every machine.
    fn init(seed: u64) -> Self
    where
        Self: Sized,
    {
        Self::init_with(&mut Rng::new(seed))
    }

    /// Total number of scalar parameters.
    fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit_params("", &mut |_, t| n += t.numel());
        n
    }

    /// `(name, tensor)` for every parameter, in declaration order.
    fn named_params(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_params("", &mut |name, t| out.push((name.to_string(), t.clone())));
        out
    }
}

/// `prefix.name`, or `name` at the top level.
pub fn join_name(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Gradients of a scalar with respect to every parameter, in the model's parameter order.
#[derive(Clone, Debug, Default)]
pub struct Grads {
    entries: Vec<(String, Tensor)>,
}

impl Grads {
    pub fn new() -> Grads {
        Grads::default()
    }

    pub fn push(&mut self, name: &str, grad: Tensor) {
        self.entries.push((name.to_string(), grad));
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(n, t)| (n.as_str(), t))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
