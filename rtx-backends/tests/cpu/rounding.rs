//! Autocast's rounding (`scalar::round_bf16`, `round_f16`, `autocast_grad`) against the
//! `half` crate's conversions, over random bit patterns of every exponent and the edges.

use half::{bf16, f16};
use rtx_backends::cpu::scalar::{self, HalfType, Rounding};

/// Random f32 bit patterns (every exponent, both signs, NaNs and infinities included) and
/// the values where rounding changes behaviour.
fn samples() -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut out: Vec<f32> = (0..200_000)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f32::from_bits((state >> 32) as u32)
        })
        .collect();
    out.extend([
        0.0,
        -0.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        6.103_515_6e-5,
        6.1e-5,
        5.960_464_5e-8,
        2.98e-8,
        2.980_232_2e-8,
        1.0e-8,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        1.0 + 1.0 / 2048.0,
    ]);
    out
}

fn same(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
}

#[test]
fn bf16_rounding_matches_the_half_crate_bit_for_bit() {
    for x in samples() {
        let want = bf16::from_f32(x).to_f32();
        assert!(
            same(scalar::round_bf16(x), want),
            "{x:e}: {} vs {want:e}",
            scalar::round_bf16(x)
        );
    }
}

#[test]
fn f16_rounding_matches_the_half_crate_bit_for_bit() {
    for x in samples() {
        let want = f16::from_f32(x).to_f32();
        assert!(
            same(scalar::round_f16(x), want),
            "{x:e}: {:e} vs {want:e}",
            scalar::round_f16(x)
        );
    }
}

#[test]
fn autocast_at_f32_is_the_identity() {
    for x in samples() {
        assert!(same(scalar::autocast(x, Rounding::NONE), x));
        assert!(same(scalar::autocast_grad(x, Rounding::NONE), x));
    }
}

#[test]
fn autocast_grad_rounds_the_gradient_at_its_loss_scale() {
    let r = Rounding::new(HalfType::F16, 1024.0);
    for g in samples().into_iter().filter(|g| g.abs() < 1e30) {
        let want = f16::from_f32(g * 1024.0).to_f32() / 1024.0;
        assert!(same(scalar::autocast_grad(g, r), want), "{g:e}");
    }
}

#[test]
fn rounding_inside_fused_loops_matches_the_half_crate_at_every_simd_level() {
    // The fused loops run the rounding vectorized (one branch-free formula for every
    // precision), so each level's vector code is checked, not only the scalar function.
    let xs: Vec<f32> = samples();
    let n = xs.len();
    let l = rtx_backends::Layout::contiguous(&[n]);
    let (bf, half) = (
        Rounding::new(HalfType::Bf16, 1.0),
        Rounding::new(HalfType::F16, 1024.0),
    );
    let initial = rtx_backends::cpu::simd_level();
    for level in rtx_backends::cpu::simd_levels() {
        assert!(rtx_backends::cpu::set_simd_level(level));
        let [b, h, g, none] = rtx_backends::cpu::map_fused([(&xs[..], &l)], &[n], move |[x]| {
            [
                scalar::autocast(x, bf),
                scalar::autocast(x, half),
                scalar::autocast_grad(x, half),
                scalar::autocast_grad(x, Rounding::NONE),
            ]
        })
        .unwrap();
        for (i, &x) in xs.iter().enumerate() {
            assert!(same(b[i], bf16::from_f32(x).to_f32()), "{level} bf16 {x:e}");
            assert!(same(h[i], f16::from_f32(x).to_f32()), "{level} f16 {x:e}");
            if x.abs() < 1e30 {
                let want = f16::from_f32(x * 1024.0).to_f32() / 1024.0;
                assert!(same(g[i], want), "{level} grad {x:e}");
            }
            assert!(same(none[i], x), "{level} f32 {x:e}");
        }
    }
    rtx_backends::cpu::set_simd_level(initial);
}
