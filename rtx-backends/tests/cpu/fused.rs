use rtx_backends::Layout;
use rtx_backends::cpu::{
    KernelError, ReduceOp, map_fused, map_fused_in_place, map_rows, reduce, row_sum, scalar,
    set_simd_level, simd_level, simd_levels,
};

use crate::common::*;

/// The body the tests run: two inputs, two outputs, a few ops.
fn body([a, b]: [f32; 2]) -> [f32; 2] {
    let s = a * 2.0 + b;
    [s.max(0.0), s * b - 0.25]
}

fn check(a: &[f32], la: &Layout, b: &[f32], lb: &Layout, shape: &[usize]) {
    let [y0, y1] = map_fused([(a, la), (b, lb)], shape, body).unwrap();
    let (ra, rb) = (read(a, la), read(b, lb));
    assert_eq!(y0.len(), ra.len());
    for i in 0..ra.len() {
        let want = body([ra[i] as f32, rb[i] as f32]);
        assert_eq!([y0[i], y1[i]], want, "element {i} of {shape:?}");
    }
}

#[test]
fn fused_map_matches_the_body_on_odd_lengths() {
    // Lengths around the 8-lane blocks and the parallel threshold.
    let mut rng = Rng::new(40);
    for n in [1, 7, 8, 9, 255, 257, 40_000, 70_001] {
        let (a, b) = (rng.vec(n), rng.vec(n));
        let l = Layout::contiguous(&[n]);
        check(&a, &l, &b, &l, &[n]);
    }
}

#[test]
fn fused_map_reads_broadcast_and_strided_inputs() {
    let mut rng = Rng::new(41);
    let (a, b) = (rng.vec(6 * 5), rng.vec(5));
    let transposed = Layout {
        shape: vec![5, 6].into(),
        strides: vec![1, 5].into(),
        offset: 0,
    };
    let row = Layout::contiguous(&[5]).broadcast_to(&[6, 5]);
    let col = Layout {
        shape: vec![5, 6].into(),
        strides: vec![1, 0].into(),
        offset: 0,
    };
    check(&a, &Layout::contiguous(&[6, 5]), &b, &row, &[6, 5]);
    check(&a, &transposed, &b, &col, &[5, 6]);
}

#[test]
fn fused_map_of_a_buffer_beyond_the_caches_matches_the_body() {
    // 9M elements x 2 outputs: past the size where stores avoid reading the lines they
    // write (staged or non-temporal, by the machine's last-level cache); every value checked.
    let mut rng = Rng::new(42);
    let n = 9 * 1024 * 1024 + 3;
    let (a, b) = (rng.vec(n), rng.vec(n));
    let l = Layout::contiguous(&[n]);
    let [y0, y1] = map_fused([(&a[..], &l), (&b[..], &l)], &[n], body).unwrap();
    for i in 0..n {
        assert_eq!([y0[i], y1[i]], body([a[i], b[i]]), "element {i}");
    }
}

#[test]
fn map_fused_refuses_an_input_of_another_shape() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 6]);
    let err = map_fused(
        [
            (&a[..], &Layout::contiguous(&[2, 3])),
            (&b[..], &Layout::contiguous(&[3, 2])),
        ],
        &[2, 3],
        body,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "map_fused",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn map_fused_refuses_an_input_that_reads_past_its_buffer() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 5]);
    let l = Layout::contiguous(&[2, 3]);
    let err = map_fused([(&a[..], &l), (&b[..], &l)], &[2, 3], body).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::View {
                arg: "inputs[1]",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn map_rows_refuses_an_input_of_another_shape() {
    let x = [0.0f32; 6];
    let err = map_rows(
        [(&x[..], &Layout::contiguous(&[3, 2]))],
        &[2, 3],
        [true],
        [false],
        |_, _, _, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "map_rows",
                ..
            }
        ),
        "{err}"
    );
}

