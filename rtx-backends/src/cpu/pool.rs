//! 2-D max and average pooling with their gradients (PyTorch semantics, floor mode).
//!
//! Work is split by (image, channel) plane: each plane of the output, or of the input gradient,
//! is owned by one task that visits windows in row-major order, so overlapping windows add
//! their contributions in a fixed order.

use rayon::prelude::*;

use crate::layout::Layout;

use super::check::{self, KResult};
use super::strided::PARALLEL_THRESHOLD;
use super::window::Window2d;

/// Reads an `[N, C, H, W]` layout one (image, channel) plane at a time.
#[derive(Clone, Copy)]
struct PlaneReader<'a> {
    data: &'a [f32],
    layout: &'a Layout,
    channels: usize,
}

impl PlaneReader<'_> {
    /// Element `(h, w)` of plane `plane_index` (= image * channels + channel).
    #[inline]
    fn get(&self, plane_index: usize, h: usize, w: usize) -> f32 {
        let (image, channel) = (plane_index / self.channels, plane_index % self.channels);
        let s = &self.layout.strides;
        self.data[self.layout.offset + image * s[0] + channel * s[1] + h * s[2] + w * s[3]]
    }
}

/// Runs `fill(plane_index, plane)` over the `plane_len`-sized planes of `out`.
fn for_each_plane(
    out: &mut [f32],
    plane_len: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if plane_len == 0 {
        return;
    }
    if out.len() > PARALLEL_THRESHOLD {
        out.par_chunks_mut(plane_len)
            .enumerate()
            .for_each(|(i, plane)| fill(i, plane));
    } else {
        out.chunks_mut(plane_len)
            .enumerate()
            .for_each(|(i, plane)| fill(i, plane));
    }
}

/// Position `(ih, iw)` of the first maximum (row-major) among the window's in-bounds taps;
/// NaN wins, like PyTorch. `None` only for a window lying wholly in the padding.
fn window_argmax(
    x: PlaneReader,
    window: &Window2d,
    plane: usize,
    oh: usize,
    ow: usize,
) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, f32)> = None;
    for tap_h in 0..window.kernel[0] {
        let Some(ih) = window.input_coord(0, oh, tap_h) else {
            continue;
        };
        for tap_w in 0..window.kernel[1] {
            let Some(iw) = window.input_coord(1, ow, tap_w) else {
                continue;
            };
            let v = x.get(plane, ih, iw);
            if best.is_none_or(|(_, _, acc)| v > acc || (v.is_nan() && !acc.is_nan())) {
                best = Some((ih, iw, v));
            }
        }
    }
    best.map(|(ih, iw, _)| (ih, iw))
}

