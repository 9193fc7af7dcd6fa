use rtx_backends::Layout;
use rtx_backends::cpu::{KernelError, gemm_kernels, matmul, matmul_row_sums, matmul_with};

use crate::common::*;

/// Batched [..., M, K] @ [..., K, N] with NumPy batch broadcasting, in f64.
fn matmul_naive(a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let batch_rank = (ra - 2).max(rb - 2);
    let batch_of = |s: &[usize]| -> Vec<usize> {
        let own = &s[..s.len() - 2];
        let mut padded = vec![1; batch_rank - own.len()];
        padded.extend_from_slice(own);
        padded
    };
    let (ba, bb) = (batch_of(sa), batch_of(sb));
    let batch_shape: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let mut out_shape = batch_shape.clone();
    out_shape.extend([m, n]);
    let mut out = vec![0.0; numel(&out_shape)];
    for batch in 0..numel(&batch_shape) {
        let index = unravel(batch, &batch_shape);
        let pick = |own: &[usize]| {
            let i: Vec<usize> = own
                .iter()
                .zip(&index)
                .map(|(&s, &i)| if s == 1 { 0 } else { i })
                .collect();
            ravel(&i, own)
        };
        let (a0, b0) = (pick(&ba) * m * k, pick(&bb) * k * n);
        for i in 0..m {
            for j in 0..n {
                out[batch * m * n + i * n + j] =
                    (0..k).map(|p| a[a0 + i * k + p] * b[b0 + p * n + j]).sum();
            }
        }
    }
    (out, out_shape)
}

fn check(a: &[f32], la: &Layout, b: &[f32], lb: &Layout, what: &str) {
    let (got, shape) = matmul(a, la, b, lb).unwrap();
    let (want, want_shape) = matmul_naive(&read(a, la), &la.shape, &read(b, lb), &lb.shape);
    assert_eq!(shape.as_slice(), &want_shape[..], "{what}: shape");
    let k = la.shape[la.rank() - 1] as f64;
    assert_close(&got, &want, 1e-4 * k.sqrt().max(1.0), 1e-4, what);
}

#[test]
fn matmul_odd_sizes() {
    let mut rng = Rng::new(20);
    for (m, k, n) in [
        (1, 1, 1),
        (17, 33, 65),
        (1, 300, 9),
        (70, 300, 3),
        (5, 7, 300),
        (4, 8, 8),
        (33, 1, 17),
    ] {
        let (a, la) = random_contiguous(&mut rng, &[m, k]);
        let (b, lb) = random_contiguous(&mut rng, &[k, n]);
        check(&a, &la, &b, &lb, &format!("{m}x{k}x{n}"));
    }
}

#[test]
fn matmul_views() {
    let mut rng = Rng::new(21);
    for view_a in ALL_VIEWS {
        for view_b in ALL_VIEWS {
            let (a, la) = random_view(&mut rng, &[3, 13, 11], view_a);
            let (b, lb) = random_view(&mut rng, &[3, 11, 10], view_b);
            check(&a, &la, &b, &lb, &format!("{view_a:?} @ {view_b:?}"));
        }
    }
    // A plain 2-D transpose on each side.
    let (a, la) = random_contiguous(&mut rng, &[40, 30]);
    let (b, lb) = random_contiguous(&mut rng, &[20, 40]);
    check(
        &a,
        &la.permute(&[1, 0]),
        &b,
        &lb.permute(&[1, 0]),
        "aT @ bT",
    );
}

#[test]
fn matmul_of_few_columns_read_along_k_matches_reference() {
    // `h @ W^T` with a classifier's weight W [n, k] row-major: the dot-product path, on one
    // thread and (300 rows) split across threads, with odd lengths for the vector tails.
    let mut rng = Rng::new(23);
    for (m, k, n) in [(300, 200, 10), (7, 33, 16), (50, 5, 1), (9, 47, 3)] {
        let (a, la) = random_contiguous(&mut rng, &[m, k]);
        let (w, lw) = random_contiguous(&mut rng, &[n, k]);
        check(
            &a,
            &la,
            &w,
            &lw.permute(&[1, 0]),
            &format!("{m}x{k} @ ({n}x{k})^T"),
        );
    }
}

