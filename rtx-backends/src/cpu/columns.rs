//! A convolution's column matrix, read straight from the image while the GEMM packs it
//! (implicit GEMM): it is never stored whole.
//!
//! The column matrix of a window over `[N, C, H, W]` is `[C*KH*KW, N*OH*OW]`: one row per
//! (channel, kernel tap), one column per output pixel of every image; element (r, q) is the
//! input under tap r when the window sits on output pixel q, or zero in the padding. The
//! GEMM packs its operands in blocks of at most `KC` rows per task, so the convolution
//! passes it this matrix as an operand that builds the block about to be used, which is then
//! in L2: [`PixelColumns`] (as B, in panels of pixels: the forward pass and the stride-1 input
//! gradient) and [`TapRows`] (as A, in panels of taps: the weight gradient).

use super::gemm::{PackA, PackB};
use super::window::Window2d;
use crate::layout::Layout;

/// The column matrix of `window` over the input `x` (an `[N, C, H, W]` view `layout`).
#[derive(Clone, Copy)]
pub(crate) struct Columns<'a> {
    x: &'a [f32],
    layout: &'a Layout,
    window: Window2d,
}

/// A run of output pixels along one output row: pixels `at..at + len` of the requested range
/// are `(image, oh, ow0..ow0 + len)`; `base` is where the input element under tap (0, 0) of
/// channel 0 would be for output pixel `(image, oh, 0)`, padding included (it may lie before
/// the buffer: only in-bounds taps are read).
#[derive(Clone, Copy, Default)]
struct Run {
    oh: usize,
    ow0: usize,
    len: usize,
    at: usize,
    base: isize,
}

/// One row of the column matrix (a channel and kernel tap): its offset from a run's `base`,
/// and the output rows and columns where it reads the input rather than the padding.
#[derive(Clone, Copy, Default)]
struct Tap {
    offset: isize,
    oh: (usize, usize),
    ow: (usize, usize),
}

/// Most rows of the column matrix (or pixels) one packing call covers: the GEMM's K slice.
const MAX_SLICE: usize = super::gemm::KC;
/// Most rows a panel of taps has (every kernel's `mr` is at most 16).
const PANEL_ROWS: usize = 16;
/// Most runs a panel of pixels can span (a panel is at most 32 pixels wide).
const PANEL_RUNS: usize = 32;

impl<'a> Columns<'a> {
    /// `layout` must lie inside `x` with the shape `window` was made for.
    pub(crate) fn new(x: &'a [f32], layout: &'a Layout, window: Window2d) -> Self {
        Columns { x, layout, window }
    }

    /// The matrix's rows: channels times kernel taps.
    pub(crate) fn rows(&self) -> usize {
        self.window.channels * self.window.taps()
    }

    /// The matrix's columns: output pixels of every image.
    pub(crate) fn pixels(&self) -> usize {
        self.window.batch * self.window.out_plane()
    }

    /// Calls `each` with the runs (along output rows) of pixels `first..first + len`: one
    /// division to find the first pixel, then a walk.
    #[inline]
    fn runs(&self, first: usize, len: usize, mut each: impl FnMut(Run)) {
        let w = &self.window;
        let l = self.layout;
        let [out_h, out_w] = w.out_size;
        let plane = out_h * out_w;
        if plane == 0 {
            return;
        }
        let (mut image, within) = (first / plane, first % plane);
        let (mut oh, mut ow0) = (within / out_w, within % out_w);
        let [s_n, s_h, s_w] = [l.strides[0], l.strides[2], l.strides[3]].map(|s| s as isize);
        let corner = l.offset as isize - w.padding[0] as isize * s_h - w.padding[1] as isize * s_w;
        let mut at = 0;
        while at < len {
            let run = (out_w - ow0).min(len - at);
            each(Run {
                oh,
                ow0,
                len: run,
                at,
                base: corner + image as isize * s_n + (oh * w.stride[0]) as isize * s_h,
            });
            at += run;
            ow0 = 0;
            oh += 1;
            if oh == out_h {
                oh = 0;
                image += 1;
            }
        }
    }

    /// Fills `taps` with rows `first..first + taps.len()` of the matrix: one division for the
    /// first, then a walk over (channel, tap row, tap column).
    fn taps(&self, first: usize, taps: &mut [Tap]) {
        let w = &self.window;
        let l = self.layout;
        let [kh, kw] = w.kernel;
        let (mut channel, tap) = (first / w.taps(), first % w.taps());
        let (mut th, mut tw) = (tap / kw, tap % kw);
        let [s_c, s_h, s_w] = [l.strides[1], l.strides[2], l.strides[3]].map(|s| s as isize);
        let range = |r: std::ops::Range<usize>| (r.start, r.end);
        for t in taps {
            *t = Tap {
                offset: channel as isize * s_c + th as isize * s_h + tw as isize * s_w,
                oh: range(w.out_range(0, th)),
                ow: range(w.out_range(1, tw)),
            };
            tw += 1;
            if tw == kw {
                tw = 0;
                th += 1;
                if th == kh {
                    th = 0;
                    channel += 1;
                }
            }
        }
    }

