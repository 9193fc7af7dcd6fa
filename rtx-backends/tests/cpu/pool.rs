use rtx_backends::Layout;
use rtx_backends::cpu::{KernelError, avg_pool2d, avg_pool2d_grad, max_pool2d, max_pool2d_grad};

use crate::common::*;

struct Case {
    x_shape: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
}

const CASES: [Case; 5] = [
    Case {
        x_shape: [2, 3, 8, 8],
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
    },
    // The 2x2 path with a last row and column that no window covers.
    Case {
        x_shape: [2, 2, 7, 9],
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
    },
    // Overlapping windows with padding.
    Case {
        x_shape: [2, 2, 7, 6],
        kernel: [3, 3],
        stride: [2, 1],
        padding: [1, 1],
    },
    Case {
        x_shape: [1, 1, 5, 9],
        kernel: [2, 4],
        stride: [1, 3],
        padding: [1, 2],
    },
    // Large enough for the parallel plane split.
    Case {
        x_shape: [16, 8, 20, 20],
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
    },
];

/// Each window's in-bounds input indices (row-major within the window), per output index.
fn windows(case: &Case) -> (Vec<usize>, Vec<Vec<usize>>) {
    let [n, c, h, w] = case.x_shape;
    let out: [usize; 2] = std::array::from_fn(|d| {
        (case.x_shape[2 + d] + 2 * case.padding[d] - case.kernel[d]) / case.stride[d] + 1
    });
    let out_shape = vec![n, c, out[0], out[1]];
    let mut all = Vec::new();
    for linear in 0..numel(&out_shape) {
        let [ni, ci, y, x] = unravel(linear, &out_shape)[..] else {
            unreachable!()
        };
        let mut taps = Vec::new();
        for ky in 0..case.kernel[0] {
            for kx in 0..case.kernel[1] {
                let iy = (y * case.stride[0] + ky) as isize - case.padding[0] as isize;
                let ix = (x * case.stride[1] + kx) as isize - case.padding[1] as isize;
                if iy >= 0 && ix >= 0 && iy < h as isize && ix < w as isize {
                    taps.push(ravel(&[ni, ci, iy as usize, ix as usize], &case.x_shape));
                }
            }
        }
        all.push(taps);
    }
    (out_shape, all)
}

#[test]
fn max_pool_forward_and_grad_match_reference() {
    let mut rng = Rng::new(40);
    for case in CASES {
        for view in [View::Contiguous, View::Reversed, View::Narrowed] {
            // Coarse values so windows contain ties.
            let (x, lx) = make_view(&mut rng, &case.x_shape, view, &mut |r| {
                (r.uniform() * 3.0).round()
            });
            let xv = read(&x, &lx);
            let (out_shape, windows) = windows(&case);
            // A contiguous gradient takes the vectorized 2x2 path, a reversed one the general.
            let g_view = if matches!(view, View::Contiguous) {
                View::Contiguous
            } else {
                View::Reversed
            };
            let (g, lg) = random_view(&mut rng, &out_shape, g_view);
            let gv = read(&g, &lg);
            let mut want_y = Vec::new();
            let mut want_dx = vec![0.0; xv.len()];
            for (o, taps) in windows.iter().enumerate() {
                let first_max = taps
                    .iter()
                    .copied()
                    .fold(None::<usize>, |best, t| match best {
                        Some(b) if xv[t] <= xv[b] => Some(b),
                        _ => Some(t),
                    });
                let first_max = first_max.unwrap();
                want_y.push(xv[first_max]);
                want_dx[first_max] += gv[o];
            }
            let what = format!("{:?} k{:?} {view:?}", case.x_shape, case.kernel);
            let (y, shape) = max_pool2d(&x, &lx, case.kernel, case.stride, case.padding).unwrap();
            assert_eq!(shape.as_slice(), &out_shape[..]);
            assert_close(&y, &want_y, 0.0, 0.0, &format!("max forward {what}"));
            let dx =
                max_pool2d_grad(&x, &lx, &g, &lg, case.kernel, case.stride, case.padding).unwrap();
            assert_close(&dx, &want_dx, 1e-6, 1e-5, &format!("max grad {what}"));
        }
    }
}

#[test]
fn max_pool_propagates_nan_and_routes_the_gradient_to_the_first_nan() {
    for (kernel, stride) in [([2, 2], [2, 2]), ([3, 3], [1, 1])] {
        // One 3x3 plane with a NaN at (1, 1): every window holding it is NaN.
        let mut x = vec![1.0f32, 5.0, 2.0, 3.0, f32::NAN, 0.0, 4.0, 7.0, 6.0];
        x[7] = f32::NAN;
        let lx = Layout::contiguous(&[1, 1, 3, 3]);
        let (y, shape) = max_pool2d(&x, &lx, kernel, stride, [0, 0]).unwrap();
        assert!(y.iter().all(|v| v.is_nan()), "{kernel:?}: {y:?}");
        let g = vec![1.0f32; y.len()];
        let dx = max_pool2d_grad(
            &x,
            &lx,
            &g,
            &Layout::contiguous(&shape),
            kernel,
            stride,
            [0, 0],
        )
        .unwrap();
        // The first NaN in row-major order, (1, 1), takes the window's gradient.
        assert_eq!(dx[4], 1.0, "{kernel:?}: {dx:?}");
        assert_eq!(dx.iter().sum::<f32>(), 1.0, "{kernel:?}: {dx:?}");
    }
}

