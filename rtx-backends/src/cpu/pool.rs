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

impl<'a> PlaneReader<'a> {
    /// Plane `plane_index` (= image * channels + channel): its first element's position and
    /// its row and column strides, computed once per plane.
    #[inline]
    fn plane(&self, plane_index: usize) -> Plane<'a> {
        let (image, channel) = (plane_index / self.channels, plane_index % self.channels);
        let s = &self.layout.strides;
        Plane {
            data: self.data,
            base: self.layout.offset + image * s[0] + channel * s[1],
            row: s[2],
            col: s[3],
        }
    }
}

/// One `[H, W]` plane of a strided buffer.
#[derive(Clone, Copy)]
struct Plane<'a> {
    data: &'a [f32],
    base: usize,
    row: usize,
    col: usize,
}

impl Plane<'_> {
    #[inline]
    fn get(&self, h: usize, w: usize) -> f32 {
        self.data[self.base + h * self.row + w * self.col]
    }
}

/// The in-bounds taps of one output position on one axis: input coordinates `first..end`
/// (the window clipped to the input, so no tap is tested against the padding one by one).
#[inline]
fn taps(window: &Window2d, d: usize, out: usize) -> std::ops::Range<usize> {
    let start = out * window.stride[d];
    let first = start.saturating_sub(window.padding[d]);
    let end = (start + window.kernel[d])
        .saturating_sub(window.padding[d])
        .min(window.in_size[d]);
    first..end.max(first)
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

/// The largest of the window's in-bounds taps, NaN when one is NaN (like PyTorch); `-inf` for
/// a window wholly in the padding.
#[inline(always)]
fn window_max(x: Plane, window: &Window2d, oh: usize, ow: usize) -> f32 {
    let (rows, cols) = (taps(window, 0, oh), taps(window, 1, ow));
    let mut best = f32::NEG_INFINITY;
    let mut nan = false;
    for ih in rows {
        for iw in cols.clone() {
            let v = x.get(ih, iw);
            nan |= v.is_nan();
            best = best.max(v);
        }
    }
    if nan { f32::NAN } else { best }
}

/// Whether the windows are 2x2 with stride 2 and no padding over rows whose columns are
/// contiguous in every layout: CNNs' usual pooling, which has a path the compiler vectorizes
/// across output columns.
fn is_2x2(window: &Window2d, layouts: &[&Layout]) -> bool {
    window.kernel == [2, 2]
        && window.stride == [2, 2]
        && window.padding == [0, 0]
        && layouts.iter().all(|l| l.strides[3] == 1 || l.shape[3] <= 1)
}

/// The max of four taps, NaN when one is NaN (like PyTorch).
#[inline(always)]
fn max4(taps: [f32; 4]) -> f32 {
    let [a, b, c, d] = taps;
    let nan = a.is_nan() | b.is_nan() | c.is_nan() | d.is_nan();
    if nan {
        f32::NAN
    } else {
        a.max(b).max(c.max(d))
    }
}

/// The max-pool gradient over whole row pairs of width `in_w` (see [`max_2x2_grad_rows`]).
#[inline(always)]
fn grad_row_pairs(x: &[f32], g: &[f32], in_w: usize, dst: &mut [f32]) {
    let pair = 2 * in_w;
    let rows = x.chunks_exact(pair).zip(g.chunks_exact(in_w / 2));
    for ((xs, gs), ds) in rows.zip(dst.chunks_exact_mut(pair)) {
        let (top, bottom) = xs.split_at(in_w);
        let (d0, d1) = ds.split_at_mut(in_w);
        let windows = top
            .chunks_exact(2)
            .zip(bottom.chunks_exact(2))
            .zip(d0.chunks_exact_mut(2).zip(d1.chunks_exact_mut(2)));
        for (((t, b), (o0, o1)), &share) in windows.zip(gs) {
            let hit = first_max_hits(t[0], t[1], b[0], b[1]);
            let part = |h: bool| if h { share } else { 0.0 };
            o0[0] = part(hit[0]);
            o0[1] = part(hit[1]);
            o1[0] = part(hit[2]);
            o1[1] = part(hit[3]);
        }
    }
}

/// Which of the taps `a, b, c, d` (row-major) is the window's first maximum, NaN winning: a
/// tap wins when it is NaN or no later tap is larger and no earlier tap won. Comparisons and
/// logic only, no branch. A test checks it against the definition (the first tap equal to the
/// max, or the first NaN) on every case of NaN, signed zeros, infinities and ties.
#[inline(always)]
fn first_max_hits(a: f32, b: f32, c: f32, d: f32) -> [bool; 4] {
    let ha = a.is_nan() | ((a >= b) & (a >= c) & (a >= d));
    let hb = !ha & (b.is_nan() | ((b >= c) & (b >= d)));
    let hc = !ha & !hb & (c.is_nan() | (c >= d));
    [ha, hb, hc, !(ha | hb | hc)]
}

/// One plane of a 2x2/stride-2 max pool (see [`is_2x2`]).
/// [`max_2x2_plane`] over a contiguous `x` whose planes have even sizes: every pair of input
/// rows in one loop, the usual widths as constants (see [`max_2x2_grad_rows`]), in fixed
/// pieces across threads when large.
fn max_2x2_rows(x: &[f32], in_w: usize, out: &mut [f32]) {
    let out_w = in_w / 2;
    if out_w == 0 {
        return;
    }
    let fill = |first_row: usize, out: &mut [f32]| {
        let x = &x[first_row * 2 * in_w..][..out.len() * 4];
        match in_w {
            4 => pool_row_pairs(x, 4, out),
            8 => pool_row_pairs(x, 8, out),
            16 => pool_row_pairs(x, 16, out),
            32 => pool_row_pairs(x, 32, out),
            _ => pool_row_pairs(x, in_w, out),
        }
    };
    let piece = (PARALLEL_THRESHOLD / out_w).max(1) * out_w;
    if out.len() * 4 > PARALLEL_THRESHOLD {
        out.par_chunks_mut(piece)
            .enumerate()
            .for_each(|(i, o)| fill(i * piece / out_w, o));
    } else {
        fill(0, out);
    }
}

#[inline(always)]
fn pool_row_pairs(x: &[f32], in_w: usize, out: &mut [f32]) {
    for (xs, out_row) in x.chunks_exact(2 * in_w).zip(out.chunks_exact_mut(in_w / 2)) {
        let (top, bottom) = xs.split_at(in_w);
        for ((o, t), b) in out_row
            .iter_mut()
            .zip(top.chunks_exact(2))
            .zip(bottom.chunks_exact(2))
        {
            *o = max4([t[0], t[1], b[0], b[1]]);
        }
    }
}

fn max_2x2_plane(x: Plane, out_w: usize, dst: &mut [f32]) {
    for (oh, out_row) in dst.chunks_mut(out_w).enumerate() {
        let r0 = &x.data[x.base + 2 * oh * x.row..][..2 * out_w];
        let r1 = &x.data[x.base + (2 * oh + 1) * x.row..][..2 * out_w];
        for ((o, p), q) in out_row
            .iter_mut()
            .zip(r0.chunks_exact(2))
            .zip(r1.chunks_exact(2))
        {
            *o = max4([p[0], p[1], q[0], q[1]]);
        }
    }
}

/// The input gradient of one plane of a 2x2/stride-2 max pool: each window's `g` goes to its
/// first maximum, zeros elsewhere; windows do not overlap, so each element they cover is
/// written once (`dst` holds zeros where they do not: an odd last row or column).
fn max_2x2_grad_plane(x: Plane, g: Plane, window: &Window2d, dst: &mut [f32]) {
    let ([out_h, out_w], in_w) = (window.out_size, window.in_size[1]);
    for oh in 0..out_h {
        let r0 = &x.data[x.base + 2 * oh * x.row..][..2 * out_w];
        let r1 = &x.data[x.base + (2 * oh + 1) * x.row..][..2 * out_w];
        let grads = &g.data[g.base + oh * g.row..][..out_w];
        let (d0, d1) = dst[2 * oh * in_w..(2 * oh + 2) * in_w].split_at_mut(in_w);
        let rows = r0.chunks_exact(2).zip(r1.chunks_exact(2));
        let outs = d0.chunks_exact_mut(2).zip(d1.chunks_exact_mut(2));
        for ((&share, (p, q)), (dp, dq)) in grads.iter().zip(rows).zip(outs) {
            let hit = first_max_hits(p[0], p[1], q[0], q[1]);
            let part = |h: bool| if h { share } else { 0.0 };
            dp[0] = part(hit[0]);
            dp[1] = part(hit[1]);
            dq[0] = part(hit[2]);
            dq[1] = part(hit[3]);
        }
    }
}

/// [`max_2x2_grad_plane`] over contiguous `x`, `g` and `dst` whose planes have even sizes:
/// every pair of input rows of every plane in one loop, split across threads in fixed
/// pieces of row pairs when large.
fn max_2x2_grad_rows(x: &[f32], g: &[f32], in_w: usize, dst: &mut [f32]) {
    let out_w = in_w / 2;
    let pair = 2 * in_w;
    let fill = |first_pair: usize, dst: &mut [f32]| {
        let pairs = dst.len() / pair;
        let x = &x[first_pair * pair..][..pairs * pair];
        let g = &g[first_pair * out_w..][..pairs * out_w];
        // The usual widths as constants, so each row pair's loop is unrolled: with a run-time
        // width of 4 or 8 the loop overhead cost twice the windows themselves.
        match in_w {
            4 => grad_row_pairs(x, g, 4, dst),
            8 => grad_row_pairs(x, g, 8, dst),
            16 => grad_row_pairs(x, g, 16, dst),
            32 => grad_row_pairs(x, g, 32, dst),
            _ => grad_row_pairs(x, g, in_w, dst),
        }
    };
    if pair == 0 {
        return;
    }
    // Pieces of whole row pairs, a fixed size: the split never depends on the thread count.
    let piece = (PARALLEL_THRESHOLD / pair).max(1) * pair;
    if dst.len() > PARALLEL_THRESHOLD {
        dst.par_chunks_mut(piece)
            .enumerate()
            .for_each(|(i, d)| fill(i * piece / pair, d));
    } else {
        fill(0, dst);
    }
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
    let mut out = crate::pool::take(window.batch * window.channels * window.out_plane());
    let out_w = window.out_size[1];
    let halves = is_2x2(&window, &[l]);
    if halves && l.is_contiguous() && window.in_size.iter().all(|n| n % 2 == 0) {
        // Planes follow each other: the whole tensor is one run of row pairs.
        let x = &x[l.offset..l.offset + 4 * out.len()];
        max_2x2_rows(x, window.in_size[1], &mut out);
        return Ok((out, window.out_shape(window.channels)));
    }
    for_each_plane(&mut out, window.out_plane(), |plane, dst| {
        let x = reader.plane(plane);
        if halves {
            return max_2x2_plane(x, out_w, dst);
        }
        for (oh, dst_row) in dst.chunks_mut(out_w).enumerate() {
            for (ow, d) in dst_row.iter_mut().enumerate() {
                *d = window_max(x, &window, oh, ow);
            }
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
    let halves = is_2x2(&window, &[lx, lg]);
    let len = window.batch * window.channels * window.in_plane();
    let covered = halves && window.in_size.iter().all(|n| n % 2 == 0);
    let mut dx = if covered {
        crate::pool::take(len)
    } else {
        crate::pool::take_zeroed(len)
    };
    if covered && lx.is_contiguous() && lg.is_contiguous() {
        // Planes follow each other: the whole tensor is one run of row pairs.
        let x = &x[lx.offset..lx.offset + dx.len()];
        let g = &g[lg.offset..lg.offset + dx.len() / 4];
        max_2x2_grad_rows(x, g, window.in_size[1], &mut dx);
        return Ok(dx);
    }
    for_each_plane(&mut dx, window.in_plane(), |plane, dst| {
        let (x, g) = (x_reader.plane(plane), g_reader.plane(plane));
        if halves {
            return max_2x2_grad_plane(x, g, &window, dst);
        }
        for oh in 0..window.out_size[0] {
            let rows = taps(&window, 0, oh);
            for ow in 0..window.out_size[1] {
                // The first tap equal to the window's max (or its first NaN) is the argmax;
                // every tap gets `g` or 0 without a branch (see `window_argmax`).
                let best = window_max(x, &window, oh, ow);
                let share = g.get(oh, ow);
                let mut found = false;
                for ih in rows.clone() {
                    for iw in taps(&window, 1, ow) {
                        let v = x.get(ih, iw);
                        let hit = !found & ((v == best) | (v.is_nan() & best.is_nan()));
                        dst[ih * in_w + iw] += if hit { share } else { 0.0 };
                        found |= hit;
                    }
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
    let mut out = crate::pool::take(window.batch * window.channels * window.out_plane());
    let out_w = window.out_size[1];
    for_each_plane(&mut out, window.out_plane(), |plane, dst| {
        let x = reader.plane(plane);
        for (oh, dst_row) in dst.chunks_mut(out_w).enumerate() {
            let rows = taps(&window, 0, oh);
            for (ow, d) in dst_row.iter_mut().enumerate() {
                let cols = taps(&window, 1, ow);
                let mut sum = 0.0f32;
                for ih in rows.clone() {
                    for iw in cols.clone() {
                        sum += x.get(ih, iw);
                    }
                }
                *d = sum / divisor;
            }
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
        let g = g_reader.plane(plane);
        for oh in 0..window.out_size[0] {
            let rows = taps(&window, 0, oh);
            for ow in 0..window.out_size[1] {
                let share = g.get(oh, ow) / divisor;
                for ih in rows.clone() {
                    for iw in taps(&window, 1, ow) {
                        dst[ih * in_w + iw] += share;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: the first tap equal to the max, or the first NaN.
    fn first_max_of_4(taps: [f32; 4]) -> u32 {
        let m = taps[0].max(taps[1]).max(taps[2].max(taps[3]));
        let (mut equal, mut nan) = (0u32, 0u32);
        for (i, &v) in taps.iter().enumerate() {
            equal |= ((v == m) as u32) << i;
            nan |= (v.is_nan() as u32) << i;
        }
        // With no NaN one tap equals the max; with one, the first NaN wins. The 0b1000 bit keeps
        // the count in range whatever happens.
        let chosen = if nan != 0 { nan } else { equal };
        (chosen | 0b1000).trailing_zeros()
    }

    #[test]
    fn the_two_first_maximum_rules_agree_on_nan_signed_zeros_infinities_and_ties() {
        let values = [
            f32::NAN,
            -1.0,
            0.0,
            -0.0,
            1.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ];
        for &a in &values {
            for &b in &values {
                for &c in &values {
                    for &d in &values {
                        let hits = first_max_hits(a, b, c, d);
                        assert_eq!(hits.iter().filter(|&&h| h).count(), 1, "{a} {b} {c} {d}");
                        let winner = hits.iter().position(|&h| h).unwrap_or(4) as u32;
                        assert_eq!(winner, first_max_of_4([a, b, c, d]), "{a} {b} {c} {d}");
                    }
                }
            }
        }
    }
}