/// A layer-norm-like row body: the mean of `a * w` per row, and `a * w - mean` written wide.
fn centered_rows(a: &[f32], la: &Layout, w: &[f32], lw: &Layout, shape: &[usize]) -> [Vec<f32>; 2] {
    map_rows(
        [(a, la), (w, lw)],
        shape,
        [true, true],
        [true, false],
        |ins, cols, outs, scratch| {
            let [a, w] = ins;
            let [centered, mean] = outs;
            for (j, s) in scratch[..cols].iter_mut().enumerate() {
                *s = a.at(j) * w.at(j);
            }
            let m = (row_sum(&scratch[..cols]) / cols as f64) as f32;
            for j in 0..cols {
                centered[j] = a.at(j) * w.at(j) - m;
            }
            mean[0] = m;
        },
    )
    .unwrap()
}

#[test]
fn map_rows_reads_transposed_and_broadcast_rows_as_their_contiguous_copies() {
    let mut rng = Rng::new(43);
    let (rows, cols) = (37, 19);
    let a = rng.vec(rows * cols);
    let w = rng.vec(cols);
    let contiguous = Layout::contiguous(&[rows, cols]);
    let a_t: Vec<f32> = (0..rows * cols)
        .map(|i| a[(i % rows) * cols + i / rows])
        .collect();
    let transposed = Layout {
        shape: vec![rows, cols].into(),
        strides: vec![1, rows].into(),
        offset: 0,
    };
    let w_rows: Vec<f32> = (0..rows).flat_map(|_| w.iter().copied()).collect();
    let broadcast = Layout::contiguous(&[cols]).broadcast_to(&[rows, cols]);

    let want = centered_rows(&a, &contiguous, &w_rows, &contiguous, &[rows, cols]);
    let got = centered_rows(&a_t, &transposed, &w, &broadcast, &[rows, cols]);

    assert_eq!(bits(&got[0]), bits(&want[0]));
    assert_eq!(bits(&got[1]), bits(&want[1]));
}

