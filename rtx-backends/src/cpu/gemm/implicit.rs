//! Products whose B is never stored whole (implicit GEMM): B is built one `KC x NC` block at a
//! time, by the task about to use it, straight into packed panels. A convolution's column
//! matrix (`cpu/columns.rs`) is such a B: the forward pass and the stride-1 input gradient
//! read the image through it, with no im2col buffer.
//!
//! Loop order (BLIS's, with B's block packed per task): A is packed once, whole (a weight:
//! small); tasks own blocks of `NC` columns of C, and per K slice pack their B block (L2),
//! then run every A micro-panel against each B micro-panel (L1). Tasks split N only, never
//! K, so results do not depend on the thread count.

use rayon::prelude::*;

use super::scratch::{MAX_PACKED_A, with_cached_scratch, with_packed_a};
use super::{KC, MatrixView, PARALLEL_WORK, TileShape, gemm_kernel, pack, tile};
use crate::layout::Layout;
use crate::pool::Scratch;

/// A B operand built block by block as the GEMM packs it.
pub(crate) trait PackB: Sync {
    /// Columns `col0..col0 + cols`, rows `k0..k0 + kc` of B as column panels `nr` wide, each
    /// `kc x nr` row-major (columns past `col0 + cols` zero). `dst` holds
    /// `cols.div_ceil(nr) * kc * nr` values.
    fn pack(&self, col0: usize, cols: usize, k0: usize, kc: usize, nr: usize, dst: &mut [f32]);
}

/// C [m, n] = A [m, k] @ B [k, n] (`la` a matrix view of rank 2 that an internal caller built
/// over `a`, B built by `b`). C is not returned whole: each finished block of columns
/// `col0..col0 + cols` (all `m` rows, row stride `cols`) goes to `write(col0, block)`, from
/// whichever thread computed it; the blocks cover C once.
pub(crate) fn matmul_implicit_b<B: PackB>(
    a: &[f32],
    la: &Layout,
    b: &B,
    k: usize,
    n: usize,
    write: &(dyn Fn(usize, &[f32]) + Sync),
) {
    debug_assert!(la.rank() == 2 && la.shape[1] == k);
    let m = la.shape[0];
    if m == 0 || n == 0 {
        return;
    }
    let kernel = gemm_kernel();
    let (mr, nr, micro) = kernel.spec();
    let shape = TileShape { micro, mr, nr };
    // A B block of `KC x nc` fits one packed-A buffer of the explicit path.
    let nc = (MAX_PACKED_A / KC / nr).max(1) * nr;
    let blocks = n.div_ceil(nc);
    if k == 0 {
        for block in 0..blocks {
            let cols = nc.min(n - block * nc);
            write(block * nc, &Scratch(crate::pool::take_zeroed(m * cols)));
        }
        return;
    }
    let a_view = MatrixView {
        data: a,
        offset: la.offset,
        row_stride: la.strides[0],
        col_stride: la.strides[1],
    };
    let panels = m.div_ceil(mr);
    with_cached_scratch(panels * mr * k, |packed_a| {
        // K slice `k0` of A occupies `panels * mr * kc` values from `panels * mr * k0`.
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let dst = &mut packed_a[panels * mr * k0..][..panels * mr * kc];
            pack::pack_a(a_view, 0, m, k0, kc, mr, dst);
        }
        let packed_a = &*packed_a;
        let run = |block: usize| {
            let (col0, cols) = (block * nc, nc.min(n - block * nc));
            let b_panels = cols.div_ceil(nr);
            let mut c = Scratch(crate::pool::take(m * cols));
            with_packed_a(b_panels * KC.min(k) * nr, |packed_b| {
                for k0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - k0);
                    let packed_b = &mut packed_b[..b_panels * kc * nr];
                    b.pack(col0, cols, k0, kc, nr, packed_b);
                    let a_slice = &packed_a[panels * mr * k0..][..panels * mr * kc];
                    for (panel, b_panel) in packed_b.chunks_exact(kc * nr).enumerate() {
                        let j0 = panel * nr;
                        let width = nr.min(cols - j0);
                        for (row_panel, a_panel) in a_slice.chunks_exact(kc * mr).enumerate() {
                            let i0 = row_panel * mr;
                            let height = mr.min(m - i0);
                            // SAFETY: the tile (i0.., j0..) of `height x width` lies inside
                            // this task's `m x cols` block, owned by this task; the panels
                            // hold `kc * mr` and `kc * nr` values; `micro` runs on this CPU
                            // (`gemm_kernel` only picks supported kernels).
                            unsafe {
                                tile(
                                    shape,
                                    kc,
                                    a_panel,
                                    b_panel,
                                    c.0.as_mut_ptr().add(i0 * cols + j0),
                                    cols,
                                    height,
                                    width,
                                    k0 > 0,
                                )
                            };
                        }
                    }
                }
            });
            write(col0, &c);
        };
        if (m * n).saturating_mul(k) >= PARALLEL_WORK && blocks > 1 {
            (0..blocks).into_par_iter().for_each(run);
        } else {
            (0..blocks).for_each(run);
        }
    });
}