#[test]
fn avg_pool_forward_and_grad_match_reference() {
    let mut rng = Rng::new(41);
    for case in CASES {
        for view in [View::Contiguous, View::Reversed, View::Broadcast] {
            let (x, lx) = random_view(&mut rng, &case.x_shape, view);
            let xv = read(&x, &lx);
            let (out_shape, windows) = windows(&case);
            let (g, lg) = random_view(&mut rng, &out_shape, View::Narrowed);
            let gv = read(&g, &lg);
            let divisor = (case.kernel[0] * case.kernel[1]) as f64;
            let mut want_y = Vec::new();
            let mut want_dx = vec![0.0; xv.len()];
            for (o, taps) in windows.iter().enumerate() {
                want_y.push(taps.iter().map(|&t| xv[t]).sum::<f64>() / divisor);
                for &t in taps {
                    want_dx[t] += gv[o] / divisor;
                }
            }
            let what = format!("{:?} k{:?} {view:?}", case.x_shape, case.kernel);
            let (y, shape) = avg_pool2d(&x, &lx, case.kernel, case.stride, case.padding).unwrap();
            assert_eq!(shape.as_slice(), &out_shape[..]);
            assert_close(&y, &want_y, 1e-6, 1e-4, &format!("avg forward {what}"));
            let dx = avg_pool2d_grad(
                &g,
                &lg,
                &case.x_shape,
                case.kernel,
                case.stride,
                case.padding,
            )
            .unwrap();
            assert_close(&dx, &want_dx, 1e-6, 1e-4, &format!("avg grad {what}"));
        }
    }
}

#[test]
fn max_pool2d_refuses_a_zero_kernel() {
    let x = vec![0.0f32; 16];
    let err = max_pool2d(
        &x,
        &Layout::contiguous(&[1, 1, 4, 4]),
        [0, 2],
        [1, 1],
        [0, 0],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Argument {
                kernel: "max_pool2d",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn avg_pool2d_refuses_a_zero_stride() {
    let x = vec![0.0f32; 16];
    let err = avg_pool2d(
        &x,
        &Layout::contiguous(&[1, 1, 4, 4]),
        [2, 2],
        [0, 1],
        [0, 0],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Argument { .. }), "{err}");
}

#[test]
fn max_pool2d_grad_refuses_a_gradient_of_another_shape_than_the_output() {
    // A 2 x 2 window with stride 2 over 4 x 4 gives 2 x 2; the gradient is 3 x 3.
    let (x, g) = (vec![0.0f32; 16], vec![0.0f32; 9]);
    let err = max_pool2d_grad(
        &x,
        &Layout::contiguous(&[1, 1, 4, 4]),
        &g,
        &Layout::contiguous(&[1, 1, 3, 3]),
        [2, 2],
        [2, 2],
        [0, 0],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn avg_pool2d_grad_refuses_an_input_shape_of_rank_three() {
    let g = vec![0.0f32; 4];
    let err = avg_pool2d_grad(
        &g,
        &Layout::contiguous(&[1, 2, 2]),
        &[1, 4, 4],
        [2, 2],
        [2, 2],
        [0, 0],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn max_pool_on_even_planes_propagates_nan_and_routes_the_gradient_to_the_first_nan_or_tie() {
    // Two 4x4 planes (the whole-tensor 2x2 path): a NaN late in a window, ties of zeros
    // (relu outputs), and a plain maximum.
    let nan = f32::NAN;
    #[rustfmt::skip]
    let x = vec![
        1.0, 2.0, 0.0, 0.0,
        3.0, nan, 0.0, 0.0,
        5.0, 5.0, -1.0, -2.0,
        5.0, 4.0, -3.0, -0.5,
        // second plane: all equal
        7.0, 7.0, 7.0, 7.0,
        7.0, 7.0, 7.0, 7.0,
        7.0, 7.0, 7.0, 7.0,
        7.0, 7.0, 7.0, 7.0,
    ];
    let lx = Layout::contiguous(&[1, 2, 4, 4]);
    let g: Vec<f32> = (1..=8).map(|v| v as f32).collect();
    let lg = Layout::contiguous(&[1, 2, 2, 2]);

    let (y, _) = max_pool2d(&x, &lx, [2, 2], [2, 2], [0, 0]).unwrap();
    let dx = max_pool2d_grad(&x, &lx, &g, &lg, [2, 2], [2, 2], [0, 0]).unwrap();

    assert!(y[0].is_nan(), "{y:?}");
    assert_eq!(&y[1..], &[0.0, 5.0, -0.5, 7.0, 7.0, 7.0, 7.0]);

    #[rustfmt::skip]
    let want = vec![
        0.0, 0.0, 2.0, 0.0,
        0.0, 1.0, 0.0, 0.0,
        3.0, 0.0, 0.0, 0.0,
        0.0, 0.0, 0.0, 4.0,
        5.0, 0.0, 6.0, 0.0,
        0.0, 0.0, 0.0, 0.0,
        7.0, 0.0, 8.0, 0.0,
        0.0, 0.0, 0.0, 0.0,
    ];
    assert_eq!(dx, want);
}