#[test]
fn matmul_broadcast_batches() {
    let mut rng = Rng::new(22);
    let cases: [(&[usize], &[usize]); 4] = [
        (&[2, 1, 5, 6], &[3, 6, 7]),
        (&[4, 9, 12], &[12, 5]),
        (&[9, 12], &[2, 2, 12, 5]),
        (&[1, 3, 4], &[2, 1, 4, 6]),
    ];
    for (sa, sb) in cases {
        let (a, la) = random_contiguous(&mut rng, sa);
        let (b, lb) = random_contiguous(&mut rng, sb);
        check(&a, &la, &b, &lb, &format!("{sa:?} @ {sb:?}"));
    }
    // A weight broadcast with stride 0 over an explicit batch axis.
    let (a, la) = random_contiguous(&mut rng, &[6, 8, 10]);
    let (w, lw) = random_contiguous(&mut rng, &[1, 10, 4]);
    check(&a, &la, &w, &lw.broadcast_to(&[6, 10, 4]), "stride-0 batch");
}

#[test]
fn matmul_large_enough_to_split_into_tiles() {
    // More rows than one task's block and more columns than one tile, in parallel.
    let mut rng = Rng::new(23);
    let (a, la) = random_contiguous(&mut rng, &[2, 70, 90]);
    let (b, lb) = random_contiguous(&mut rng, &[90, 520]);
    check(&a, &la, &b, &lb, "2x70x90x520");
}

#[test]
fn matmul_empty_dimensions() {
    let (out, shape) = matmul(
        &[],
        &Layout::contiguous(&[3, 0]),
        &[],
        &Layout::contiguous(&[0, 4]),
    )
    .unwrap();
    assert_eq!(shape.as_slice(), &[3, 4]);
    assert_eq!(out, vec![0.0; 12]);
    let (out, shape) = matmul(
        &[],
        &Layout::contiguous(&[0, 5]),
        &[0.0; 10],
        &Layout::contiguous(&[5, 2]),
    )
    .unwrap();
    assert_eq!((out.len(), shape.as_slice()), (0, &[0, 2][..]));
}

