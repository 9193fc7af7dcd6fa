//! Products that packing would not pay for: a few rows of A (a batch-1 forward pass), where B
//! is read in place or through one small panel, and a few columns of B read along K (a
//! classifier head, `h @ W^T` with W `[10, 128]`), where every element is one dot product
//! instead of a 32-wide tile two thirds empty.

use rayon::prelude::*;

use super::{GemmKernel, KC, MatrixView, PARALLEL_WORK, with_scratch};

/// Width of the panel `multiply_direct` copies B into.
const NR: usize = 8;

/// C [m, n] = A [m, k] B [k, n] for a few rows of A. Each NR-column block of B is copied into
/// one small `k x NR` panel, read along B's contiguous axis, then every row of A runs over it
/// with NR accumulators, in K slices summed in order as the packed path does.
pub(super) fn multiply_direct(a: MatrixView, b: MatrixView, m: usize, k: usize, c: &mut [f32]) {
    let n = c.len() / m.max(1);
    if a.col_stride == 1 && b.row_stride == 1 {
        // Rows of A against columns of B, both contiguous (x @ W^T with W a row-major Linear
        // weight): one dot product per element, eight lanes wide so it vectorizes; the lanes
        // are added in a fixed order, so the result is deterministic (though rounded
        // differently from the packed path).
        for (i, c_row) in c.chunks_mut(n).enumerate() {
            let a_row = &a.data[a.offset + i * a.row_stride..][..k];
            for (j, out) in c_row.iter_mut().enumerate() {
                let b_col = &b.data[b.offset + j * b.col_stride..][..k];
                *out = dot(a_row, b_col);
            }
        }
        return;
    }
    with_scratch(&super::PACKED_B, k * NR, 0, |panel| {
        for j0 in (0..n).step_by(NR) {
            let width = NR.min(n - j0);
            super::pack::pack_b_panel(b, k, n, NR, j0 / NR, panel);
            for (i, c_row) in c.chunks_mut(n).enumerate() {
                let mut total = [0.0f32; NR];
                for k0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - k0);
                    let mut acc = [0.0f32; NR];
                    for (kk, b_row) in panel[k0 * NR..(k0 + kc) * NR].chunks_exact(NR).enumerate() {
                        let a_value = a.get(i, k0 + kk);
                        for (c, &b_value) in acc.iter_mut().zip(b_row) {
                            *c += a_value * b_value;
                        }
                    }
                    if k0 == 0 {
                        total = acc;
                    } else {
                        for (t, v) in total.iter_mut().zip(acc) {
                            *t += v;
                        }
                    }
                }
                c_row[j0..j0 + width].copy_from_slice(&total[..width]);
            }
        }
    });
}

/// C [m, n] = A [m, k] B [k, n] as one dot product per element, for A's rows and B's columns
/// both contiguous along K and few columns. Rows are split across threads in pieces of a
/// fixed size, and each element is one `dot_with` call: the result does not depend on the
/// thread count.
pub(super) fn multiply_dots(
    kernel: GemmKernel,
    a: MatrixView,
    b: MatrixView,
    m: usize,
    k: usize,
    c: &mut [f32],
) {
    let n = c.len() / m.max(1);
    if n == 0 {
        return;
    }
    let dot = dot_for(kernel);
    let rows = |first: usize, block: &mut [f32]| {
        for (r, c_row) in block.chunks_mut(n).enumerate() {
            let a_row = &a.data[a.offset + (first + r) * a.row_stride..][..k];
            for (j, out) in c_row.iter_mut().enumerate() {
                *out = dot(a_row, &b.data[b.offset + j * b.col_stride..][..k]);
            }
        }
    };
    let rows_per_piece = (PARALLEL_WORK / (n * k).max(1)).max(1);
    if m * n * k >= PARALLEL_WORK && m > rows_per_piece {
        c.par_chunks_mut(rows_per_piece * n)
            .enumerate()
            .for_each(|(p, block)| rows(p * rows_per_piece, block));
    } else {
        rows(0, c);
    }
}

/// The dot product of the widest instruction set `kernel` allows.
fn dot_for(kernel: GemmKernel) -> fn(&[f32], &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if kernel == GemmKernel::Avx512 && super::supported(kernel) {
        // SAFETY: AVX-512F is present (checked just above).
        return |x, y| unsafe { dot_avx512(x, y) };
    }
    let _ = kernel;
    dot
}

