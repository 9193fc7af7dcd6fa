use rtx_backends::Layout;
use rtx_backends::cpu::{KernelError, ReduceOp, max_grad, reduce, sum_to};

use crate::common::*;

/// Output shape and, per input element, its output index: the reduced axes dropped.
fn reduced_index(shape: &[usize], axes: &[usize], linear: usize) -> (Vec<usize>, usize) {
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let index = unravel(linear, shape);
    let out_index: Vec<usize> = kept.iter().map(|&a| index[a]).collect();
    let at = ravel(&out_index, &out_shape);
    (out_shape, at)
}

fn reduce_naive(op: ReduceOp, x: &[f64], shape: &[usize], axes: &[usize]) -> Vec<f64> {
    let (out_shape, _) = reduced_index(shape, axes, 0);
    let group: usize = axes.iter().map(|&a| shape[a]).product();
    let start = if op == ReduceOp::Max {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let mut out = vec![start; numel(&out_shape)];
    for (linear, &v) in x.iter().enumerate() {
        let (_, at) = reduced_index(shape, axes, linear);
        out[at] = if op == ReduceOp::Max {
            out[at].max(v)
        } else {
            out[at] + v
        };
    }
    if op == ReduceOp::Mean {
        out.iter_mut().for_each(|v| *v /= group as f64);
    }
    out
}

fn keepdim_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    (0..shape.len())
        .filter_map(|a| match (axes.contains(&a), keepdim) {
            (false, _) => Some(shape[a]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

const AXIS_SETS: [&[usize]; 7] = [&[0], &[1], &[2], &[0, 2], &[1, 2], &[0, 1, 2], &[]];

#[test]
fn reduce_matches_reference_on_every_view() {
    let mut rng = Rng::new(10);
    let shape = [4, 5, 6];
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        for view in ALL_VIEWS {
            let (x, l) = random_view(&mut rng, &shape, view);
            let values = read(&x, &l);
            for axes in AXIS_SETS {
                for keepdim in [false, true] {
                    let (got, got_shape) = reduce(op, &x, &l, axes, keepdim).unwrap();
                    assert_eq!(
                        got_shape.as_slice(),
                        &keepdim_shape(&shape, axes, keepdim)[..]
                    );
                    let want = reduce_naive(op, &values, &shape, axes);
                    assert_close(
                        &got,
                        &want,
                        1e-6,
                        1e-4,
                        &format!("{op:?} {view:?} {axes:?} {keepdim}"),
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_long_groups_in_pieces() {
    // 70_000 elements per group: more than one fixed-size piece, combined in order.
    let mut rng = Rng::new(11);
    let (x, l) = random_view(&mut rng, &[2, 70_000], View::Contiguous);
    let values = read(&x, &l);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        let (got, _) = reduce(op, &x, &l, &[1], false).unwrap();
        assert_close(
            &got,
            &reduce_naive(op, &values, &l.shape, &[1]),
            1e-4,
            1e-4,
            &format!("{op:?} rows"),
        );
        let (got, _) = reduce(op, &x, &l, &[0, 1], false).unwrap();
        assert_close(
            &got,
            &reduce_naive(op, &values, &l.shape, &[0, 1]),
            1e-4,
            1e-4,
            &format!("{op:?} all"),
        );
    }
    let t = l.permute(&[1, 0]);
    let (got, shape) = reduce(ReduceOp::Sum, &x, &t, &[0], true).unwrap();
    assert_eq!(shape.as_slice(), &[1, 2]);
    assert_close(
        &got,
        &reduce_naive(ReduceOp::Sum, &read(&x, &t), &t.shape, &[0]),
        1e-4,
        1e-4,
        "transposed",
    );
}

#[test]
fn reduce_propagates_nan_through_max() {
    let x = [1.0, f32::NAN, 3.0, 2.0];
    let (got, _) = reduce(ReduceOp::Max, &x, &Layout::contiguous(&[4]), &[0], false).unwrap();
    assert!(got[0].is_nan());
}

/// Reference: the first position (row-major) of each group's max gets the gradient.
fn max_grad_naive(x: &[f64], shape: &[usize], axes: &[usize], g: &[f64]) -> Vec<f64> {
    let (out_shape, _) = reduced_index(shape, axes, 0);
    let mut best: Vec<Option<(usize, f64)>> = vec![None; numel(&out_shape)];
    for (linear, &v) in x.iter().enumerate() {
        let (_, at) = reduced_index(shape, axes, linear);
        if best[at].is_none_or(|(_, b)| v > b) {
            best[at] = Some((linear, v));
        }
    }
    let mut out = vec![0.0; x.len()];
    for (at, winner) in best.iter().enumerate() {
        if let Some((linear, _)) = winner {
            out[*linear] = g[at];
        }
    }
    out
}

#[test]
fn max_grad_routes_to_first_max_with_ties() {
    let mut rng = Rng::new(12);
    let shape = [3, 4, 5];
    for view in ALL_VIEWS {
        // Four levels only, so most groups have tied maxima.
        let (x, l) = make_view(&mut rng, &shape, view, &mut |r| (r.uniform() * 2.0).round());
        let values = read(&x, &l);
        for axes in [&[0][..], &[1], &[2], &[0, 2], &[0, 1, 2]] {
            for keepdim in [false, true] {
                let g_shape = keepdim_shape(&shape, axes, keepdim);
                let (g, lg) = random_view(
                    &mut rng,
                    &g_shape,
                    if g_shape.is_empty() {
                        View::Contiguous
                    } else {
                        View::Reversed
                    },
                );
                let got = max_grad(&x, &l, &g, &lg, axes, keepdim).unwrap();
                let want = max_grad_naive(&values, &shape, axes, &read(&g, &lg));
                assert_close(
                    &got,
                    &want,
                    0.0,
                    0.0,
                    &format!("{view:?} {axes:?} {keepdim}"),
                );
            }
        }
    }
}

#[test]
fn sum_to_inverts_broadcasting() {
    let mut rng = Rng::new(13);
    let g_shape = [2, 3, 4];
    for view in ALL_VIEWS {
        let (g, lg) = random_view(&mut rng, &g_shape, view);
        let values = read(&g, &lg);
        for target in [
            &[3, 4][..],
            &[3, 1],
            &[1, 4],
            &[4],
            &[1],
            &[],
            &[2, 3, 4],
            &[2, 1, 4],
            &[1, 1, 1],
        ] {
            let want: Vec<f64> = {
                let extra = g_shape.len() - target.len();
                let mut out = vec![0.0; numel(target)];
                for (linear, &v) in values.iter().enumerate() {
                    let index = unravel(linear, &g_shape);
                    let own: Vec<usize> = target
                        .iter()
                        .enumerate()
                        .map(|(i, &n)| if n == 1 { 0 } else { index[extra + i] })
                        .collect();
                    out[ravel(&own, target)] += v;
                }
                out
            };
            assert_close(
                &sum_to(&g, &lg, target).unwrap(),
                &want,
                1e-6,
                1e-4,
                &format!("{view:?} -> {target:?}"),
            );
        }
    }
}

#[test]
fn reduce_refuses_an_axis_out_of_range() {
    let x = vec![0.0f32; 6];
    let err = reduce(ReduceOp::Sum, &x, &Layout::contiguous(&[2, 3]), &[2], false).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "reduce",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn reduce_refuses_an_axis_given_twice() {
    let x = vec![0.0f32; 6];
    let err = reduce(
        ReduceOp::Max,
        &x,
        &Layout::contiguous(&[2, 3]),
        &[1, 1],
        true,
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn max_grad_refuses_a_gradient_of_another_shape_than_the_reduction() {
    // [2, 3] reduced over axis 1 is [2]; the gradient is [3].
    let (x, g) = (vec![0.0f32; 6], vec![0.0f32; 3]);
    let err = max_grad(
        &x,
        &Layout::contiguous(&[2, 3]),
        &g,
        &Layout::contiguous(&[3]),
        &[1],
        false,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "max_grad",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn sum_to_refuses_a_shape_that_does_not_broadcast_to_the_gradient() {
    let g = vec![0.0f32; 6];
    let err = sum_to(&g, &Layout::contiguous(&[2, 3]), &[2]).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "sum_to",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn sum_around_a_middle_axis_adds_each_group_in_row_order() {
    // A convolution's bias gradient: [N, O, H, W] -> [O]; each output must be the f64 sum of
    // its group in row-major order, as the general path computes it.
    let mut rng = Rng::new(90);
    let shape = [3, 4, 5, 6];
    let (x, l) = random_contiguous(&mut rng, &shape);
    for (op, keepdim) in [(ReduceOp::Sum, false), (ReduceOp::Mean, true)] {
        let (got, out_shape) = reduce(op, &x, &l, &[0, 2, 3], keepdim).unwrap();
        let want_shape: &[usize] = if keepdim { &[1, 4, 1, 1] } else { &[4] };
        assert_eq!(out_shape.as_slice(), want_shape);
        for (k, &g) in got.iter().enumerate() {
            let mut sum = 0.0f64;
            for n in 0..3 {
                for i in 0..30 {
                    sum += x[(n * 4 + k) * 30 + i] as f64;
                }
            }
            let want = if op == ReduceOp::Mean {
                sum / 90.0
            } else {
                sum
            } as f32;
            assert_eq!(g.to_bits(), want.to_bits(), "{op:?} output {k}");
        }
    }
}
