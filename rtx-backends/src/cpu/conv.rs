//! 2-D convolution as implicit GEMM, with both gradients.
//!
//! Every pass is one matmul against the convolution's column matrix `[C*KH*KW, N*OH*OW]`
//! (one row per channel and kernel tap, one column per output pixel of every image; folding
//! the batch into the pixels keeps all cores busy on small images). Above `EXPLICIT_MAX`
//! values (4 MiB) that matrix is never stored: it is a GEMM operand built block by block from
//! the image as the GEMM packs it (`columns.rs`, `gemm/implicit.rs`), so a pass needs no
//! workspace beyond the GEMM's L2-sized panels. Below, it is built whole (`im2col.rs`), whose
//! fixed-width copies are faster on small images. `ConvAlgorithm` forces either.
//!
//! - forward: `out [O, N*OH*OW] = W @ cols`, written into `[N, O, OH, OW]` block by block;
//! - weight gradient: `dW^T [C*KH*KW, O] = cols @ g^T`;
//! - input gradient, stride 1: a convolution of the output gradient by the flipped kernel,
//!   `dx [C, N*H*W] = W' @ cols(g)` with the window padded by `K - 1 - padding`; other
//!   strides (and the explicit path) compute the column gradient `W^T @ g` a few images at a
//!   time (`FOLD_CHUNK`) and fold it back (`col2im`), so that workspace stays bounded too.

use crate::layout::{Dims, Layout};

use super::check::{self, KResult};
use super::columns::{Columns, PixelColumns, TapRows};
use super::gemm::{matmul_2d, matmul_implicit, matmul_implicit_b};
use super::im2col::{col2im, im2col};
use super::strided::contiguous;
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

