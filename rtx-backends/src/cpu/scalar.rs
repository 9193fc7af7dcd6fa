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

/// The low-precision type autocast rounds to (`rtx_ir::Precision`; this crate knows no IR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfType {
    /// No rounding: f32 throughout.
    None,
    Bf16,
    F16,
}

/// How `autocast` and `autocast_grad` round in one call: the type, and a loss scale (a power
/// of two, so scaling and unscaling are exact) applied to gradients around their rounding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rounding {
    pub to: HalfType,
    pub scale: f32,
    pub inv_scale: f32,
}

impl Rounding {
    pub const NONE: Rounding = Rounding {
        to: HalfType::None,
        scale: 1.0,
        inv_scale: 1.0,
    };

    pub fn new(to: HalfType, scale: f32) -> Rounding {
        Rounding {
            to,
            scale,
            inv_scale: 1.0 / scale,
        }
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as f32: bf16 is f32's upper 16 bits. NaN
/// stays NaN (adding the rounding bias to a NaN's bits could carry it into an infinity).
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    if x.is_nan() {
        x
    } else {
        f32::from_bits(rounded)
    }
}

/// `x` rounded to the nearest IEEE half (ties to even), as f32: 10 fraction bits down to
/// 2^-14, a fixed step of 2^-24 below it (subnormals), infinity from 65520 up (the tie
/// between 65504 and 65536 goes to the even one, which overflows).
#[inline(always)]
pub fn round_f16(x: f32) -> f32 {
    const SMALLEST_NORMAL: f32 = 6.103_515_6e-5; // 2^-14
    const SUBNORMAL_STEP: f32 = 5.960_464_5e-8; // 2^-24
    const STEPS_PER_UNIT: f32 = 16_777_216.0; // 2^24
    // Adding and subtracting 1.5 * 2^23 rounds a value below 2^22 to an integer, ties to even.
    const ROUNDER: f32 = 12_582_912.0;
    let a = x.abs();
    let bits = x.to_bits();
    let normal = f32::from_bits(bits.wrapping_add(0x0FFF + ((bits >> 13) & 1)) & 0xFFFF_E000);
    let subnormal = (((a * STEPS_PER_UNIT) + ROUNDER) - ROUNDER) * SUBNORMAL_STEP;
    if a.is_nan() {
        x
    } else if a >= 65_520.0 {
        f32::INFINITY.copysign(x)
    } else if a < SMALLEST_NORMAL {
        subnormal.copysign(x)
    } else {
        normal
    }
}

/// `Autocast`: `x` at the call's precision.
#[inline(always)]
pub fn autocast(x: f32, r: Rounding) -> f32 {
    match r.to {
        HalfType::None => x,
        HalfType::Bf16 => round_bf16(x),
        HalfType::F16 => round_f16(x),
    }
}

/// `AutocastGrad`: `g` as a gradient scaled by the loss scale and stored at the call's
/// precision, unscaled again (exact: the scale is a power of two).
#[inline(always)]
pub fn autocast_grad(g: f32, r: Rounding) -> f32 {
    match r.to {
        HalfType::None => g,
        HalfType::Bf16 => round_bf16(g * r.scale) * r.inv_scale,
        HalfType::F16 => round_f16(g * r.scale) * r.inv_scale,
    }
}

#[inline(always)]
pub fn neg(x: f32) -> f32 {
    -x
}

#[inline(always)]
pub fn relu(x: f32) -> f32 {
    // NaN stays NaN, as in PyTorch (and the float64 reference): a diverged run must show.
    if x > 0.0 || x.is_nan() { x } else { 0.0 }
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

/// Eigen's `generic_fast_tanh_float`: a 13/6 rational function of x on [-7.9, 7.9] (tanh is
/// within an f32 ulp of +-1 outside), at most 4e-7 from tanh (`tanh_is_within_4e7_of_f64`).
/// Written by hand, not libm's `tanhf`, because it is branch-free arithmetic that the compiler
/// vectorizes inside the fused loops: a GPT step spent a fifth of its time in `tanhf`.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    // Comparisons, not `f32::clamp`/`max`: NaN fails both and passes through, and each is
    // one vector compare and select (`max` adds NaN handling that kept the loop scalar).
    let x = if x < -CLAMP { -CLAMP } else { x };
    let x = if x > CLAMP { CLAMP } else { x };
    let x2 = x * x;
    let mut p = -2.760_768_5e-16f32;
    p = p * x2 + 2.000_188e-13;
    p = p * x2 - 8.604_672e-11;
    p = p * x2 + 5.122_297e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    let mut q = 1.198_258_4e-6f32;
    q = q * x2 + 1.185_347_1e-4;
    q = q * x2 + 2.268_434_6e-3;
    q = q * x2 + 4.893_525e-3;
    x * p / q
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

/// sqrt(2 / pi), the tanh approximation's scale.
const GELU_TANH_SCALE: f32 = 0.797_884_6;

/// GELU's tanh approximation (PyTorch's `approximate='tanh'`, GPT-2's), one op with its own
/// derivative so the backward pass needs only x, not the forward's intermediates.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    let t = tanh(GELU_TANH_SCALE * (x + 0.044_715 * x * x * x));
    0.5 * x * (1.0 + t)
}

/// `x` = the forward input, `g` = the upstream gradient.
#[inline(always)]
pub fn gelu_tanh_grad(x: f32, g: f32) -> f32 {
    let x2 = x * x;
    let t = tanh(GELU_TANH_SCALE * (x + 0.044_715 * x2 * x));
    let slope = GELU_TANH_SCALE * (1.0 + 3.0 * 0.044_715 * x2);
    g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_is_within_4e7_of_f64() {
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = (x as f64).tanh();
            let got = tanh(x) as f64;
            assert!(
                (got - want).abs() < 4e-7,
                "tanh({x}) = {got}, expected {want}"
            );
            // Small inputs keep their relative precision (no 1 - 2/(e^2x + 1) cancellation).
            if x.abs() < 1.0 && x != 0.0 {
                assert!(
                    ((got - want) / want).abs() < 1e-6,
                    "tanh({x}) = {got}, expected {want}"
                );
            }
            x += 0.000_37;
        }
    }

    #[test]
    fn tanh_keeps_signed_zero_infinities_and_nan() {
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    #[test]
    fn relu_passes_nan_through_as_pytorch_does() {
        assert!(relu(f32::NAN).is_nan());
        assert_eq!(relu(-2.0), 0.0);
        assert_eq!(relu(3.0), 3.0);
    }
}
