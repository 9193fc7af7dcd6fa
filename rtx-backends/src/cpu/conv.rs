//! 2-D convolution as im2col + the blocked matmul, with both gradients.
//!
//! The column matrix is `[C*KH*KW, N*OH*OW]`: one row per (channel, kernel tap), one column per
//! output pixel of every image. Folding the batch into the columns turns the forward pass and
//! both gradients into a single large matmul each, which keeps all cores busy on small images.

use rayon::prelude::*;

use crate::layout::Layout;

use super::check::{self, KResult};
use super::gemm::matmul_2d;
use super::strided::{PARALLEL_THRESHOLD, contiguous};
use super::window::Window2d;
use crate::pool::Scratch;

/// The window of a convolution of an input of shape `x_shape` by a weight of shape
/// `w_shape`, refused unless both have rank 4, their channels agree, the kernel fits in the
/// padded input and every buffer the convolution builds (the weight, the output, the
/// column matrix) has an element count that fits in memory.
fn conv_window(
    name: &'static str,
    x_shape: &[usize],
    w_shape: &[usize],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Window2d> {
    check::shapes(name, w_shape.len() == 4, || {
        format!("the weight has shape {w_shape:?}, not [O, C, KH, KW]")
    })?;
    let window = Window2d::checked(
        name,
        x_shape,
        [w_shape[2], w_shape[3]],
        stride,
        padding,
        w_shape[0],
    )?;
    check::shapes(name, x_shape[1] == w_shape[1], || {
        format!(
            "the input {x_shape:?} has {} channels, the weight {w_shape:?} expects {}",
            x_shape[1], w_shape[1]
        )
    })?;
    check::elements(name, w_shape)?;
    // The column matrix: [C*KH*KW, N*OH*OW].
    check::elements(
        name,
        &[
            window.channels,
            window.kernel[0],
            window.kernel[1],
            window.batch,
            window.out_size[0],
            window.out_size[1],
        ],
    )?;
    Ok(window)
}

/// x [N, C, H, W], w [O, C, KH, KW] -> [N, O, OH, OW], OH = (H + 2*pad - KH)/stride + 1 (PyTorch, no bias, no dilation/groups). Returns (out, out_shape).
pub fn conv2d(
    x: &[f32],
    lx: &Layout,
    w: &[f32],
    lw: &Layout,
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<(Vec<f32>, crate::layout::Dims)> {
    const K: &str = "conv2d";
    check::view(K, "x", x.len(), lx)?;
    check::view(K, "w", w.len(), lw)?;
    let window = conv_window(K, &lx.shape, &lw.shape, stride, padding)?;
    let out_channels = lw.shape[0];
    let out_shape = window.out_shape(out_channels);
    let (rows, pixels) = (
        window.channels * window.taps(),
        window.batch * window.out_plane(),
    );
    let cols = Scratch(im2col(x, lx, &window));
    let w_flat = Scratch(contiguous(w, lw));
    let out_by_channel = matmul_2d(
        &w_flat,
        &Layout::contiguous(&[out_channels, rows]),
        &cols,
        &Layout::contiguous(&[rows, pixels]),
    );
    // The product is [O, N, OH*OW]; the result wants the batch axis first.
    let plane = window.out_plane();
    let as_batch_first = Layout {
        shape: smallvec::smallvec![window.batch, out_channels, plane],
        strides: smallvec::smallvec![plane, window.batch * plane, 1],
        offset: 0,
    };
    let out_by_channel = Scratch(out_by_channel);
    Ok((contiguous(&out_by_channel, &as_batch_first), out_shape))
}

/// gradient w.r.t. x given upstream g [N,O,OH,OW]; x_shape given
pub fn conv2d_grad_input(
    g: &[f32],
    lg: &Layout,
    w: &[f32],
    lw: &Layout,
    x_shape: &[usize],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Vec<f32>> {
    const K: &str = "conv2d_grad_input";
    check::view(K, "g", g.len(), lg)?;
    check::view(K, "w", w.len(), lw)?;
    let window = conv_window(K, x_shape, &lw.shape, stride, padding)?;
    let out_channels = lw.shape[0];
    check::same_shape(K, "g", lg, &window.out_shape(out_channels))?;
    let (rows, pixels) = (
        window.channels * window.taps(),
        window.batch * window.out_plane(),
    );
    let w_flat = Scratch(contiguous(w, lw));
    let w_transposed = Layout::contiguous(&[out_channels, rows]).permute(&[1, 0]);
    let g_by_channel = Scratch(contiguous(g, &lg.permute(&[1, 0, 2, 3])));
    let cols_grad = matmul_2d(
        &w_flat,
        &w_transposed,
        &g_by_channel,
        &Layout::contiguous(&[out_channels, pixels]),
    );
    Ok(col2im(&Scratch(cols_grad), &window))
}

/// gradient w.r.t. w
pub fn conv2d_grad_weight(
    x: &[f32],
    lx: &Layout,
    g: &[f32],
    lg: &Layout,
    w_shape: &[usize],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Vec<f32>> {
    const K: &str = "conv2d_grad_weight";
    check::view(K, "x", x.len(), lx)?;
    check::view(K, "g", g.len(), lg)?;
    let window = conv_window(K, &lx.shape, w_shape, stride, padding)?;
    let out_channels = w_shape[0];
    check::same_shape(K, "g", lg, &window.out_shape(out_channels))?;
    let (rows, pixels) = (
        window.channels * window.taps(),
        window.batch * window.out_plane(),
    );
    let cols = Scratch(im2col(x, lx, &window));
    let g_by_channel = Scratch(contiguous(g, &lg.permute(&[1, 0, 2, 3])));
    let g_transposed = Layout::contiguous(&[out_channels, pixels]).permute(&[1, 0]);
    // Computed as cols @ g^T = dW^T: the long pixel axis is K either way, and this puts the
    // larger C*KH*KW side on M, where the matmul splits work across threads.
    let dw_transposed = matmul_2d(
        &cols,
        &Layout::contiguous(&[rows, pixels]),
        &g_by_channel,
        &g_transposed,
    );
    Ok(contiguous(
        &Scratch(dw_transposed),
        &Layout::contiguous(&[rows, out_channels]).permute(&[1, 0]),
    ))
}

/// Unfolds x into the `[C*KH*KW, N*OH*OW]` column matrix (zeros where a tap hits padding).
/// For each kernel offset the in-bounds outputs of a row are one run (`Window2d::out_range`):
/// a slice copy at stride 1, so only the padding edges are written one by one.
fn im2col(x: &[f32], lx: &Layout, window: &Window2d) -> Vec<f32> {
    let [_, kernel_w] = window.kernel;
    let [_, out_w] = window.out_size;
    let pixels = window.batch * window.out_plane();
    let rows = window.channels * window.taps();
    let mut cols = crate::pool::take(rows * pixels);
    if cols.is_empty() {
        return cols;
    }
    let [stride_n, stride_c, stride_h, stride_w] =
        [lx.strides[0], lx.strides[1], lx.strides[2], lx.strides[3]];
    let (step_w, pad_w) = (window.stride[1], window.padding[1]);
    let fill_row = |row: usize, dst: &mut [f32]| {
        let (channel, tap) = (row / window.taps(), row % window.taps());
        let (tap_h, tap_w) = (tap / kernel_w, tap % kernel_w);
        let (valid_h, valid_w) = (window.out_range(0, tap_h), window.out_range(1, tap_w));
        for (image, dst_image) in dst.chunks_mut(window.out_plane()).enumerate() {
            let base = lx.offset + image * stride_n + channel * stride_c;
            for (oh, dst_row) in dst_image.chunks_mut(out_w).enumerate() {
                if !valid_h.contains(&oh) || valid_w.is_empty() {
                    dst_row.fill(0.0);
                    continue;
                }
                let ih = oh * window.stride[0] + tap_h - window.padding[0];
                if step_w == 1 && stride_w == 1 {
                    let src = &x[base + ih * stride_h..][..window.in_size[1]];
                    let shift = tap_w as isize - pad_w as isize;
                    copy_shifted(src, shift, dst_row);
                    continue;
                }
                dst_row[..valid_w.start].fill(0.0);
                dst_row[valid_w.end..].fill(0.0);
                let first =
                    base + ih * stride_h + (valid_w.start * step_w + tap_w - pad_w) * stride_w;
                let dst_run = &mut dst_row[valid_w.clone()];
                if step_w * stride_w == 1 {
                    // Runs are as short as the image is wide (4 on the CNN's second layer): a
                    // loop the compiler unrolls, not a memcpy call per run.
                    let run = dst_run.len();
                    for (d, &v) in dst_run.iter_mut().zip(&x[first..first + run]) {
                        *d = v;
                    }
                } else {
                    for (k, d) in dst_run.iter_mut().enumerate() {
                        *d = x[first + k * step_w * stride_w];
                    }
                }
            }
        }
    };
    if same_size_plane(window) && lx.is_contiguous() {
        // One channel's KH*KW rows at a time: each image's plane is padded once into a small
        // buffer, and every tap's row is then plain fixed-width copies out of it.
        let fill_channel = |channel: usize, dst: &mut [f32]| {
            let mut padded = [0.0f32; PADDED_PLANE];
            for image in 0..window.batch {
                let base = lx.offset + image * stride_n + channel * stride_c;
                let src = &x[base..base + window.in_plane()];
                match window.in_size[1] {
                    4 => unfold_plane::<4>(src, window, &mut padded, image, dst),
                    8 => unfold_plane::<8>(src, window, &mut padded, image, dst),
                    16 => unfold_plane::<16>(src, window, &mut padded, image, dst),
                    _ => unfold_plane::<32>(src, window, &mut padded, image, dst),
                }
            }
        };
        let chunk = window.taps() * pixels;
        if cols.len() > PARALLEL_THRESHOLD {
            cols.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, dst)| fill_channel(c, dst));
        } else {
            cols.chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, dst)| fill_channel(c, dst));
        }
        return cols;
    }
    if cols.len() > PARALLEL_THRESHOLD {
        cols.par_chunks_mut(pixels)
            .enumerate()
            .for_each(|(row, dst)| fill_row(row, dst));
    } else {
        cols.chunks_mut(pixels)
            .enumerate()
            .for_each(|(row, dst)| fill_row(row, dst));
    }
    cols
}

