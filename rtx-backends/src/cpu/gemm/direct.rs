//! Products with a few rows of A (a batch-1 forward pass): packing B would cost more than the
//! product, so B is read in place or through one small panel.

use super::{KC, MatrixView, with_scratch};

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
