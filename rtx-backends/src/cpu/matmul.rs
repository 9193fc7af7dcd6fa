//! Batched matrix multiply: packed panels, cache blocking, a register-tiled micro-kernel.
//!
//! B is packed once per distinct batch matrix into column panels `NR` wide; each task packs its
//! rows of A into row panels `MR` tall. The micro-kernel keeps an `MR x NR` tile of C in
//! registers and runs over a `KC` slice of K; panels are zero-padded so edges need no special
//! case. Tasks split rows and columns of C, never K, so every output element sums its K terms
//! in the same order whatever the thread count.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::layout::Layout;

use super::elementwise::broadcast_shape;
use super::strided::numel;

/// Rows up to which a product skips packing (`multiply_direct`), and the width of its panel.
const DIRECT_ROWS: usize = 4;
const NR: usize = 8;
/// K slice per pass, so a B panel slice (KC x NR) stays in L1 and an A block in L2.
const KC: usize = 256;
/// Columns of C per task; a multiple of every kernel's tile width.
const NC: usize = 256;
/// Multiply-adds below which forking costs more than it saves.
const PARALLEL_WORK: usize = 1 << 17;

/// A matrix read through strides, so transposed or otherwise strided inputs need no copy.
#[derive(Clone, Copy)]
struct MatrixView<'a> {
    data: &'a [f32],
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl MatrixView<'_> {
    fn get(&self, row: usize, col: usize) -> f32 {
        self.data[self.offset + row * self.row_stride + col * self.col_stride]
    }
}

/// A block of C owned by one task: `rows[i][j]` is C[row0 + i, col0 + j].
struct Tile<'c> {
    batch: usize,
    row0: usize,
    col0: usize,
    rows: Vec<&'c mut [f32]>,
}

/// A register-tiled micro-kernel, chosen once per process from what the CPU supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// 4 x 8 tiles in plain Rust that the compiler vectorizes for the build's baseline ISA.
    Portable,
    /// 6 x 16 tiles with AVX2 and fused multiply-add (x86-64 with AVX2 and FMA).
    Avx2Fma,
}

impl GemmKernel {
    /// Tile height (rows of A per micro-kernel) and width (columns of B).
    fn tile(self) -> (usize, usize) {
        match self {
            GemmKernel::Portable => (4, 8),
            GemmKernel::Avx2Fma => (6, 16),
        }
    }
}

/// Whether this CPU can run `kernel` (std caches the feature detection).
fn supported(kernel: GemmKernel) -> bool {
    match kernel {
        GemmKernel::Portable => true,
        #[cfg(target_arch = "x86_64")]
        GemmKernel::Avx2Fma => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
        #[cfg(not(target_arch = "x86_64"))]
        GemmKernel::Avx2Fma => false,
    }
}

/// Every kernel this CPU can run, the best last.
pub fn gemm_kernels() -> Vec<GemmKernel> {
    [GemmKernel::Portable, GemmKernel::Avx2Fma]
        .into_iter()
        .filter(|&k| supported(k))
        .collect()
}

/// The kernel `matmul` uses: the best this CPU runs, or the portable one when the environment
/// variable `RTX_GEMM` is `portable`.
pub fn gemm_kernel() -> GemmKernel {
    static KERNEL: std::sync::OnceLock<GemmKernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(|| {
        if std::env::var("RTX_GEMM").as_deref() == Ok("portable") {
            return GemmKernel::Portable;
        }
        gemm_kernels()
            .last()
            .copied()
            .unwrap_or(GemmKernel::Portable)
    })
}

/// Batched matmul: a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast NumPy style; rank >= 2 each (caller promotes 1-D). Returns (out, out_shape).
pub fn matmul(a: &[f32], la: &Layout, b: &[f32], lb: &Layout) -> (Vec<f32>, Vec<usize>) {
    matmul_with(gemm_kernel(), a, la, b, lb)
}