/// One `W x W` plane of the input gradient of a "same" convolution: every tap's rows of the
/// column gradient are added, in tap order (as the general path adds them, so the bits are
/// the same), into a zeroed padded plane at fixed-width offsets; the interior is the result.
#[inline(always)]
fn fold_plane<const W: usize>(
    cols: &[f32],
    window: &Window2d,
    image: usize,
    channel: usize,
    padded: &mut [f32; PADDED_PLANE],
    plane: &mut [f32],
) {
    let [ph, pw] = window.padding;
    let (pwidth, pheight) = (W + 2 * pw, W + 2 * ph);
    padded[..pwidth * pheight].fill(0.0);
    let pixels = window.batch * W * W;
    let [kh, kw] = window.kernel;
    for th in 0..kh {
        for tw in 0..kw {
            let row = channel * kh * kw + th * kw + tw;
            let src = &cols[row * pixels + image * W * W..][..W * W];
            for (oh, values) in src.chunks_exact(W).enumerate() {
                let to = &mut padded[(oh + th) * pwidth + tw..][..W];
                for (t, &v) in to.iter_mut().zip(values) {
                    *t += v;
                }
            }
        }
    }
    for (r, out) in plane.chunks_exact_mut(W).enumerate() {
        out.copy_from_slice(&padded[(r + ph) * pwidth + pw..][..W]);
    }
}

