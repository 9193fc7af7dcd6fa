//! Built-in layers. Each is a `Module` with PyTorch's parameter names, layouts and default
//! initialization; `graph!` knows their call semantics and shapes from their type parameters.

use crate::module::{Module, with_name};
use crate::rng::Rng;
use crate::tensor::Tensor;

fn uniform(rng: &mut Rng, shape: &[usize], bound: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n).map(|_| rng.uniform(-bound, bound)).collect();
    Tensor::from_kernel(data, shape)
}

fn normal(rng: &mut Rng, shape: &[usize], std: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n).map(|_| rng.normal() * std).collect();
    Tensor::from_kernel(data, shape)
}

/// `y = x W^T + b`; weight stored `[OUT, IN]` like `torch.nn.Linear`.
#[derive(Clone, Debug)]
pub struct Linear<const IN: usize, const OUT: usize> {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl<const IN: usize, const OUT: usize> Module for Linear<IN, OUT> {
    /// PyTorch: kaiming_uniform(a = sqrt 5) for the weight, which is U(-1/sqrt(in), 1/sqrt(in)),
    /// and the same bound for the bias.
    fn init_with(rng: &mut Rng) -> Self {
        let bound = 1.0 / (IN.max(1) as f32).sqrt();
        Linear {
            weight: uniform(rng, &[OUT, IN], bound),
            bias: uniform(rng, &[OUT], bound),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        with_name(prefix, "weight", |name| f(name, &self.weight));
        with_name(prefix, "bias", |name| f(name, &self.bias));
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        with_name(prefix, "weight", |name| f(name, &mut self.weight));
        with_name(prefix, "bias", |name| f(name, &mut self.bias));
    }
}

/// 2-D convolution with a square `K`x`K` kernel; weight `[C_OUT, C_IN, K, K]`, bias `[C_OUT]`.
#[derive(Clone, Debug)]
pub struct Conv2d<
    const C_IN: usize,
    const C_OUT: usize,
    const K: usize,
    const STRIDE: usize = 1,
    const PAD: usize = 0,
> {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl<const C_IN: usize, const C_OUT: usize, const K: usize, const STRIDE: usize, const PAD: usize>
    Module for Conv2d<C_IN, C_OUT, K, STRIDE, PAD>
{
    /// PyTorch: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = C_IN*K*K, weight and bias.
    fn init_with(rng: &mut Rng) -> Self {
        let bound = 1.0 / ((C_IN * K * K).max(1) as f32).sqrt();
        Conv2d {
            weight: uniform(rng, &[C_OUT, C_IN, K, K], bound),
            bias: uniform(rng, &[C_OUT], bound),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        with_name(prefix, "weight", |name| f(name, &self.weight));
        with_name(prefix, "bias", |name| f(name, &self.bias));
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        with_name(prefix, "weight", |name| f(name, &mut self.weight));
        with_name(prefix, "bias", |name| f(name, &mut self.bias));
    }
}

/// Lookup table `[V, D]`; PyTorch initializes it N(0, 1).
#[derive(Clone, Debug)]
pub struct Embedding<const V: usize, const D: usize> {
    pub weight: Tensor,
}

impl<const V: usize, const D: usize> Module for Embedding<V, D> {
    fn init_with(rng: &mut Rng) -> Self {
        Embedding {
            weight: normal(rng, &[V, D], 1.0),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        with_name(prefix, "weight", |name| f(name, &self.weight));
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        with_name(prefix, "weight", |name| f(name, &mut self.weight));
    }
}

/// Layer normalization over the last dimension `D` (eps 1e-5); weight ones, bias zeros.
#[derive(Clone, Debug)]
pub struct LayerNorm<const D: usize> {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl<const D: usize> LayerNorm<D> {
    pub const EPS: f64 = 1e-5;
}

impl<const D: usize> Module for LayerNorm<D> {
    fn init_with(_rng: &mut Rng) -> Self {
        LayerNorm {
            weight: Tensor::full(&[D], 1.0),
            bias: Tensor::zeros(&[D]),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        with_name(prefix, "weight", |name| f(name, &self.weight));
        with_name(prefix, "bias", |name| f(name, &self.bias));
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        with_name(prefix, "weight", |name| f(name, &mut self.weight));
        with_name(prefix, "bias", |name| f(name, &mut self.bias));
    }
}

macro_rules! raw_param {
    ($(#[$doc:meta])* $name:ident, $($d:ident),+) => {
        $(#[$doc])*
        /// Initialized N(0, 0.02), the GPT-2 convention for free parameters (PyTorch leaves
        /// `nn.Parameter` to the user).
        #[derive(Clone, Debug)]
        pub struct $name<$(const $d: usize),+> {
            pub value: Tensor,
        }
        impl<$(const $d: usize),+> Module for $name<$($d),+> {
            fn init_with(rng: &mut Rng) -> Self {
                $name { value: normal(rng, &[$($d),+], 0.02) }
            }
            fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
                f(prefix, &self.value);
            }
            fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
                f(prefix, &mut self.value);
            }
        }
    };
}

raw_param!(/// A free rank-1 parameter `[A]`, named by its field.
    Param1, A);
raw_param!(/// A free rank-2 parameter `[A, B]`, named by its field.
    Param2, A, B);
raw_param!(/// A free rank-3 parameter `[A, B, C]`, named by its field.
    Param3, A, B, C);
raw_param!(/// A free rank-4 parameter `[A, B, C, D]`, named by its field.
    Param4, A, B, C, D);