    /// Row `tap` of the matrix over the pixels of `run`, written to `dst[(run.at + i) *
    /// STEP]`: zeros where the tap is in the padding, the input's run elsewhere.
    #[inline(always)]
    fn fill<const STEP: usize>(&self, tap: &Tap, run: &Run, dst: &mut [f32], step: usize) {
        let step = if STEP == 0 { step } else { STEP };
        let end = run.ow0 + run.len;
        let (lo, hi) = (tap.ow.0.clamp(run.ow0, end), tap.ow.1.clamp(run.ow0, end));
        let dst = &mut dst[run.at * step..];
        if run.oh < tap.oh.0 || run.oh >= tap.oh.1 || lo >= hi {
            for i in 0..run.len {
                dst[i * step] = 0.0;
            }
            return;
        }
        for i in 0..lo - run.ow0 {
            dst[i * step] = 0.0;
        }
        for i in hi - run.ow0..run.len {
            dst[i * step] = 0.0;
        }
        let step_w = (self.window.stride[1] * self.layout.strides[3]) as isize;
        // In bounds: (run.oh, lo..hi) are outputs whose tap lands inside the input.
        let first = (run.base + tap.offset + lo as isize * step_w) as usize;
        let dst = &mut dst[(lo - run.ow0) * step..];
        if step_w == 1 {
            let src = &self.x[first..first + (hi - lo)];
            for (i, &v) in src.iter().enumerate() {
                dst[i * step] = v;
            }
        } else {
            for i in 0..hi - lo {
                dst[i * step] = self.x[first + i * step_w as usize];
            }
        }
    }
}

/// The column matrix as B of `out = W @ cols`, packed in panels of `nr` pixels: per tap, a
/// panel row is one run of the image (or two, across an output row's end).
pub(crate) struct PixelColumns<'a>(pub Columns<'a>);

impl PackB for PixelColumns<'_> {
    fn pack(&self, col0: usize, cols: usize, k0: usize, kc: usize, nr: usize, dst: &mut [f32]) {
        debug_assert!(kc <= MAX_SLICE && nr <= PANEL_RUNS);
        let columns = &self.0;
        let mut taps = [Tap::default(); MAX_SLICE];
        let taps = &mut taps[..kc];
        columns.taps(k0, taps);
        for (panel, panel_dst) in dst.chunks_exact_mut(kc * nr).enumerate() {
            let first = col0 + panel * nr;
            let width = nr.min(cols - panel * nr);
            if width < nr {
                panel_dst.fill(0.0);
            }
            // The panel's pixels split into the same runs for every tap: find them once.
            let mut runs = [Run::default(); PANEL_RUNS];
            let mut count = 0;
            columns.runs(first, width, |run| {
                runs[count] = run;
                count += 1;
            });
            for (tap, dst) in taps.iter().zip(panel_dst.chunks_exact_mut(nr)) {
                for run in &runs[..count] {
                    columns.fill::<1>(tap, run, dst, 1);
                }
            }
        }
    }
}

/// The column matrix itself, `[C*KH*KW, N*OH*OW]`: A of `dW^T = cols @ g^T`.
pub(crate) struct TapRows<'a>(pub Columns<'a>);

impl PackA for TapRows<'_> {
    fn pack(&self, row0: usize, rows: usize, k0: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        debug_assert!(kc <= MAX_SLICE);
        let columns = &self.0;
        // The K slice's pixels split into the same runs for every row: find them once.
        let mut runs = [Run::default(); MAX_SLICE];
        let mut count = 0;
        columns.runs(k0, kc, |run| {
            runs[count] = run;
            count += 1;
        });
        let mut tap = [Tap::default()];
        // A panel's rows are built contiguously (runs of the image copied as they lie), then
        // packed k-major by the GEMM's own packing, which transposes 16 x 16 blocks in
        // registers where it can: writing every value `mr` apart as it is read costs more.
        let mut block = [0.0f32; PANEL_ROWS * MAX_SLICE];
        for (panel, panel_dst) in dst.chunks_exact_mut(kc * mr).enumerate() {
            let first = row0 + panel * mr;
            let height = mr.min(rows - panel * mr);
            if mr > PANEL_ROWS {
                // No kernel is this tall; kept correct for any `mr`.
                if height < mr {
                    panel_dst.fill(0.0);
                }
                for r in 0..height {
                    columns.taps(first + r, &mut tap);
                    let dst = &mut panel_dst[r..];
                    for run in &runs[..count] {
                        columns.fill::<0>(&tap[0], run, dst, mr);
                    }
                }
                continue;
            }
            for (r, row) in block.chunks_exact_mut(kc).take(height).enumerate() {
                columns.taps(first + r, &mut tap);
                for run in &runs[..count] {
                    columns.fill::<1>(&tap[0], run, row, 1);
                }
            }
            super::gemm::pack_a_row_major(&block[..height * kc], height, kc, mr, panel_dst);
        }
    }
}
