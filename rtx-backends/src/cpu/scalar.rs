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
    pattern: Pattern,
}

/// Rounding to a type as constants of one branch-free formula ([`round_with`]), so that every
/// precision, f32 included, is the same arithmetic and the fused loops that round stay
/// vectorized (a `match` on the type inside them kept them scalar: a GPT step at f32 spent
/// 15% of its time in scalar GELU loops that only passed values through at f32).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pattern {
    /// Added to the bits before the dropped ones are cleared: half a unit in the last place
    /// kept, less one (ties then go up only from an odd last bit, `lsb`).
    bias: u32,
    /// Position of the last fraction bit kept, and 1 to read it (0: f32, nothing rounds).
    shift: u32,
    lsb: u32,
    /// The bits kept.
    keep: u32,
    /// Below this magnitude the type is subnormal with a fixed step (f16: 2^-14; 0: never).
    smallest_normal: f32,
    /// From this magnitude on the value rounds to infinity (f16: 65520; bf16 and f32
    /// overflow through the bits themselves).
    overflow: f32,
    /// The loss scale applied around a gradient's rounding (1 at f32: nothing to protect).
    grad_scale: f32,
    grad_inv: f32,
}

impl Pattern {
    const F32: Pattern = Pattern {
        bias: 0,
        shift: 0,
        lsb: 0,
        keep: u32::MAX,
        smallest_normal: 0.0,
        overflow: f32::INFINITY,
        grad_scale: 1.0,
        grad_inv: 1.0,
    };
    const BF16: Pattern = Pattern {
        bias: 0x7FFF,
        shift: 16,
        lsb: 1,
        keep: 0xFFFF_0000,
        ..Pattern::F32
    };
    const F16: Pattern = Pattern {
        bias: 0x0FFF,
        shift: 13,
        lsb: 1,
        keep: 0xFFFF_E000,
        smallest_normal: 6.103_515_6e-5, // 2^-14
        overflow: 65_520.0,
        ..Pattern::F32
    };

    const fn of(to: HalfType) -> Pattern {
        match to {
            HalfType::None => Pattern::F32,
            HalfType::Bf16 => Pattern::BF16,
            HalfType::F16 => Pattern::F16,
        }
    }
}

impl Rounding {
    pub const NONE: Rounding = Rounding::new(HalfType::None, 1.0);

    pub const fn new(to: HalfType, scale: f32) -> Rounding {
        let mut pattern = Pattern::of(to);
        if !matches!(to, HalfType::None) {
            pattern.grad_scale = scale;
            pattern.grad_inv = 1.0 / scale;
        }
        Rounding {
            to,
            scale,
            inv_scale: 1.0 / scale,
            pattern,
        }
    }
}

impl Rounding {
    /// The rounding as the eight words GPU kernels read (`rtx_ir::emit::Meta`): bias, shift,
    /// lsb, keep, then the bits of the smallest normal, overflow, gradient scale and its
    /// inverse, so a GPU rounds with the same constants as [`autocast`] here.
    pub fn words(&self) -> [u32; 8] {
        let p = &self.pattern;
        [
            p.bias,
            p.shift,
            p.lsb,
            p.keep,
            p.smallest_normal.to_bits(),
            p.overflow.to_bits(),
            p.grad_scale.to_bits(),
            p.grad_inv.to_bits(),
        ]
    }
}

/// `x` rounded as `p` says, ties to even: the bits rounded at the last kept fraction bit
/// (bf16 is f32's upper 16 bits; f16's normal range keeps 10 fraction bits), a fixed step
/// of 2^-24 below f16's smallest normal, infinity from f16's 65520 up (the tie between 65504
/// and 65536 goes to the even one, which overflows). NaN stays NaN (adding the bias to a
/// NaN's bits could carry it into an infinity). Selects only, no branches.
#[inline(always)]
fn round_with(x: f32, p: &Pattern) -> f32 {
    const SUBNORMAL_STEP: f32 = 5.960_464_5e-8; // 2^-24
    const STEPS_PER_UNIT: f32 = 16_777_216.0; // 2^24
    // Adding and subtracting 1.5 * 2^23 rounds a value below 2^22 to an integer, ties to even.
    const ROUNDER: f32 = 12_582_912.0;
    let bits = x.to_bits();
    let a = x.abs();
    let normal = f32::from_bits(bits.wrapping_add(p.bias + ((bits >> p.shift) & p.lsb)) & p.keep);
    let subnormal = (((a * STEPS_PER_UNIT) + ROUNDER) - ROUNDER) * SUBNORMAL_STEP;
    let v = if a < p.smallest_normal {
        subnormal.copysign(x)
    } else {
        normal
    };
    let v = if a >= p.overflow {
        f32::INFINITY.copysign(x)
    } else {
        v
    };
    if x.is_nan() { x } else { v }
}

/// `x` rounded to the nearest bf16 (ties to even), as f32.
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    round_with(x, &Pattern::BF16)
}

/// `x` rounded to the nearest IEEE half (ties to even), as f32.
#[inline(always)]
pub fn round_f16(x: f32) -> f32 {
    round_with(x, &Pattern::F16)
}

/// `Autocast`: `x` at the call's precision.
#[inline(always)]
pub fn autocast(x: f32, r: Rounding) -> f32 {
    round_with(x, &r.pattern)
}

