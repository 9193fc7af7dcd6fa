//! The explicit column matrix of small convolutions: `im2col` unfolds the image into a
//! `[C*KH*KW, N*OH*OW]` buffer and `col2im` folds a column gradient back. On small images
//! (the digits CNN's 8x8 and 4x4 planes) the implicit GEMM's runs along output rows are a
//! few pixels long, and these fixed-width copies out of a padded plane are faster; the
//! buffer is then small (`conv::EXPLICIT_MAX`). A stride-1 "same" convolution of contiguous
//! square planes (4-32) pads each plane once into a stack buffer and copies (im2col) or adds
//! (col2im) fixed-width rows; other shapes copy each kernel offset's in-bounds run
//! (`Window2d::out_range`).

use rayon::prelude::*;

use super::strided::PARALLEL_THRESHOLD;
use super::window::Window2d;
use crate::layout::Layout;

/// Unfolds x into the `[C*KH*KW, N*OH*OW]` column matrix (zeros where a tap hits padding).
/// For each kernel offset the in-bounds outputs of a row are one run (`Window2d::out_range`):
/// a slice copy at stride 1, so only the padding edges are written one by one.
pub(super) fn im2col(x: &[f32], lx: &Layout, window: &Window2d) -> Vec<f32> {
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

/// Adds a column-matrix gradient (of `window.batch` images) back onto `dx` (`[N, C, H, W]`,
/// zeroed; the fixed-size path overwrites it), summing overlapping taps. Each (image, channel) plane is owned by one task and
/// summed in (tap, pixel) order.
pub(super) fn col2im(cols: &[f32], window: &Window2d, dx: &mut [f32]) {
    let [_, kernel_w] = window.kernel;
    let [_, in_w] = window.in_size;
    let [_, out_w] = window.out_size;
    let pixels = window.batch * window.out_plane();
    if dx.is_empty() || pixels == 0 {
        return;
    }
    let same = same_size_plane(window);
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
}