/// Values of the stack buffer a padded plane is built in.
const PADDED_PLANE: usize = 48 * 48;

/// Whether `im2col` and `col2im` can take the fixed-size path: stride 1, output as large as
/// the input ("same" padding), square planes of 4, 8, 16 or 32 whose padded copy fits in
/// `PADDED_PLANE` (`im2col` also needs a contiguous input).
fn same_size_plane(window: &Window2d) -> bool {
    let [h, w] = window.in_size;
    let padded = (h + 2 * window.padding[0]) * (w + 2 * window.padding[1]);
    window.stride == [1, 1]
        && window.out_size == window.in_size
        && h == w
        && matches!(w, 4 | 8 | 16 | 32)
        && padded <= PADDED_PLANE
}

/// Image `image`'s part of one channel's im2col rows (`dst` holds the channel's KH*KW rows of
/// `N * W * W` pixels): `src` (a `W x W` plane) is copied into `padded` with its zero border,
/// then row `oh` of tap `(th, tw)` is the `W` values of padded row `oh + th` from column `tw`.
#[inline(always)]
fn unfold_plane<const W: usize>(
    src: &[f32],
    window: &Window2d,
    padded: &mut [f32; PADDED_PLANE],
    image: usize,
    dst: &mut [f32],
) {
    let [ph, pw] = window.padding;
    let (pwidth, pheight) = (W + 2 * pw, W + 2 * ph);
    padded[..pwidth * pheight].fill(0.0);
    for (r, src_row) in src.chunks_exact(W).enumerate() {
        padded[(r + ph) * pwidth + pw..][..W].copy_from_slice(src_row);
    }
    let plane = W * W;
    let pixels = window.batch * plane;
    let [kh, kw] = window.kernel;
    for th in 0..kh {
        for tw in 0..kw {
            let row = &mut dst[(th * kw + tw) * pixels + image * plane..][..plane];
            for (oh, out) in row.chunks_exact_mut(W).enumerate() {
                let from = &padded[(oh + th) * pwidth + tw..][..W];
                out.copy_from_slice(from);
            }
        }
    }
}