/// `matmul` with a given micro-kernel (tests run every one the CPU supports). A kernel the CPU
/// lacks falls back to the portable one.
pub fn matmul_with(
    kernel: GemmKernel,
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
) -> (Vec<f32>, Vec<usize>) {
    let kernel = if supported(kernel) {
        kernel
    } else {
        GemmKernel::Portable
    };
    let (mr, nr) = kernel.tile();
    let mc = 8 * mr;
    let (rank_a, rank_b) = (la.rank(), lb.rank());
    let (m, k) = (la.shape[rank_a - 2], la.shape[rank_a - 1]);
    let n = lb.shape[rank_b - 1];
    let batch_shape = broadcast_shape(&la.shape[..rank_a - 2], &lb.shape[..rank_b - 2])
        .expect("caller guarantees broadcastable batch dims");
    let mut out_shape = batch_shape.clone();
    out_shape.extend([m, n]);
    if numel(&out_shape) == 0 || k == 0 {
        return (crate::pool::take_zeroed(numel(&out_shape)), out_shape);
    }
    // Every element is written: by the first K slice of its tile, or by the direct path.
    let mut out = crate::pool::take(numel(&out_shape));

    let a_offsets = batch_offsets(la, &batch_shape);
    let b_offsets = batch_offsets(lb, &batch_shape);
    let a_view = |offset| MatrixView {
        data: a,
        offset,
        row_stride: la.strides[rank_a - 2],
        col_stride: la.strides[rank_a - 1],
    };
    let b_view = |offset| MatrixView {
        data: b,
        offset,
        row_stride: lb.strides[rank_b - 2],
        col_stride: lb.strides[rank_b - 1],
    };
    let parallel = a_offsets.len() * m * n * k >= PARALLEL_WORK;
    if m <= DIRECT_ROWS {
        // A few rows (a batch-1 forward pass): packing B would cost more than the product.
        for (batch, c) in out.chunks_mut(m * n).enumerate() {
            multiply_direct(a_view(a_offsets[batch]), b_view(b_offsets[batch]), m, k, c);
        }
        return (out, out_shape);
    }

    // A broadcast B (a weight shared across the batch) has one offset and is packed once.
    let mut distinct_b: Vec<usize> = Vec::new();
    let mut packed_index: HashMap<usize, usize> = HashMap::new();
    let b_of_batch: Vec<usize> = b_offsets
        .iter()
        .map(|&offset| {
            *packed_index.entry(offset).or_insert_with(|| {
                distinct_b.push(offset);
                distinct_b.len() - 1
            })
        })
        .collect();
    let packed_b: Vec<Vec<f32>> = if parallel {
        distinct_b
            .par_iter()
            .map(|&offset| pack_b(b_view(offset), k, n, nr))
            .collect()
    } else {
        distinct_b
            .iter()
            .map(|&offset| pack_b(b_view(offset), k, n, nr))
            .collect()
    };

    let mut tiles = Vec::new();
    for (batch, c) in out.chunks_mut(m * n).enumerate() {
        for (block, c_rows) in c.chunks_mut(mc * n).enumerate() {
            let first = tiles.len();
            for col0 in (0..n).step_by(NC) {
                tiles.push(Tile {
                    batch,
                    row0: block * mc,
                    col0,
                    rows: Vec::new(),
                });
            }
            for row in c_rows.chunks_mut(n) {
                for (j, segment) in row.chunks_mut(NC).enumerate() {
                    tiles[first + j].rows.push(segment);
                }
            }
        }
    }
    let run = |tile: Tile| {
        let packed_a = pack_a(
            a_view(a_offsets[tile.batch]),
            tile.row0,
            tile.rows.len(),
            k,
            mr,
        );
        let packed_b = &packed_b[b_of_batch[tile.batch]];
        match kernel {
            GemmKernel::Portable => multiply_tile::<4, 8, false>(tile, &packed_a, packed_b, k),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `kernel` is Avx2Fma only when the CPU has AVX2 and FMA (checked above).
            GemmKernel::Avx2Fma => unsafe { multiply_tile_avx2(tile, &packed_a, packed_b, k) },
            #[cfg(not(target_arch = "x86_64"))]
            GemmKernel::Avx2Fma => multiply_tile::<4, 8, false>(tile, &packed_a, packed_b, k),
        }
    };
    if parallel {
        tiles.into_par_iter().for_each(run);
    } else {
        tiles.into_iter().for_each(run);
    }
    (out, out_shape)
}

/// Buffer offset of each batch matrix of `l`, with `l`'s batch dims broadcast to `batch_shape`.
fn batch_offsets(l: &Layout, batch_shape: &[usize]) -> Vec<usize> {
    let batch_rank = l.rank() - 2;
    Layout {
        shape: l.shape[..batch_rank].to_vec(),
        strides: l.strides[..batch_rank].to_vec(),
        offset: l.offset,
    }
    .broadcast_to(batch_shape)
    .indices()
    .collect()
}

/// B [K, N] as column panels `nr` wide, each K x nr row-major (columns past N are zero), so a
/// K slice of a panel is one contiguous run.
fn pack_b(b: MatrixView, k: usize, n: usize, nr: usize) -> Vec<f32> {
    let panels = n.div_ceil(nr);
    let mut packed = vec![0.0; panels * k * nr];
    for (panel, dst) in packed.chunks_mut(k * nr).enumerate() {
        let col0 = panel * nr;
        let width = nr.min(n - col0);
        for (kk, dst_row) in dst.chunks_mut(nr).enumerate() {
            if b.col_stride == 1 {
                let start = b.offset + kk * b.row_stride + col0;
                dst_row[..width].copy_from_slice(&b.data[start..start + width]);
            } else {
                for (j, d) in dst_row[..width].iter_mut().enumerate() {
                    *d = b.get(kk, col0 + j);
                }
            }
        }
    }
    packed
}

