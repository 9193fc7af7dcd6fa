//! The bf16 matmul (bf16 operands, f32 accumulation and results) for every bf16 kernel this
//! CPU runs: against the f64 product of the same bf16 values, within a stated bound of the
//! f32 product of the unrounded values, and bit-identical across thread counts.

use half::bf16;
use rtx_backends::Layout;
use rtx_backends::cpu::{KernelError, bf16_kernels, matmul, matmul_bf16_with};

use crate::common::*;

fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

fn widened(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// `[rows, cols]` row-major and stored column-major (a transposed operand).
fn layouts(rows: usize, cols: usize) -> [Layout; 2] {
    [
        Layout::contiguous(&[rows, cols]),
        Layout {
            shape: vec![rows, cols].into(),
            strides: vec![1, rows].into(),
            offset: 0,
        },
    ]
}

#[test]
fn every_bf16_kernel_matches_the_f64_product_of_the_bf16_values() {
    eprintln!("bf16 kernels on this CPU: {:?}", bf16_kernels());
    let mut rng = Rng::new(40);
    for kernel in bf16_kernels() {
        for (m, k, n) in [
            (1, 7, 13),
            (7, 13, 1),
            (13, 1, 255),
            (255, 257, 7),
            (29, 600, 45),
        ] {
            for la in layouts(m, k) {
                for lb in layouts(k, n) {
                    let (a, b) = (to_bf16(&rng.vec(m * k)), to_bf16(&rng.vec(k * n)));
                    let (got, shape) = matmul_bf16_with(kernel, &a, &la, &b, &lb).unwrap();
                    // The f32 GEMM on the widened values is exact per product, so compare
                    // with an f64 loop over the same values.
                    let (wa, wb) = (widened(&a), widened(&b));
                    let want = naive(&read(&wa, &la), &read(&wb, &lb), m, k, n);
                    assert_eq!(shape.as_slice(), &[m, n]);
                    let what = format!("{kernel:?} {m}x{k}x{n}");
                    assert_close(&got, &want, 1e-4 * (k as f64).sqrt(), 1e-4, &what);
                }
            }
        }
    }
}

#[test]
fn every_bf16_kernel_handles_broadcast_batches() {
    let mut rng = Rng::new(41);
    for kernel in bf16_kernels() {
        let (sa, sb) = ([3, 19, 33], [33, 40]);
        let (a, b) = (to_bf16(&rng.vec(3 * 19 * 33)), to_bf16(&rng.vec(33 * 40)));
        let (la, lb) = (Layout::contiguous(&sa), Layout::contiguous(&sb));
        let (got, shape) = matmul_bf16_with(kernel, &a, &la, &b, &lb).unwrap();
        let (want, _) = matmul(&widened(&a), &la, &widened(&b), &lb).unwrap();
        assert_eq!(shape.as_slice(), &[3, 19, 40]);
        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        assert_close(
            &got,
            &want,
            1e-4 * 6.0,
            1e-4,
            &format!("{kernel:?} batched"),
        );
    }
}

#[test]
fn bf16_results_stay_within_the_rounding_bound_of_the_f32_product() {
    // Rounding each operand to bf16 (8 significant bits) moves each product a_ik * b_kj by at
    // most 2^-7 of its size (2^-8 per operand), so the result moves by at most
    // 2^-7 * sum_k |a_ik b_kj| plus f32 summation error.
    let mut rng = Rng::new(42);
    let (m, k, n) = (64, 300, 48);
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let (exact, _) = matmul(&a, &la, &b, &lb).unwrap();
    for kernel in bf16_kernels() {
        let (got, _) = matmul_bf16_with(kernel, &to_bf16(&a), &la, &to_bf16(&b), &lb).unwrap();
        for i in 0..m {
            for j in 0..n {
                let magnitude: f64 = (0..k)
                    .map(|p| (a[i * k + p] as f64 * b[p * n + j] as f64).abs())
                    .sum();
                let bound = magnitude * (2f64.powi(-7) + 1e-5);
                let err = (got[i * n + j] as f64 - exact[i * n + j] as f64).abs();
                assert!(
                    err <= bound,
                    "{kernel:?} [{i}, {j}]: error {err:e} > bound {bound:e}"
                );
            }
        }
    }
}

#[test]
fn every_bf16_kernel_gives_bit_identical_results_on_any_thread_count() {
    let mut rng = Rng::new(43);
    let (m, k, n) = (301, 530, 290);
    let (a, b) = (to_bf16(&rng.vec(m * k)), to_bf16(&rng.vec(k * n)));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    for kernel in bf16_kernels() {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (out, _) = pool.install(|| matmul_bf16_with(kernel, &a, &la, &b, &lb).unwrap());
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let one = on(1);
        assert_eq!(one, on(2), "{kernel:?}: 1 vs 2 threads");
        assert_eq!(one, on(3), "{kernel:?}: 1 vs 3 threads");
    }
}

fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

#[test]
fn matmul_bf16_refuses_mismatched_inner_dimensions() {
    let (a, b) = (to_bf16(&[0.0; 6]), to_bf16(&[0.0; 8]));
    for kernel in bf16_kernels() {
        let err = matmul_bf16_with(
            kernel,
            &a,
            &Layout::contiguous(&[2, 3]),
            &b,
            &Layout::contiguous(&[4, 2]),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::Shapes {
                    kernel: "matmul_bf16",
                    ..
                }
            ),
            "{kernel:?}: {err}"
        );
    }
}

#[test]
fn matmul_bf16_refuses_a_buffer_too_short_for_its_layout() {
    let (a, b) = (to_bf16(&[1.0; 40 * 40 - 1]), to_bf16(&[1.0; 40 * 40]));
    let l = Layout::contiguous(&[40, 40]);
    for kernel in bf16_kernels() {
        let err = matmul_bf16_with(kernel, &a, &l, &b, &l).unwrap_err();
        assert!(
            matches!(err, KernelError::View { arg: "a", .. }),
            "{kernel:?}: {err}"
        );
    }
}
