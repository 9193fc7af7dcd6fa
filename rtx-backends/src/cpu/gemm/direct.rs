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
