//! The f16 matmul (f16 operands, f32 accumulation and results): against the f64 product of
//! the same f16 values, within a stated bound of the f32 product of the unrounded values,
//! and bit-identical across thread counts.

use half::f16;
use rtx_backends::Layout;
use rtx_backends::cpu::{KernelError, matmul, matmul_f16};

use crate::common::*;

fn to_f16(x: &[f32]) -> Vec<f16> {
    x.iter().map(|&v| f16::from_f32(v)).collect()
}

fn widened(x: &[f16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

#[test]
fn f16_matmul_matches_the_f64_product_of_the_f16_values() {
    let mut rng = Rng::new(50);
    for (m, k, n) in [
        (1, 7, 13),
        (7, 13, 1),
        (13, 1, 255),
        (255, 257, 7),
        (29, 600, 45),
    ] {
        let transposed_b = Layout {
            shape: vec![k, n].into(),
            strides: vec![1, k].into(),
            offset: 0,
        };
        for lb in [Layout::contiguous(&[k, n]), transposed_b] {
            let la = Layout::contiguous(&[m, k]);
            let (a, b) = (to_f16(&rng.vec(m * k)), to_f16(&rng.vec(k * n)));
            let (got, shape) = matmul_f16(&a, &la, &b, &lb).unwrap();
            let (wa, wb) = (widened(&a), widened(&b));
            let (want, _) = matmul(&wa, &la, &wb, &lb).unwrap();
            assert_eq!(shape.as_slice(), &[m, n]);
            // The widened values are exact, so this is the f32 GEMM on the same numbers.
            assert_eq!(got, want, "{m}x{k}x{n}");
            let exact: Vec<f64> = {
                let (ra, rb) = (read(&wa, &la), read(&wb, &lb));
                (0..m * n)
                    .map(|e| (0..k).map(|p| ra[e / n * k + p] * rb[p * n + e % n]).sum())
                    .collect()
            };
            assert_close(&got, &exact, 1e-4 * (k as f64).sqrt(), 1e-4, "f16 vs f64");
        }
    }
}

#[test]
fn f16_results_stay_within_the_rounding_bound_of_the_f32_product() {
    // Rounding each operand to f16 (11 significant bits) moves each product a_ik * b_kj by at
    // most 2^-10 of its size (2^-11 per operand), so the result moves by at most
    // 2^-10 * sum_k |a_ik b_kj| plus f32 summation error.
    let mut rng = Rng::new(51);
    let (m, k, n) = (64, 300, 48);
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let (exact, _) = matmul(&a, &la, &b, &lb).unwrap();
    let (got, _) = matmul_f16(&to_f16(&a), &la, &to_f16(&b), &lb).unwrap();
    for i in 0..m {
        for j in 0..n {
            let magnitude: f64 = (0..k)
                .map(|p| (a[i * k + p] as f64 * b[p * n + j] as f64).abs())
                .sum();
            let bound = magnitude * (2f64.powi(-10) + 1e-5);
            let err = (got[i * n + j] as f64 - exact[i * n + j] as f64).abs();
            assert!(err <= bound, "[{i}, {j}]: error {err:e} > bound {bound:e}");
        }
    }
}

#[test]
fn f16_matmul_is_bit_identical_on_any_thread_count() {
    let mut rng = Rng::new(52);
    let (m, k, n) = (301, 530, 290);
    let (a, b) = (to_f16(&rng.vec(m * k)), to_f16(&rng.vec(k * n)));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (out, _) = pool.install(|| matmul_f16(&a, &la, &b, &lb).unwrap());
        out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    let one = on(1);
    assert_eq!(one, on(2), "1 vs 2 threads");
    assert_eq!(one, on(3), "1 vs 3 threads");
}

#[test]
fn f16_matmul_refuses_mismatched_inner_dimensions() {
    let (a, b) = (to_f16(&[0.0; 6]), to_f16(&[0.0; 8]));
    let err = matmul_f16(
        &a,
        &Layout::contiguous(&[2, 3]),
        &b,
        &Layout::contiguous(&[4, 2]),
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}