/// `x . y` with AVX-512: two 16-lane accumulators over 32 elements a step, combined in a fixed
/// order, then the tail.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let len = x.len().min(y.len());
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    // SAFETY (whole block): every load reads 16 values at i or i + 16 with i + 32 <= len.
    unsafe {
        while i + 32 <= len {
            let (xp, yp) = (x.as_ptr().add(i), y.as_ptr().add(i));
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp), _mm512_loadu_ps(yp), acc0);
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(xp.add(16)),
                _mm512_loadu_ps(yp.add(16)),
                acc1,
            );
            i += 32;
        }
        if i + 16 <= len {
            let (xp, yp) = (x.as_ptr().add(i), y.as_ptr().add(i));
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp), _mm512_loadu_ps(yp), acc0);
            i += 16;
        }
    }
    let mut total = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (a, b) in x[i..len].iter().zip(&y[i..len]) {
        total += a * b;
    }
    total
}

/// `x . y` over equal-length slices: eight partial sums, combined pairwise in a fixed order.
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (x_tail, y_tail) = (xc.remainder(), yc.remainder());
    for (xs, ys) in xc.zip(yc) {
        for l in 0..8 {
            lanes[l] += xs[l] * ys[l];
        }
    }
    for (l, (a, b)) in x_tail.iter().zip(y_tail).enumerate() {
        lanes[l] += a * b;
    }
    let quads = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quads[0] + quads[2]) + (quads[1] + quads[3])
}

/// C [m, n] = A [m, k] B [k, n] for at most 16 columns with AVX-512, A's rows contiguous
/// along K: B in one `k x 16` panel, then 14 rows of A at a time straight from A (packing A
/// would touch every value of it for only `n` multiply-adds each). Blocks of 14 rows are
/// split across threads; each sums its K slices in order, as the packed path does, so the
/// result does not depend on the thread count.
#[cfg(target_arch = "x86_64")]
pub(super) fn multiply_narrow(a: MatrixView, b: MatrixView, m: usize, k: usize, c: &mut [f32]) {
    use super::kernels::{avx512_14x16, avx512_14x16_rows};
    const MR: usize = 14;
    const WIDTH: usize = 16;
    let n = c.len() / m.max(1);
    debug_assert!(n <= WIDTH && a.col_stride == 1 && super::supported(GemmKernel::Avx512));
    // The panel comes from the shared buffer cache, not this thread's scratch: whichever
    // worker drives the call varies from step to step, and a per-thread buffer would first
    // grow on each of them at some later step.
    super::with_cached_scratch(k * WIDTH, |panel| {
        super::pack::pack_b_panel(b, k, n, WIDTH, 0, panel);
        let panel = &*panel;
        let block = |index: usize, c_block: &mut [f32]| {
            let (row0, height) = (index * MR, c_block.len() / n);
            let mut tile = [0.0f32; MR * WIDTH];
            let mut tail = [0.0f32; MR * KC];
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                let b_slice = &panel[k0 * WIDTH..][..kc * WIDTH];
                let first = a.offset + row0 * a.row_stride + k0;
                if height == MR {
                    // The last row read is `first + 13 * row_stride + kc - 1`.
                    let _ = &a.data[first..=first + (MR - 1) * a.row_stride + kc - 1];
                    // SAFETY: the 14 rows of `kc` values lie in `a.data` (checked just above),
                    // the panel holds `kc * 16`, `tile` is 14 x 16, and AVX-512F is present
                    // (the caller's choice of kernel).
                    unsafe {
                        avx512_14x16_rows(
                            kc,
                            a.data.as_ptr().add(first),
                            a.row_stride,
                            b_slice.as_ptr(),
                            tile.as_mut_ptr(),
                            WIDTH,
                            k0 > 0,
                        )
                    };
                } else {
                    let packed = &mut tail[..kc * MR];
                    super::pack::pack_a(a, row0, height, k0, kc, MR, packed);
                    // SAFETY: as above, with A packed (zero past `height`).
                    unsafe {
                        avx512_14x16(
                            kc,
                            packed.as_ptr(),
                            b_slice.as_ptr(),
                            tile.as_mut_ptr(),
                            WIDTH,
                            k0 > 0,
                        )
                    };
                }
            }
            for (c_row, tile_row) in c_block.chunks_exact_mut(n).zip(tile.chunks_exact(WIDTH)) {
                c_row.copy_from_slice(&tile_row[..n]);
            }
        };
        if m * n * k >= PARALLEL_WORK && m > MR {
            c.par_chunks_mut(MR * n)
                .enumerate()
                .for_each(|(i, c_block)| block(i, c_block));
        } else {
            c.chunks_mut(MR * n)
                .enumerate()
                .for_each(|(i, c_block)| block(i, c_block));
        }
    });
}

/// `sums[i]` = the sum of row `i` of A over its `k` columns, in column order, in f64, then
/// rounded: as the packed path adds them while packing, so either gives the same bits.
pub(super) fn sum_rows(a: MatrixView, k: usize, sums: &mut [f32]) {
    for (i, s) in sums.iter_mut().enumerate() {
        let mut acc = 0f64;
        for p in 0..k {
            acc += a.get(i, p) as f64;
        }
        *s = acc as f32;
    }
}