/// Rows `row0..row0 + rows` of A [M, K] as row panels `mr` tall, each stored K-major (mr values
/// per k; rows past the end are zero).
fn pack_a(a: MatrixView, row0: usize, rows: usize, k: usize, mr: usize) -> Vec<f32> {
    let panels = rows.div_ceil(mr);
    let mut packed = vec![0.0; panels * k * mr];
    for (panel, dst) in packed.chunks_mut(k * mr).enumerate() {
        let height = mr.min(rows - panel * mr);
        for r in 0..height {
            let row = row0 + panel * mr + r;
            for kk in 0..k {
                dst[kk * mr + r] = a.get(row, kk);
            }
        }
    }
    packed
}

/// The AVX2 + FMA build of `multiply_tile`: the same code, compiled for those instructions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn multiply_tile_avx2(tile: Tile, packed_a: &[f32], packed_b: &[f32], k: usize) {
    multiply_tile::<6, 16, true>(tile, packed_a, packed_b, k)
}

/// One task's block of C from packed panels, with `MR x NR` register tiles; `FMA` uses fused
/// multiply-adds (only in builds for CPUs that have them, see `multiply_tile_avx2`).
#[inline(always)]
fn multiply_tile<const MR: usize, const NR: usize, const FMA: bool>(
    mut tile: Tile,
    packed_a: &[f32],
    packed_b: &[f32],
    k: usize,
) {
    let width = tile.rows.first().map_or(0, |row| row.len());
    let row_panels = tile.rows.len().div_ceil(MR);
    let first_panel = tile.col0 / NR;
    let col_panels = width.div_ceil(NR);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        for col_panel in 0..col_panels {
            let b_slice = &packed_b[(first_panel + col_panel) * k * NR + k0 * NR..][..kc * NR];
            let j0 = col_panel * NR;
            let cols = NR.min(width - j0);
            for row_panel in 0..row_panels {
                let a_slice = &packed_a[row_panel * k * MR + k0 * MR..][..kc * MR];
                let acc = micro_kernel::<MR, NR, FMA>(a_slice, b_slice);
                let height = MR.min(tile.rows.len() - row_panel * MR);
                for (r, acc_row) in acc.iter().enumerate().take(height) {
                    let dst = &mut tile.rows[row_panel * MR + r][j0..j0 + cols];
                    if k0 == 0 {
                        dst.copy_from_slice(&acc_row[..cols]);
                    } else {
                        for (d, &v) in dst.iter_mut().zip(acc_row) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// C [m, n] = A [m, k] B [k, n] without packing all of B, for m <= MR (a batch-1 forward pass,
/// where packing B would cost more than the product). Each NR-column block of B is copied
/// into one small K x NR panel, read along B's contiguous axis, then every row of A runs over
/// it with NR accumulators, summing each element's terms in the order the packed path uses.
fn multiply_direct(a: MatrixView, b: MatrixView, m: usize, k: usize, c: &mut [f32]) {
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
    let mut panel = vec![0.0f32; k * NR];
    for j0 in (0..n).step_by(NR) {
        let width = NR.min(n - j0);
        if width < NR {
            panel.fill(0.0);
        }
        if b.col_stride == 1 {
            for (kk, dst) in panel.chunks_exact_mut(NR).enumerate() {
                let start = b.offset + kk * b.row_stride + j0;
                dst[..width].copy_from_slice(&b.data[start..start + width]);
            }
        } else if b.row_stride == 1 {
            for j in 0..width {
                let start = b.offset + (j0 + j) * b.col_stride;
                for (kk, &v) in b.data[start..start + k].iter().enumerate() {
                    panel[kk * NR + j] = v;
                }
            }
        } else {
            for (kk, dst) in panel.chunks_exact_mut(NR).enumerate() {
                for (j, d) in dst[..width].iter_mut().enumerate() {
                    *d = b.get(kk, j0 + j);
                }
            }
        }
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

/// One MR x NR tile of A-panel times B-panel over a K slice, accumulated in registers in k order.
#[inline(always)]
fn micro_kernel<const MR: usize, const NR: usize, const FMA: bool>(
    a_slice: &[f32],
    b_slice: &[f32],
) -> [[f32; NR]; MR] {
    let mut acc = [[0.0f32; NR]; MR];
    for (a_col, b_row) in a_slice.chunks_exact(MR).zip(b_slice.chunks_exact(NR)) {
        // chunks_exact yields exactly MR / NR values, so these conversions cannot fail; the
        // fixed-size arrays let the compiler drop bounds checks and vectorize across NR.
        let (Ok(a_col), Ok(b_row)) = (<&[f32; MR]>::try_from(a_col), <&[f32; NR]>::try_from(b_row))
        else {
            continue;
        };
        for (acc_row, &a_value) in acc.iter_mut().zip(a_col) {
            for (c, &b_value) in acc_row.iter_mut().zip(b_row) {
                *c = if FMA {
                    a_value.mul_add(b_value, *c)
                } else {
                    *c + a_value * b_value
                };
            }
        }
    }
    acc
}