/// x [N, C, H, W], w [O, C, KH, KW] -> [N, O, OH, OW], OH = (H + 2*pad - KH)/stride + 1
/// (PyTorch; no bias, dilation or groups). Returns (out, out_shape).
pub fn conv2d(
    x: &[f32],
    lx: &Layout,
    w: &[f32],
    lw: &Layout,
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<(Vec<f32>, Dims)> {
    conv2d_with(ConvAlgorithm::Auto, x, lx, w, lw, stride, padding)
}

/// `conv2d` with a given algorithm (tests run each).
pub fn conv2d_with(
    algorithm: ConvAlgorithm,
    x: &[f32],
    lx: &Layout,
    w: &[f32],
    lw: &Layout,
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<(Vec<f32>, Dims)> {
    const K: &str = "conv2d";
    check::view(K, "x", x.len(), lx)?;
    check::view(K, "w", w.len(), lw)?;
    let window = conv_window(K, &lx.shape, &lw.shape, stride, padding)?;
    let out_channels = lw.shape[0];
    let columns = Columns::new(x, lx, window);
    let (taps, pixels) = (columns.rows(), columns.pixels());
    let w_flat = Scratch(contiguous(w, lw));
    if algorithm.explicit(&window) {
        let cols = Scratch(im2col(x, lx, &window));
        let by_channel = Scratch(matmul_2d(
            &w_flat,
            &Layout::contiguous(&[out_channels, taps]),
            &cols,
            &Layout::contiguous(&[taps, pixels]),
        ));
        // The product is [O, N, OH*OW]; the result wants the batch axis first.
        let plane = window.out_plane();
        let as_batch_first = Layout {
            shape: smallvec::smallvec![window.batch, out_channels, plane],
            strides: smallvec::smallvec![plane, window.batch * plane, 1],
            offset: 0,
        };
        return Ok((
            contiguous(&by_channel, &as_batch_first),
            window.out_shape(out_channels),
        ));
    }
    let mut out = crate::pool::take(window.batch * out_channels * window.out_plane());
    let to = ChannelsFirst::new(&mut out, out_channels, window.out_plane());
    matmul_implicit_b(
        &w_flat,
        &Layout::contiguous(&[out_channels, taps]),
        &PixelColumns(columns),
        taps,
        pixels,
        &|col0, block| to.write(col0, block),
    );
    Ok((out, window.out_shape(out_channels)))
}

/// `[N, C, P]` output written from blocks of `[C, N*P]` columns (as the implicit GEMM
/// hands them out, from any thread).
struct ChannelsFirst {
    out: *mut f32,
    channels: usize,
    plane: usize,
}

// SAFETY: the GEMM's blocks cover disjoint columns, so concurrent `write`s touch disjoint
// elements of `out`, which outlives the product.
unsafe impl Sync for ChannelsFirst {}

impl ChannelsFirst {
    /// `out` holds `N * channels * plane` values.
    fn new(out: &mut [f32], channels: usize, plane: usize) -> Self {
        ChannelsFirst {
            out: out.as_mut_ptr(),
            channels,
            plane,
        }
    }

    /// Columns `col0..col0 + block.len() / channels` of `[C, N*P]` (row-major in `block`).
    fn write(&self, col0: usize, block: &[f32]) {
        let (channels, plane) = (self.channels, self.plane);
        let cols = block.len() / channels.max(1);
        let mut q = col0;
        while q < col0 + cols {
            let (image, p0) = (q / plane, q % plane);
            let run = (plane - p0).min(col0 + cols - q);
            for c in 0..channels {
                let src = &block[c * cols + (q - col0)..][..run];
                // SAFETY: (image, c, p0..p0 + run) lies inside `out` and in this block's
                // columns, which no other block writes.
                unsafe {
                    let dst = self.out.add((image * channels + c) * plane + p0);
                    std::ptr::copy_nonoverlapping(src.as_ptr(), dst, run);
                }
            }
            q += run;
        }
    }
}

/// Column matrices of up to this many values (4 MiB) are built whole, by `im2col`: on small
/// images (runs along output rows of a few pixels) its fixed-width copies beat building the
/// GEMM's panels from the image, and the buffer is small. Larger ones are implicit.
const EXPLICIT_MAX: usize = 1 << 20;

/// How a convolution reads its column matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvAlgorithm {
    /// Explicit up to `EXPLICIT_MAX` values (4 MiB), implicit above: what `conv2d` and its
    /// gradients use.
    Auto,
    /// The column matrix built whole (`im2col`), then one GEMM.
    Explicit,
    /// The column matrix built block by block inside the GEMM's packing (implicit GEMM).
    Implicit,
}

impl ConvAlgorithm {
    /// Whether `window`'s column matrix is built whole. `conv_window` checked that its
    /// element count does not overflow.
    fn explicit(self, window: &Window2d) -> bool {
        match self {
            ConvAlgorithm::Auto => {
                window.channels * window.taps() * window.batch * window.out_plane() <= EXPLICIT_MAX
            }
            ConvAlgorithm::Explicit => true,
            ConvAlgorithm::Implicit => false,
        }
    }
}

/// The gradient of `conv2d` with respect to x, given the output gradient g [N, O, OH, OW]
/// and x's shape.
pub fn conv2d_grad_input(
    g: &[f32],
    lg: &Layout,
    w: &[f32],
    lw: &Layout,
    x_shape: &[usize],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Vec<f32>> {
    conv2d_grad_input_with(ConvAlgorithm::Auto, g, lg, w, lw, x_shape, stride, padding)
}

/// `conv2d_grad_input` with a given algorithm (tests run each).
#[allow(clippy::too_many_arguments)]
pub fn conv2d_grad_input_with(
    algorithm: ConvAlgorithm,
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
    let [kh, kw] = window.kernel;
    if !algorithm.explicit(&window) && stride == [1, 1] && padding[0] < kh && padding[1] < kw {
        return Ok(grad_input_as_convolution(g, lg, w, lw, &window));
    }
    Ok(grad_input_by_folding(g, lg, w, lw, &window))
}

/// The stride-1 input gradient as a convolution of g by the flipped kernel:
/// `dx[n, c, i, j] = sum over (o, a, b) of g[n, o, i + a - p', j + b - q'] * W[o, c, KH-1-a,
/// KW-1-b]` with `p' = KH - 1 - padding` (a window over g whose output is x's size).
fn grad_input_as_convolution(
    g: &[f32],
    lg: &Layout,
    w: &[f32],
    lw: &Layout,
    window: &Window2d,
) -> Vec<f32> {
    let out_channels = lw.shape[0];
    let [kh, kw] = window.kernel;
    let over_g = Window2d {
        batch: window.batch,
        channels: out_channels,
        in_size: window.out_size,
        kernel: window.kernel,
        stride: [1, 1],
        padding: [kh - 1 - window.padding[0], kw - 1 - window.padding[1]],
        out_size: window.in_size,
    };
    let columns = Columns::new(g, lg, over_g);
    let (taps, pixels) = (columns.rows(), columns.pixels());
    // W' [C, O*KH*KW]: row c holds W[o, c, KH-1-a, KW-1-b] at column (o, a, b).
    let channels = window.channels;
    let mut flipped = crate::pool::take(channels * taps);
    let [s_o, s_c, s_h, s_w] = [lw.strides[0], lw.strides[1], lw.strides[2], lw.strides[3]];
    for (c, dst) in flipped.chunks_exact_mut(taps.max(1)).enumerate() {
        for (column, d) in dst.iter_mut().enumerate() {
            let (o, tap) = (column / (kh * kw), column % (kh * kw));
            let (a, b) = (kh - 1 - tap / kw, kw - 1 - tap % kw);
            *d = w[lw.offset + o * s_o + c * s_c + a * s_h + b * s_w];
        }
    }
    let flipped = Scratch(flipped);
    let mut dx = crate::pool::take(window.batch * channels * window.in_plane());
    let to = ChannelsFirst::new(&mut dx, channels, window.in_plane());
    matmul_implicit_b(
        &flipped,
        &Layout::contiguous(&[channels, taps]),
        &PixelColumns(columns),
        taps,
        pixels,
        &|col0, block| to.write(col0, block),
    );
    dx
}

/// Values of column gradient `grad_input_by_folding` computes at a time (16 MiB).
const FOLD_CHUNK: usize = 1 << 22;

/// The input gradient of a strided convolution: the column gradient `W^T @ g` of a few
/// images at a time (at most `FOLD_CHUNK` values, at least one image), folded back onto x.
fn grad_input_by_folding(
    g: &[f32],
    lg: &Layout,
    w: &[f32],
    lw: &Layout,
    window: &Window2d,
) -> Vec<f32> {
    let out_channels = lw.shape[0];
    let taps = window.channels * window.taps();
    let plane = window.out_plane();
    let mut dx = crate::pool::take_zeroed(window.batch * window.channels * window.in_plane());
    if dx.is_empty() || plane == 0 || out_channels == 0 {
        return dx;
    }
    let w_flat = Scratch(contiguous(w, lw));
    let w_transposed = Layout::contiguous(&[out_channels, taps]).permute(&[1, 0]);
    let images_per_chunk = (FOLD_CHUNK / (taps * plane).max(1)).clamp(1, window.batch);
    let image_len = window.channels * window.in_plane();
    for (chunk, dx_chunk) in dx.chunks_mut(images_per_chunk * image_len).enumerate() {
        let first = chunk * images_per_chunk;
        let images = dx_chunk.len() / image_len;
        // g's images of this chunk in [O, N, OH, OW] order, i.e. [O, images * OH*OW].
        let g_chunk = Layout {
            shape: smallvec::smallvec![
                out_channels,
                images,
                window.out_size[0],
                window.out_size[1]
            ],
            strides: smallvec::smallvec![
                lg.strides[1],
                lg.strides[0],
                lg.strides[2],
                lg.strides[3]
            ],
            offset: lg.offset + first * lg.strides[0],
        };
        let g_chunk = Scratch(contiguous(g, &g_chunk));
        let cols_grad = Scratch(matmul_2d(
            &w_flat,
            &w_transposed,
            &g_chunk,
            &Layout::contiguous(&[out_channels, images * plane]),
        ));
        let sub_window = Window2d {
            batch: images,
            ..*window
        };
        col2im(&cols_grad, &sub_window, dx_chunk);
    }
    dx
}

/// The gradient of `conv2d` with respect to w, given x and the output gradient g.
pub fn conv2d_grad_weight(
    x: &[f32],
    lx: &Layout,
    g: &[f32],
    lg: &Layout,
    w_shape: &[usize],
    stride: [usize; 2],
    padding: [usize; 2],
) -> KResult<Vec<f32>> {
    conv2d_grad_weight_with(ConvAlgorithm::Auto, x, lx, g, lg, w_shape, stride, padding)
}

/// `conv2d_grad_weight` with a given algorithm (tests run each).
#[allow(clippy::too_many_arguments)]
pub fn conv2d_grad_weight_with(
    algorithm: ConvAlgorithm,
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
    let columns = Columns::new(x, lx, window);
    let (taps, pixels) = (columns.rows(), columns.pixels());
    // g as [O, N*OH*OW] (whole planes copied), read transposed as B of cols @ g^T.
    let g_by_channel = Scratch(contiguous(g, &lg.permute(&[1, 0, 2, 3])));
    let g_layout = Layout::contiguous(&[out_channels, pixels]).permute(&[1, 0]);
    // dW^T = cols @ g^T: the long pixel axis is K either way, and this puts the larger
    // C*KH*KW side on M, where the matmul splits work across threads.
    let dw_transposed = Scratch(if algorithm.explicit(&window) {
        let cols = Scratch(im2col(x, lx, &window));
        matmul_2d(
            &cols,
            &Layout::contiguous(&[taps, pixels]),
            &g_by_channel,
            &g_layout,
        )
    } else {
        matmul_implicit(TapRows(columns), taps, pixels, &g_by_channel, &g_layout)
    });
    Ok(contiguous(
        &dw_transposed,
        &Layout::contiguous(&[taps, out_channels]).permute(&[1, 0]),
    ))
}