#[test]
fn few_rows_agree_with_the_packed_path() {
    // Up to 4 rows take an unpacked path; the same rows inside a 9-row product take the
    // packed one. K = 300 crosses a K-slice boundary; B is read row-major, transposed (the
    // dot-product path) and with both strides > 1.
    let mut rng = Rng::new(23);
    let (k, n) = (300, 21);
    let a = rng.vec(9 * k);
    let b = rng.vec(2 * k * n);
    let layouts = [
        Layout::contiguous(&[k, n]),
        Layout {
            shape: vec![k, n].into(),
            strides: vec![1, k].into(),
            offset: 0,
        },
        Layout {
            shape: vec![k, n].into(),
            strides: vec![2 * n, 2].into(),
            offset: 1,
        },
    ];
    for lb in &layouts {
        let (all, _) = matmul(&a, &Layout::contiguous(&[9, k]), &b, lb).unwrap();
        for m in 1..=4 {
            let (few, _) = matmul(&a[..m * k], &Layout::contiguous(&[m, k]), &b, lb).unwrap();
            for (x, y) in few.iter().zip(&all[..m * n]) {
                assert!(
                    (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "{m} rows: {x} vs {y}"
                );
            }
        }
        check(&a[..k], &Layout::contiguous(&[1, k]), &b, lb, "one row");
        check(
            &a[..3 * k],
            &Layout::contiguous(&[3, k]),
            &b,
            lb,
            "three rows",
        );
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn every_aarch64_cpu_runs_the_neon_kernel() {
    assert_eq!(
        gemm_kernels().last(),
        Some(&rtx_backends::cpu::GemmKernel::Neon)
    );
}

#[test]
fn every_micro_kernel_this_cpu_runs_matches_the_naive_product() {
    // Odd sizes around every tile edge, a K beyond one slice, and a transposed B.
    let mut rng = Rng::new(24);
    for kernel in gemm_kernels() {
        for (m, k, n) in [(5, 3, 17), (7, 300, 33), (13, 257, 1), (65, 31, 255)] {
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let la = Layout::contiguous(&[m, k]);
            let lb_t = Layout {
                shape: vec![k, n].into(),
                strides: vec![1, k].into(),
                offset: 0,
            };
            for lb in [Layout::contiguous(&[k, n]), lb_t] {
                let (got, _) = matmul_with(kernel, &a, &la, &b, &lb).unwrap();
                let (want, _) = matmul_naive(&read(&a, &la), &la.shape, &read(&b, &lb), &lb.shape);
                let what = format!("{kernel:?} {m}x{k}x{n}");
                assert_close(&got, &want, 1e-4 * (k as f64).sqrt(), 1e-4, &what);
            }
        }
    }
}

/// `[rows, cols]` stored column-major (a transposed operand), and one with padded rows (a
/// narrowed view of a wider matrix), besides the plain row-major layout.
fn operand_layouts(rows: usize, cols: usize) -> [(Layout, usize, &'static str); 3] {
    [
        (Layout::contiguous(&[rows, cols]), rows * cols, "row-major"),
        (
            Layout {
                shape: vec![rows, cols].into(),
                strides: vec![1, rows].into(),
                offset: 0,
            },
            rows * cols,
            "transposed",
        ),
        (
            Layout {
                shape: vec![rows, cols].into(),
                strides: vec![cols + 3, 1].into(),
                offset: 2,
            },
            2 + rows * (cols + 3),
            "padded rows",
        ),
    ]
}

#[test]
fn every_kernel_matches_the_naive_product_on_odd_sizes_and_strided_operands() {
    let mut rng = Rng::new(25);
    let sizes = [
        (1, 7, 13),
        (7, 13, 1),
        (13, 1, 255),
        (255, 257, 7),
        (257, 13, 255),
        (29, 600, 45),
        // Only whole B panels (packed by constant-width copies and 8 x 8 transposes).
        (20, 300, 128),
    ];
    for kernel in gemm_kernels() {
        for (m, k, n) in sizes {
            for (la, a_len, a_kind) in operand_layouts(m, k) {
                for (lb, b_len, b_kind) in operand_layouts(k, n) {
                    let (a, b) = (rng.vec(a_len), rng.vec(b_len));
                    let (got, _) = matmul_with(kernel, &a, &la, &b, &lb).unwrap();
                    let (want, _) =
                        matmul_naive(&read(&a, &la), &la.shape, &read(&b, &lb), &lb.shape);
                    let what = format!("{kernel:?} {m}x{k}x{n}, A {a_kind}, B {b_kind}");
                    assert_close(&got, &want, 1e-4 * (k as f64).sqrt(), 1e-4, &what);
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_naive_product_on_broadcast_batches() {
    let mut rng = Rng::new(26);
    for kernel in gemm_kernels() {
        // A per-batch B, a B shared by every batch (a weight), and broadcasting on both sides.
        for (sa, sb) in [
            (vec![3, 19, 33], vec![3, 33, 20]),
            (vec![2, 3, 40, 17], vec![17, 35]),
            (vec![3, 1, 15, 9], vec![4, 9, 31]),
            // A per-batch row-major B of several panels, packed a band of K rows at a time
            // into every panel (a K of one band and a part, serially and in parallel).
            (vec![2, 3, 70], vec![2, 70, 40]),
            (vec![2, 21, 130], vec![2, 130, 75]),
        ] {
            let (a, la) = random_contiguous(&mut rng, &sa);
            let (b, lb) = random_contiguous(&mut rng, &sb);
            let (got, shape) = matmul_with(kernel, &a, &la, &b, &lb).unwrap();
            let (want, want_shape) = matmul_naive(&read(&a, &la), &sa, &read(&b, &lb), &sb);
            assert_eq!(shape.as_slice(), &want_shape[..]);
            let what = format!("{kernel:?} {sa:?} @ {sb:?}");
            assert_close(&got, &want, 1e-4 * 6.0, 1e-4, &what);
        }
    }
}

#[test]
fn every_kernel_matches_the_naive_product_when_column_blocks_share_one_packed_a() {
    // A few hundred rows against a B too large for L2 (over 1 MiB packed): tasks split the
    // columns, and A is packed once for all of them, per batch, K slice by K slice.
    let mut rng = Rng::new(28);
    for kernel in gemm_kernels() {
        for (sa, sb) in [
            (vec![100, 300], vec![300, 1100]),
            (vec![2, 45, 530], vec![2, 530, 600]),
        ] {
            let (a, la) = random_contiguous(&mut rng, &sa);
            let (b, lb) = random_view(&mut rng, &sb, View::Reversed);
            let (got, _) = matmul_with(kernel, &a, &la, &b, &lb).unwrap();
            let (want, _) = matmul_naive(&read(&a, &la), &sa, &read(&b, &lb), &sb);
            let k = sa[sa.len() - 1] as f64;
            let what = format!("{kernel:?} {sa:?} @ {sb:?}");
            assert_close(&got, &want, 1e-4 * k.sqrt(), 1e-4, &what);
        }
    }
}

#[test]
fn every_kernel_gives_bit_identical_results_on_any_thread_count() {
    let mut rng = Rng::new(27);
    let (m, k, n) = (301, 530, 290);
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    for kernel in gemm_kernels() {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (out, _) = pool.install(|| matmul_with(kernel, &a, &la, &b, &lb).unwrap());
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let one = on(1);
        assert_eq!(one, on(2), "{kernel:?}: 1 vs 2 threads");
        assert_eq!(one, on(3), "{kernel:?}: 1 vs 3 threads");
    }
}

#[test]
fn a_fused_epilogue_matches_matmul_followed_by_the_same_pointwise_code() {
    // relu(a @ b + bias) and the pre-activation as a second output, with the bias broadcast
    // along rows; packed (m = 37), direct (m = 3) and batched products.
    use rtx_backends::cpu::matmul_fused;
    let mut rng = Rng::new(28);
    for (sa, sb) in [
        (vec![37, 19], vec![19, 45]),
        (vec![3, 300], vec![300, 33]),
        (vec![2, 29, 17], vec![17, 40]),
    ] {
        let (a, la) = random_contiguous(&mut rng, &sa);
        let (b, lb) = random_contiguous(&mut rng, &sb);
        let n = sb[sb.len() - 1];
        let (bias, _) = random_contiguous(&mut rng, &[n]);
        let (plain, shape) = matmul(&a, &la, &b, &lb).unwrap();
        let bias_layout = Layout::contiguous(&[n]).broadcast_to(&shape);

        let ([activated, pre], fused_shape) = matmul_fused(
            &a,
            &la,
            &b,
            &lb,
            &[(&bias[..], &bias_layout)],
            |[acc, bias]: [f32; 2]| [(acc + bias).max(0.0), acc + bias],
        )
        .unwrap();

        assert_eq!(fused_shape, shape);
        for (i, &p) in plain.iter().enumerate() {
            let want = p + bias[i % n];
            assert_eq!(pre[i].to_bits(), want.to_bits(), "{sa:?} pre [{i}]");
            assert_eq!(
                activated[i].to_bits(),
                want.max(0.0).to_bits(),
                "{sa:?} [{i}]"
            );
        }
    }
}

#[test]
fn a_fused_epilogue_reads_broadcast_strided_and_offset_extras_on_every_block() {
    // A product split into several tasks, rows wider than one epilogue piece (300 > 256),
    // and three extras read three ways: a row statistic broadcast along the row (column
    // stride 0), a transposed matrix (column stride m), and a view at an offset.
    use rtx_backends::cpu::matmul_fused;
    let mut rng = Rng::new(29);
    let (m, k, n) = (301, 70, 300);
    let (a, la) = random_contiguous(&mut rng, &[m, k]);
    let (b, lb) = random_contiguous(&mut rng, &[k, n]);
    let (plain, shape) = matmul(&a, &la, &b, &lb).unwrap();
    let stat = rng.vec(m);
    let l_stat = Layout {
        shape: vec![m, n].into(),
        strides: vec![1, 0].into(),
        offset: 0,
    };
    let t = rng.vec(m * n);
    let l_t = Layout {
        shape: vec![m, n].into(),
        strides: vec![1, m].into(),
        offset: 0,
    };
    let shifted = rng.vec(m * n + 5);
    let mut l_shifted = Layout::contiguous(&[m, n]);
    l_shifted.offset = 5;

    let ([y, z], _) = matmul_fused(
        &a,
        &la,
        &b,
        &lb,
        &[
            (&stat[..], &l_stat),
            (&t[..], &l_t),
            (&shifted[..], &l_shifted),
        ],
        |[acc, s, t, u]: [f32; 4]| [acc * s + t, (acc - u).max(0.0)],
    )
    .unwrap();

    assert_eq!(shape.as_slice(), &[m, n]);
    for i in 0..m {
        for j in 0..n {
            let e = i * n + j;
            let acc = plain[e];
            let want_y = acc * stat[i] + t[j * m + i];
            let want_z = (acc - shifted[5 + e]).max(0.0);
            assert_eq!(y[e].to_bits(), want_y.to_bits(), "y[{i}, {j}]");
            assert_eq!(z[e].to_bits(), want_z.to_bits(), "z[{i}, {j}]");
        }
    }
}

#[test]
fn matmul_refuses_mismatched_inner_dimensions() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 8]);
    let err = matmul(
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
                kernel: "matmul",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn matmul_refuses_batch_dimensions_that_do_not_broadcast() {
    let (a, b) = (vec![0.0f32; 2 * 6], vec![0.0f32; 3 * 6]);
    let err = matmul(
        &a,
        &Layout::contiguous(&[2, 2, 3]),
        &b,
        &Layout::contiguous(&[3, 3, 2]),
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn matmul_refuses_an_operand_of_rank_one() {
    let (a, b) = (vec![0.0f32; 3], vec![0.0f32; 6]);
    let err = matmul(
        &a,
        &Layout::contiguous(&[3]),
        &b,
        &Layout::contiguous(&[3, 2]),
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn matmul_refuses_a_buffer_too_short_for_its_layout() {
    // b claims [64, 64] but holds one value less: every kernel this CPU runs refuses it.
    let (a, b) = (vec![1.0f32; 64 * 64], vec![1.0f32; 64 * 64 - 1]);
    let l = Layout::contiguous(&[64, 64]);
    for kernel in gemm_kernels() {
        let err = matmul_with(kernel, &a, &l, &b, &l).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::View {
                    kernel: "matmul",
                    arg: "b",
                    ..
                }
            ),
            "{kernel:?}: {err}"
        );
    }
}

#[test]
fn matmul_refuses_an_offset_that_moves_the_operand_past_its_buffer() {
    let a = vec![1.0f32; 6];
    let mut la = Layout::contiguous(&[2, 3]);
    la.offset = 1;
    let err = matmul(&a, &la, &a, &Layout::contiguous(&[3, 2])).unwrap_err();
    assert!(matches!(err, KernelError::View { arg: "a", .. }), "{err}");
}

#[test]
fn matmul_fused_refuses_an_extra_of_another_shape() {
    use rtx_backends::cpu::matmul_fused;
    let (a, b, bias) = (vec![0.0f32; 6], vec![0.0f32; 6], vec![0.0f32; 3]);
    // The product is [2, 2]; the extra is [2, 3].
    let extra = Layout::contiguous(&[3]).broadcast_to(&[2, 3]);
    let err = matmul_fused(
        &a,
        &Layout::contiguous(&[2, 3]),
        &b,
        &Layout::contiguous(&[3, 2]),
        &[(&bias[..], &extra)],
        |[acc, bias]: [f32; 2]| [acc + bias],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "matmul_fused",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn matmul_fused_refuses_a_body_whose_arity_is_not_one_more_than_the_extras() {
    use rtx_backends::cpu::matmul_fused;
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 6]);
    let err = matmul_fused(
        &a,
        &Layout::contiguous(&[2, 3]),
        &b,
        &Layout::contiguous(&[3, 2]),
        &[],
        |[acc, other]: [f32; 2]| [acc + other],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Argument { .. }), "{err}");
}

#[test]
fn row_sums_come_with_the_product_on_every_path() {
    // A weight gradient dY^T @ x with its bias gradient: A is a transposed view. Shapes
    // reach the few-rows path, the narrow path, the packed path with K slices, and one whose
    // tasks split the columns.
    let mut rng = Rng::new(29);
    for (m, k, n) in [
        (3, 50, 40),
        (128, 256, 10),
        (128, 256, 64),
        (100, 300, 1100),
        // A GPT weight gradient: K = 2048 in eight slices, columns split into blocks that
        // share one packing of A (the row sums then come from that packing).
        (128, 2048, 512),
    ] {
        let a_t = rng.vec(k * m);
        let la = Layout::contiguous(&[k, m]).permute(&[1, 0]);
        let (b, lb) = random_contiguous(&mut rng, &[k, n]);

        let (product, sums, shape) = matmul_row_sums(&a_t, &la, &b, &lb).unwrap();

        let (want_product, _) = matmul(&a_t, &la, &b, &lb).unwrap();
        assert_eq!(shape.as_slice(), &[m, n]);
        assert_eq!(product, want_product, "{m}x{k}x{n}: the product");
        let a = read(&a_t, &la);
        for (i, &s) in sums.iter().enumerate() {
            // Summed in K order in f64, then rounded: the same bits as this loop.
            let want = (0..k).map(|p| a[i * k + p] as f32 as f64).sum::<f64>() as f32;
            assert_eq!(s, want, "{m}x{k}x{n}: row {i}");
        }
    }
}

#[test]
fn row_sums_are_bit_identical_on_any_thread_count() {
    let mut rng = Rng::new(30);
    let (m, k, n) = (301, 530, 290);
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| matmul_row_sums(&a, &la, &b, &lb).unwrap().1)
    };
    let one = on(1);
    assert_eq!(one, on(2));
    assert_eq!(one, on(3));
}