/// `AutocastGrad`: `g` as a gradient scaled by the loss scale and stored at the call's
/// precision, unscaled again (exact: the scale is a power of two). At f32, `g`.
#[inline(always)]
pub fn autocast_grad(g: f32, r: Rounding) -> f32 {
    round_with(g * r.pattern.grad_scale, &r.pattern) * r.pattern.grad_inv
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
    let pdf = exp(-0.5 * x * x) * FRAC_1_SQRT_2PI;
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
        1.0 / (1.0 + exp(-x))
    } else {
        let e = exp(x);
        e / (1.0 + e)
    }
}

/// `exp` as a polynomial (Cephes' `expf`: range reduction by ln 2, a degree-6 polynomial,
/// within 2 ulp of the exact value), written with plain arithmetic so the loops around it
/// vectorize: libm's `expf` is a call per value, and so is `floor` on the x86-64 baseline, so
/// the nearest integer comes from adding 1.5 * 2^23 (the integer lands in the low mantissa
/// bits). 2^n is applied as two factors so that results near the ends of the range (down to
/// the subnormals, up to overflow) need no special case; beyond them the result is 0 or
/// infinity, and NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_polynomial::<false>(x)
}

/// [`exp`] with its range reduction and polynomial in fused multiply-adds (`f32::mul_add`,
/// one rounding each): about half the instructions and latency where the CPU has FMA, for the
/// kernels whose loops are mostly exponentials (attention's softmax). Its bits differ from
/// [`exp`]'s in the last place, so a kernel uses one or the other throughout; they are the
/// same at every SIMD level (without FMA, `mul_add` is a correctly rounded library call).
#[inline(always)]
pub fn exp_fused(x: f32) -> f32 {
    exp_polynomial::<true>(x)
}

/// `a * b + c`, in one rounding (`FUSED`) or two.
#[inline(always)]
fn multiply_add<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// The body of [`exp`] (`FUSED` false) and [`exp_fused`]: one algorithm, its multiply-adds
/// rounded once or twice.
#[inline(always)]
fn exp_polynomial<const FUSED: bool>(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    const LO: f32 = -104.0; // exp(LO) rounds to 0
    const HI: f32 = 89.0; // exp(HI) overflows
    let madd = multiply_add::<FUSED>;
    // Comparisons, not `clamp`: NaN fails both and passes through.
    let xc = if x < LO { LO } else { x };
    let xc = if xc > HI { HI } else { xc };
    let t = madd(xc, std::f32::consts::LOG2_E, MAGIC);
    let n = t - MAGIC;
    let r = madd(n, -0.693_359_4, xc);
    let r = madd(n, 2.121_944_4e-4, r);
    let p = madd(1.987_569_1e-4, r, 1.398_199_9e-3);
    let p = madd(p, r, 8.333_452e-3);
    let p = madd(p, r, 4.166_579_6e-2);
    let p = madd(p, r, 1.666_666_5e-1);
    let p = madd(p, r, 0.5);
    let y = madd(p * r, r, r) + 1.0;
    // n in [-150, 129]: 2^n as 2^half * 2^(n - half), each a normal float.
    let n = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let half = n >> 1;
    let low = f32::from_bits((half.wrapping_add(127) << 23) as u32);
    let high = f32::from_bits(((n - half).wrapping_add(127) << 23) as u32);
    let v = y * low * high;
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        v
    }
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
    fn rounding_at_f32_returns_every_value_unchanged_whatever_the_loss_scale() {
        // The macro's `Plain` kernels drop these calls at f32: they must be the identity
        // there, bit for bit, for every value and loss scale.
        let mut specials = vec![
            0.0f32,
            -0.0,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let mut state = 0x9e37_79b9u32;
        for _ in 0..10_000 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            specials.push(f32::from_bits(state));
        }
        for scale in [1.0f32, 1024.0, 65536.0] {
            let r = Rounding::new(HalfType::None, scale);
            for &x in &specials {
                assert_eq!(autocast(x, r).to_bits(), x.to_bits(), "autocast({x:e})");
                let g = autocast_grad(x, r);
                assert!(
                    g.to_bits() == x.to_bits() || (g.is_nan() && x.is_nan()),
                    "autocast_grad({x:e}) at scale {scale} = {g:e}"
                );
            }
        }
    }

    #[test]
    fn exp_is_within_2_ulp_of_f64_over_the_normal_range() {
        assert_within_2_ulp_of_f64_exp("exp", exp);
    }

    fn assert_within_2_ulp_of_f64_exp(name: &str, f: fn(f32) -> f32) {
        let mut x = -87.3f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = f(x) as f64;
            assert!(
                ((got - want) / want).abs() < 2.0 * f32::EPSILON as f64,
                "{name}({x}) = {got}, expected {want}"
            );
            x += 0.0137;
        }
    }

    #[test]
    fn fused_exp_is_within_2_ulp_of_f64_and_keeps_the_ends_of_the_range() {
        assert_within_2_ulp_of_f64_exp("exp_fused", exp_fused);
        assert_eq!(exp_fused(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_fused(-200.0), 0.0);
        assert_eq!(exp_fused(100.0), f32::INFINITY);
        assert!(exp_fused(f32::NAN).is_nan());
        assert_eq!(exp_fused(0.0), 1.0);
    }

    #[test]
    fn exp_underflows_gradually_and_overflows_to_infinity() {
        for x in [-87.5f32, -95.0, -100.0, -103.0] {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            // Subnormal results: within one unit of the smallest subnormal.
            assert!(
                (got - want).abs() <= 1.5e-45,
                "exp({x}) = {got}, expected {want}"
            );
        }
        assert_eq!(exp(-104.5), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
    }

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