#[test]
fn map_rows_hands_a_row_scalar_its_one_value() {
    let (x, s) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0f32, 20.0]);
    let ls = Layout::contiguous(&[2, 1]).broadcast_to(&[2, 3]);
    let [y] = map_rows(
        [(&x[..], &Layout::contiguous(&[2, 3])), (&s[..], &ls)],
        &[2, 3],
        [true, false],
        [true],
        |ins, cols, outs, _| {
            let [x, s] = ins;
            assert_eq!(s.row().len(), 1);
            for (j, y) in outs[0][..cols].iter_mut().enumerate() {
                *y = x.at(j) + s.at(0);
            }
        },
    )
    .unwrap();
    assert_eq!(y, [11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
}

#[test]
fn row_sum_adds_in_the_order_of_the_last_axis_reduction() {
    // Short, odd, and longer than one reduction piece (16384 values); contiguous and not.
    let mut rng = Rng::new(44);
    for cols in [1, 7, 8, 9, 130, 16_384, 40_001] {
        let rows = 3;
        let x = rng.vec(rows * cols);
        let l = Layout::contiguous(&[rows, cols]);
        let sums: Vec<f32> = x.chunks(cols).map(|r| row_sum(r) as f32).collect();
        let (reduced, _) = reduce(ReduceOp::Sum, &x, &l, &[1], false).unwrap();
        assert_eq!(bits(&sums), bits(&reduced), "{cols} columns");
        // The same rows through a transposed view take the general path.
        let xt: Vec<f32> = (0..rows * cols)
            .map(|i| x[(i % rows) * cols + i / rows])
            .collect();
        let lt = Layout {
            shape: vec![rows, cols].into(),
            strides: vec![1, rows].into(),
            offset: 0,
        };
        let (strided, _) = reduce(ReduceOp::Sum, &xt, &lt, &[1], false).unwrap();
        assert_eq!(bits(&sums), bits(&strided), "{cols} columns, transposed");
    }
}

#[test]
fn fused_loops_give_the_same_bits_at_every_simd_level() {
    let mut rng = Rng::new(45);
    let n = 70_001;
    let (a, b) = (rng.vec(n), rng.vec(n));
    let l = Layout::contiguous(&[n]);
    let gelu = |[x, g]: [f32; 2]| {
        [
            scalar::gelu_tanh_grad(x, g),
            scalar::exp(x) + scalar::sigmoid(g),
        ]
    };
    let initial = simd_level();
    let mut results = Vec::new();
    for level in simd_levels() {
        assert!(set_simd_level(level));
        let [y0, y1] = map_fused([(&a[..], &l), (&b[..], &l)], &[n], gelu).unwrap();
        let rows = centered_rows(
            &a,
            &Layout::contiguous(&[7, n / 7]),
            &b[..n / 7],
            &Layout::contiguous(&[n / 7]).broadcast_to(&[7, n / 7]),
            &[7, n / 7],
        );
        results.push((level, bits(&y0), bits(&y1), bits(&rows[0]), bits(&rows[1])));
    }
    set_simd_level(initial);
    for r in &results[1..] {
        assert!(
            r.1 == results[0].1 && r.2 == results[0].2,
            "{} vs {}",
            r.0,
            results[0].0
        );
        assert!(
            r.3 == results[0].3 && r.4 == results[0].4,
            "rows: {} vs {}",
            r.0,
            results[0].0
        );
    }
}

#[test]
fn fused_map_in_place_matches_the_fresh_buffer_version() {
    // Lengths around the in-place path's 256-value blocks; a broadcast second input.
    let mut rng = Rng::new(46);
    for n in [1, 255, 256, 257, 1000, 70_001] {
        let (a, b) = (rng.vec(n), rng.vec(1));
        let la = Layout::contiguous(&[n]);
        let lb = Layout::contiguous(&[1]).broadcast_to(&[n]);
        let [want0, want1] = map_fused([(&a[..], &la), (&b[..], &lb)], &[n], body).unwrap();
        let [got0, got1] =
            map_fused_in_place([(&[][..], &la), (&b[..], &lb)], &[n], 0, a.clone(), body).unwrap();
        assert_eq!(bits(&got0), bits(&want0), "{n} values");
        assert_eq!(bits(&got1), bits(&want1), "{n} values");
    }
}

#[test]
fn fused_map_over_short_rows_gathers_broadcast_and_strided_inputs_across_pieces() {
    // [7000, 10]: rows shorter than a vector, several parallel pieces that start inside a
    // row; one input a row statistic broadcast along the row, one transposed.
    let mut rng = Rng::new(47);
    let (rows, cols) = (7000, 10);
    let (stat, other) = (rng.vec(rows), rng.vec(rows * cols));
    let broadcast = Layout {
        shape: vec![rows, cols].into(),
        strides: vec![1, 0].into(),
        offset: 0,
    };
    let transposed = Layout {
        shape: vec![rows, cols].into(),
        strides: vec![1, rows].into(),
        offset: 0,
    };
    check(&stat, &broadcast, &other, &transposed, &[rows, cols]);
    check(
        &other,
        &Layout::contiguous(&[rows, cols]),
        &stat,
        &broadcast,
        &[rows, cols],
    );
}

#[test]
fn fused_map_in_place_over_short_rows_matches_the_fresh_buffer_version() {
    let mut rng = Rng::new(48);
    let (rows, cols) = (3000, 10);
    let (a, stat) = (rng.vec(rows * cols), rng.vec(rows));
    let la = Layout::contiguous(&[rows, cols]);
    let lb = Layout {
        shape: vec![rows, cols].into(),
        strides: vec![1, 0].into(),
        offset: 0,
    };
    let shape = [rows, cols];
    let [want0, want1] = map_fused([(&a[..], &la), (&stat[..], &lb)], &shape, body).unwrap();
    let [got0, got1] = map_fused_in_place(
        [(&[][..], &la), (&stat[..], &lb)],
        &shape,
        0,
        a.clone(),
        body,
    )
    .unwrap();
    assert_eq!(bits(&got0), bits(&want0));
    assert_eq!(bits(&got1), bits(&want1));
}