/// PyTorch max_pool2d (padding counts as -inf); x [N,C,H,W]. Returns (out, out_shape).
pub fn max_pool2d(
    x: &[f32],
    l: &Layout,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<(Vec<f32>, crate::layout::Dims)> {
    const K: &str = "max_pool2d";
    check::view(K, "x", x.len(), l)?;
    let window = pool_window(K, &l.shape, kernel, stride, padding)?;
    let reader = PlaneReader {
        data: x,
        layout: l,
        channels: window.channels,
    };
    let mut out = crate::pool::take_zeroed(window.batch * window.channels * window.out_plane());
    for_each_plane(&mut out, window.out_plane(), |plane, dst| {
        for (i, d) in dst.iter_mut().enumerate() {
            let (oh, ow) = (i / window.out_size[1], i % window.out_size[1]);
            *d = window_argmax(reader, &window, plane, oh, ow)
                .map_or(f32::NEG_INFINITY, |(ih, iw)| reader.get(plane, ih, iw));
        }
    });
    Ok((out, window.out_shape(window.channels)))
}

/// gradient goes to the first max position of each window (row-major within window), accumulated where windows overlap
pub fn max_pool2d_grad(
    x: &[f32],
    lx: &Layout,
    g: &[f32],
    lg: &Layout,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Vec<f32>> {
    const K: &str = "max_pool2d_grad";
    check::view(K, "x", x.len(), lx)?;
    check::view(K, "g", g.len(), lg)?;
    let window = pool_window(K, &lx.shape, kernel, stride, padding)?;
    check::same_shape(K, "g", lg, &window.out_shape(window.channels))?;
    let x_reader = PlaneReader {
        data: x,
        layout: lx,
        channels: window.channels,
    };
    let g_reader = PlaneReader {
        data: g,
        layout: lg,
        channels: window.channels,
    };
    let in_w = window.in_size[1];
    let mut dx = crate::pool::take_zeroed(window.batch * window.channels * window.in_plane());
    for_each_plane(&mut dx, window.in_plane(), |plane, dst| {
        for oh in 0..window.out_size[0] {
            for ow in 0..window.out_size[1] {
                if let Some((ih, iw)) = window_argmax(x_reader, &window, plane, oh, ow) {
                    dst[ih * in_w + iw] += g_reader.get(plane, oh, ow);
                }
            }
        }
    });
    Ok(dx)
}

/// PyTorch avg_pool2d with count_include_pad=true
pub fn avg_pool2d(
    x: &[f32],
    l: &Layout,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<(Vec<f32>, crate::layout::Dims)> {
    const K: &str = "avg_pool2d";
    check::view(K, "x", x.len(), l)?;
    let window = pool_window(K, &l.shape, kernel, stride, padding)?;
    let reader = PlaneReader {
        data: x,
        layout: l,
        channels: window.channels,
    };
    // In floor mode a window never reaches past the padded input, so padding included, every
    // window holds exactly KH*KW taps.
    let divisor = window.taps() as f32;
    let mut out = crate::pool::take_zeroed(window.batch * window.channels * window.out_plane());
    for_each_plane(&mut out, window.out_plane(), |plane, dst| {
        for (i, d) in dst.iter_mut().enumerate() {
            let (oh, ow) = (i / window.out_size[1], i % window.out_size[1]);
            let mut sum = 0.0f32;
            for tap_h in 0..kernel[0] {
                let Some(ih) = window.input_coord(0, oh, tap_h) else {
                    continue;
                };
                for tap_w in 0..kernel[1] {
                    if let Some(iw) = window.input_coord(1, ow, tap_w) {
                        sum += reader.get(plane, ih, iw);
                    }
                }
            }
            *d = sum / divisor;
        }
    });
    Ok((out, window.out_shape(window.channels)))
}

/// Gradient of [`avg_pool2d`] w.r.t. its input of shape `x_shape`, given the upstream `g`.
pub fn avg_pool2d_grad(
    g: &[f32],
    lg: &Layout,
    x_shape: &[usize],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Vec<f32>> {
    const K: &str = "avg_pool2d_grad";
    check::view(K, "g", g.len(), lg)?;
    let window = pool_window(K, x_shape, kernel, stride, padding)?;
    check::same_shape(K, "g", lg, &window.out_shape(window.channels))?;
    let g_reader = PlaneReader {
        data: g,
        layout: lg,
        channels: window.channels,
    };
    let divisor = window.taps() as f32;
    let in_w = window.in_size[1];
    let mut dx = crate::pool::take_zeroed(window.batch * window.channels * window.in_plane());
    for_each_plane(&mut dx, window.in_plane(), |plane, dst| {
        for oh in 0..window.out_size[0] {
            for ow in 0..window.out_size[1] {
                let share = g_reader.get(plane, oh, ow) / divisor;
                for tap_h in 0..kernel[0] {
                    let Some(ih) = window.input_coord(0, oh, tap_h) else {
                        continue;
                    };
                    for tap_w in 0..kernel[1] {
                        if let Some(iw) = window.input_coord(1, ow, tap_w) {
                            dst[ih * in_w + iw] += share;
                        }
                    }
                }
            }
        }
    });
    Ok(dx)
}

/// The window of a pooling kernel over an input of shape `x_shape` (see
/// [`Window2d::checked`]); the output has the input's channels.
fn pool_window(
    name: &'static str,
    x_shape: &[usize],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Window2d> {
    let channels = x_shape.get(1).copied().unwrap_or(0);
    Window2d::checked(name, x_shape, kernel, stride, padding, channels)
}