/// `dst[ow] = src[ow + shift]`, zero where that falls outside `src`: one row of a stride-1
/// im2col. The usual widths are constants, so the row is unrolled with selects instead of a
/// memcpy call per run of three or four values.
#[inline]
fn copy_shifted(src: &[f32], shift: isize, dst: &mut [f32]) {
    #[inline(always)]
    fn row(src: &[f32], shift: isize, dst: &mut [f32], width: usize) {
        let n = src.len() as isize;
        for (ow, d) in dst[..width].iter_mut().enumerate() {
            let iw = ow as isize + shift;
            *d = if (0..n).contains(&iw) {
                src[iw as usize]
            } else {
                0.0
            };
        }
    }
    match dst.len() {
        4 => row(src, shift, dst, 4),
        8 => row(src, shift, dst, 8),
        16 => row(src, shift, dst, 16),
        32 => row(src, shift, dst, 32),
        w => row(src, shift, dst, w),
    }
}

/// Folds a column-matrix gradient back onto `[N, C, H, W]`, summing overlapping taps. Each
/// (image, channel) plane is owned by one task and summed in (tap, pixel) order.
fn col2im(cols: &[f32], window: &Window2d) -> Vec<f32> {
    let [_, kernel_w] = window.kernel;
    let [_, in_w] = window.in_size;
    let [_, out_w] = window.out_size;
    let pixels = window.batch * window.out_plane();
    let same = same_size_plane(window);
    let len = window.batch * window.channels * window.in_plane();
    // The fixed-size path writes every element; the general one adds into zeros.
    let mut dx = if same {
        crate::pool::take(len)
    } else {
        crate::pool::take_zeroed(len)
    };
    if dx.is_empty() || pixels == 0 {
        if same {
            dx.fill(0.0);
        }
        return dx;
    }
    let (step_w, pad_w) = (window.stride[1], window.padding[1]);
    let fill_plane = |plane_index: usize, plane: &mut [f32]| {
        let (image, channel) = (plane_index / window.channels, plane_index % window.channels);
        if same {
            let mut padded = [0.0f32; PADDED_PLANE];
            match in_w {
                4 => fold_plane::<4>(cols, window, image, channel, &mut padded, plane),
                8 => fold_plane::<8>(cols, window, image, channel, &mut padded, plane),
                16 => fold_plane::<16>(cols, window, image, channel, &mut padded, plane),
                _ => fold_plane::<32>(cols, window, image, channel, &mut padded, plane),
            }
            return;
        }
        for tap in 0..window.taps() {
            let (tap_h, tap_w) = (tap / kernel_w, tap % kernel_w);
            let (valid_h, valid_w) = (window.out_range(0, tap_h), window.out_range(1, tap_w));
            let row = channel * window.taps() + tap;
            let src = &cols[row * pixels + image * window.out_plane()..][..window.out_plane()];
            for oh in valid_h {
                let ih = oh * window.stride[0] + tap_h - window.padding[0];
                let src_run = &src[oh * out_w..][valid_w.clone()];
                let first = ih * in_w + valid_w.start * step_w + tap_w - pad_w;
                if step_w == 1 {
                    for (d, &v) in plane[first..first + src_run.len()].iter_mut().zip(src_run) {
                        *d += v;
                    }
                } else {
                    for (k, &v) in src_run.iter().enumerate() {
                        plane[first + k * step_w] += v;
                    }
                }
            }
        }
    };
    if dx.len() > PARALLEL_THRESHOLD {
        dx.par_chunks_mut(window.in_plane())
            .enumerate()
            .for_each(|(i, plane)| fill_plane(i, plane));
    } else {
        dx.chunks_mut(window.in_plane())
            .enumerate()
            .for_each(|(i, plane)| fill_plane(i, plane));
    }
    dx
}
