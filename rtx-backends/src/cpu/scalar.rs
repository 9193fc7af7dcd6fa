//! The scalar meaning of every pointwise op on the CPU, shared by the one-op kernels in
//! `elementwise.rs` and by the fused kernels the compiler generates (which call these by the
//! names of `rtx_ir::fusion::Pointwise`), so fused and unfused code compute the same bits.

use std::f32::consts::FRAC_1_SQRT_2;

/// 1 / sqrt(2 pi), the normal density's constant.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

#[inline(always)]
pub fn identity(x: f32) -> f32 {
    x
}

#[inline(always)]
pub fn neg(x: f32) -> f32 {
    -x
}

#[inline(always)]
pub fn relu(x: f32) -> f32 {
    if x > 0.0 { x } else { 0.0 }
}

/// Exact erf form, PyTorch's default: `0.5 * x * (1 + erf(x / sqrt(2)))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * FRAC_1_SQRT_2))
}

#[inline(always)]
pub fn gelu_derivative(x: f32) -> f32 {
    let cdf = 0.5 * (1.0 + libm::erff(x * FRAC_1_SQRT_2));
    let pdf = (-0.5 * x * x).exp() * FRAC_1_SQRT_2PI;
    cdf + x * pdf
}

#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    x.tanh()
}

#[inline(always)]
pub fn sin(x: f32) -> f32 {
    x.sin()
}

#[inline(always)]
pub fn cos(x: f32) -> f32 {
    x.cos()
}

/// Split by sign so `exp` never overflows to infinity for large |x|.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

#[inline(always)]
pub fn exp(x: f32) -> f32 {
    x.exp()
}

#[inline(always)]
pub fn log(x: f32) -> f32 {
    x.ln()
}

#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    x.sqrt()
}

#[inline(always)]
pub fn pow(x: f32, p: f32) -> f32 {
    x.powf(p)
}

#[inline(always)]
pub fn add(a: f32, b: f32) -> f32 {
    a + b
}

#[inline(always)]
pub fn sub(a: f32, b: f32) -> f32 {
    a - b
}

#[inline(always)]
pub fn mul(a: f32, b: f32) -> f32 {
    a * b
}

#[inline(always)]
pub fn div(a: f32, b: f32) -> f32 {
    a / b
}

/// `x` = the forward input, `g` = the upstream gradient.
#[inline(always)]
pub fn relu_grad(x: f32, g: f32) -> f32 {
    if x > 0.0 { g } else { 0.0 }
}

/// `x` = the forward input, `g` = the upstream gradient.
#[inline(always)]
pub fn gelu_grad(x: f32, g: f32) -> f32 {
    g * gelu_derivative(x)
}

/// NaN-propagating, like `torch.maximum`.
#[inline(always)]
pub fn maximum(a: f32, b: f32) -> f32 {
    if a >= b || a.is_nan() { a } else { b }
}

/// One step of a max-reduction: `v` replaces `acc` when larger or the first NaN, so NaN
/// propagates and ties keep the earliest value (the rule of `cpu::reduce`).
#[inline(always)]
pub fn max_acc(acc: f32, v: f32) -> f32 {
    if v > acc || (v.is_nan() && !acc.is_nan()) {
        v
    } else {
        acc
    }
}

/// NaN-propagating, like `torch.minimum`.
#[inline(always)]
pub fn minimum(a: f32, b: f32) -> f32 {
    if a <= b || a.is_nan() { a } else { b }
}

#[inline(always)]
fn truth(t: bool) -> f32 {
    if t { 1.0 } else { 0.0 }
}

#[inline(always)]
pub fn gt(a: f32, b: f32) -> f32 {
    truth(a > b)
}

#[inline(always)]
pub fn ge(a: f32, b: f32) -> f32 {
    truth(a >= b)
}

#[inline(always)]
pub fn lt(a: f32, b: f32) -> f32 {
    truth(a < b)
}

#[inline(always)]
pub fn le(a: f32, b: f32) -> f32 {
    truth(a <= b)
}

#[inline(always)]
pub fn eq(a: f32, b: f32) -> f32 {
    truth(a == b)
}

#[inline(always)]
pub fn ne(a: f32, b: f32) -> f32 {
    truth(a != b)
}

/// `a` where `cond` is nonzero, else `b`.
#[inline(always)]
pub fn select(cond: f32, a: f32, b: f32) -> f32 {
    if cond != 0.0 { a } else { b }
}
