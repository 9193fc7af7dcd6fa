use rtx_backends::Layout;
use rtx_backends::cpu::{
    ConvAlgorithm, KernelError, conv2d, conv2d_grad_input, conv2d_grad_input_with,
    conv2d_grad_weight, conv2d_grad_weight_with, conv2d_with,
};

use crate::common::*;

struct Case {
    x_shape: [usize; 4],
    w_shape: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
}

const CASES: [Case; 11] = [
    // "Same" convolutions (3x3 padding 1, 5x5 padding 2, 1x1): the input gradient is a
    // convolution of the output gradient by the flipped kernel.
    Case {
        x_shape: [2, 3, 8, 8],
        w_shape: [4, 3, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
    },
    Case {
        x_shape: [3, 2, 4, 4],
        w_shape: [5, 2, 5, 5],
        stride: [1, 1],
        padding: [2, 2],
    },
    Case {
        x_shape: [16, 8, 16, 16],
        w_shape: [3, 8, 1, 1],
        stride: [1, 1],
        padding: [0, 0],
    },
    // Strided: the input gradient folds the column gradient back.
    Case {
        x_shape: [2, 3, 7, 6],
        w_shape: [4, 3, 3, 2],
        stride: [2, 1],
        padding: [1, 0],
    },
    Case {
        x_shape: [1, 2, 5, 5],
        w_shape: [3, 2, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
    },
    Case {
        x_shape: [3, 1, 8, 8],
        w_shape: [2, 1, 1, 1],
        stride: [3, 2],
        padding: [0, 2],
    },
    // Enough pixels for several tasks.
    Case {
        x_shape: [8, 4, 24, 24],
        w_shape: [6, 4, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
    },
    // More channels x taps (288) than one K slice of the GEMM holds, and more pixels (576)
    // than one K slice of the weight gradient.
    Case {
        x_shape: [4, 32, 12, 12],
        w_shape: [20, 32, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
    },
    // Output rows one pixel wide: a panel of pixels spans many rows and images.
    Case {
        x_shape: [5, 3, 6, 3],
        w_shape: [4, 3, 3, 3],
        stride: [1, 1],
        padding: [1, 0],
    },
    // Padding as large as the kernel (stride 1): the flipped-kernel window would need a
    // negative padding, so the input gradient folds.
    Case {
        x_shape: [2, 3, 5, 5],
        w_shape: [4, 3, 1, 1],
        stride: [1, 1],
        padding: [1, 1],
    },
    // Padding of kernel - 1: the output is larger than the input.
    Case {
        x_shape: [2, 2, 5, 5],
        w_shape: [3, 2, 3, 3],
        stride: [1, 1],
        padding: [2, 2],
    },
];

fn out_size(case: &Case) -> [usize; 2] {
    std::array::from_fn(|d| {
        (case.x_shape[2 + d] + 2 * case.padding[d] - case.w_shape[2 + d]) / case.stride[d] + 1
    })
}

/// Calls `visit(x_index, w_index, out_index)` for every in-bounds multiply of the convolution.
fn for_each_tap(case: &Case, mut visit: impl FnMut(usize, usize, usize)) {
    let [n, c, h, w] = case.x_shape;
    let [o, _, kh, kw] = case.w_shape;
    let [oh, ow] = out_size(case);
    for ni in 0..n {
        for oi in 0..o {
            for y in 0..oh {
                for x in 0..ow {
                    for ci in 0..c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy =
                                    (y * case.stride[0] + ky) as isize - case.padding[0] as isize;
                                let ix =
                                    (x * case.stride[1] + kx) as isize - case.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xi = ravel(&[ni, ci, iy as usize, ix as usize], &case.x_shape);
                                let wi = ravel(&[oi, ci, ky, kx], &case.w_shape);
                                let yi = ravel(&[ni, oi, y, x], &[n, o, oh, ow]);
                                visit(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// x stored NHWC and viewed as NCHW: a strided, permuted input.
fn channels_last_input(rng: &mut Rng, shape: [usize; 4]) -> (Vec<f32>, Layout) {
    let [n, c, h, w] = shape;
    let (x, l) = random_contiguous(rng, &[n, h, w, c]);
    (x, l.permute(&[0, 3, 1, 2]))
}

#[test]
fn conv2d_forward_and_grads_match_reference() {
    let mut rng = Rng::new(30);
    for case in CASES {
        let (x, lx) = channels_last_input(&mut rng, case.x_shape);
        let (w, lw) = random_view(&mut rng, &case.w_shape, View::Reversed);
        let [oh, ow] = out_size(&case);
        let out_shape = vec![case.x_shape[0], case.w_shape[0], oh, ow];
        let (g, lg) = random_view(&mut rng, &out_shape, View::Narrowed);
        let (xv, wv, gv) = (read(&x, &lx), read(&w, &lw), read(&g, &lg));
        let taps = (case.w_shape[1] * case.w_shape[2] * case.w_shape[3]) as f64;
        let pixels = (case.x_shape[0] * oh * ow) as f64;

        let mut want_y = vec![0.0; numel(&out_shape)];
        let mut want_dx = vec![0.0; xv.len()];
        let mut want_dw = vec![0.0; wv.len()];
        for_each_tap(&case, |xi, wi, yi| {
            want_y[yi] += xv[xi] * wv[wi];
            want_dx[xi] += gv[yi] * wv[wi];
            want_dw[wi] += gv[yi] * xv[xi];
        });
        let what = format!("x {:?} w {:?}", case.x_shape, case.w_shape);

        for algorithm in [ConvAlgorithm::Explicit, ConvAlgorithm::Implicit] {
            let what = format!("{what} {algorithm:?}");
            let (y, shape) =
                conv2d_with(algorithm, &x, &lx, &w, &lw, case.stride, case.padding).unwrap();
            assert_eq!(shape.as_slice(), &out_shape[..]);
            assert_close(
                &y,
                &want_y,
                1e-4 * taps.sqrt(),
                1e-4,
                &format!("forward {what}"),
            );
            let dx = conv2d_grad_input_with(
                algorithm,
                &g,
                &lg,
                &w,
                &lw,
                &case.x_shape,
                case.stride,
                case.padding,
            )
            .unwrap();
            assert_close(
                &dx,
                &want_dx,
                1e-4 * taps.sqrt(),
                1e-4,
                &format!("grad input {what}"),
            );
            let dw = conv2d_grad_weight_with(
                algorithm,
                &x,
                &lx,
                &g,
                &lg,
                &case.w_shape,
                case.stride,
                case.padding,
            )
            .unwrap();
            assert_close(
                &dw,
                &want_dw,
                1e-4 * pixels.sqrt(),
                1e-4,
                &format!("grad weight {what}"),
            );
        }
    }
}

#[test]
fn conv2d_refuses_a_weight_with_other_input_channels() {
    let (x, w) = (vec![0.0f32; 2 * 3 * 5 * 5], vec![0.0f32; 4 * 2 * 3 * 3]);
    let err = conv2d(
        &x,
        &Layout::contiguous(&[2, 3, 5, 5]),
        &w,
        &Layout::contiguous(&[4, 2, 3, 3]),
        [1, 1],
        [0, 0],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "conv2d",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn conv2d_refuses_a_kernel_larger_than_the_padded_input() {
    let (x, w) = (vec![0.0f32; 4 * 4], vec![0.0f32; 7 * 7]);
    let err = conv2d(
        &x,
        &Layout::contiguous(&[1, 1, 4, 4]),
        &w,
        &Layout::contiguous(&[1, 1, 7, 7]),
        [1, 1],
        [1, 1],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn conv2d_refuses_a_zero_stride() {
    let (x, w) = (vec![0.0f32; 4 * 4], vec![0.0f32; 3 * 3]);
    let err = conv2d(
        &x,
        &Layout::contiguous(&[1, 1, 4, 4]),
        &w,
        &Layout::contiguous(&[1, 1, 3, 3]),
        [1, 0],
        [0, 0],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Argument { .. }), "{err}");
}

#[test]
fn conv2d_refuses_an_input_of_rank_three() {
    let (x, w) = (vec![0.0f32; 3 * 4 * 4], vec![0.0f32; 3 * 3 * 3]);
    let err = conv2d(
        &x,
        &Layout::contiguous(&[3, 4, 4]),
        &w,
        &Layout::contiguous(&[1, 3, 3, 3]),
        [1, 1],
        [0, 0],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn conv2d_grad_input_refuses_a_gradient_of_another_shape_than_the_output() {
    // x [1, 1, 5, 5] by w [2, 1, 3, 3] gives [1, 2, 3, 3]; the gradient has one channel.
    let (g, w) = (vec![0.0f32; 9], vec![0.0f32; 2 * 9]);
    let err = conv2d_grad_input(
        &g,
        &Layout::contiguous(&[1, 1, 3, 3]),
        &w,
        &Layout::contiguous(&[2, 1, 3, 3]),
        &[1, 1, 5, 5],
        [1, 1],
        [0, 0],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "conv2d_grad_input",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn conv2d_grad_weight_refuses_a_gradient_of_another_shape_than_the_output() {
    // x [1, 1, 5, 5] by a [2, 1, 3, 3] weight gives [1, 2, 3, 3]; the gradient is 4 x 4.
    let (x, g) = (vec![0.0f32; 25], vec![0.0f32; 2 * 16]);
    let err = conv2d_grad_weight(
        &x,
        &Layout::contiguous(&[1, 1, 5, 5]),
        &g,
        &Layout::contiguous(&[1, 2, 4, 4]),
        &[2, 1, 3, 3],
        [1, 1],
        [0, 0],
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn a_channels_last_input_gives_the_same_bits_as_a_contiguous_one() {
    // The column matrix is read through the input's strides, so the packed panels, and with
    // them the products, are identical.
    let mut rng = Rng::new(31);
    for (x_shape, w_shape, pad) in [
        ([2, 3, 8, 8], [4, 3, 3, 3], 1),
        ([3, 2, 4, 4], [5, 2, 5, 5], 2),
        ([16, 8, 16, 16], [3, 8, 1, 1], 0),
    ] {
        let (x, lx) = random_contiguous(&mut rng, &x_shape);
        let (w, lw) = random_contiguous(&mut rng, &w_shape);
        let [_, c, h, wd] = x_shape;
        let mut nhwc = vec![0.0f32; x.len()];
        for (i, &v) in x.iter().enumerate() {
            let [ni, ci, hi, wi] = unravel(i, &x_shape)[..] else {
                unreachable!()
            };
            nhwc[((ni * h + hi) * wd + wi) * c + ci] = v;
        }
        let l_nhwc = Layout {
            shape: lx.shape.clone(),
            strides: smallvec::smallvec![h * wd * c, 1, wd * c, c],
            offset: 0,
        };

        let (contiguous, shape) = conv2d(&x, &lx, &w, &lw, [1, 1], [pad, pad]).unwrap();
        let (channels_last, _) = conv2d(&nhwc, &l_nhwc, &w, &lw, [1, 1], [pad, pad]).unwrap();

        assert_eq!(shape.as_slice(), &[x_shape[0], w_shape[0], h, wd]);
        assert_eq!(contiguous, channels_last, "{x_shape:?} * {w_shape:?}");
    }
}
