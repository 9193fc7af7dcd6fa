//! bf16 x bf16 -> f32 matrix multiply: bf16 operands (half the bytes of f32 to read), f32
//! accumulation and output.
//!
//! On CPUs with AVX-512 BF16 the micro-kernel is `vdpbf16ps`, which multiplies pairs of bf16
//! values along K and adds both products into f32 lanes: operands are packed in K pairs (B as
//! `[pair][column][2]`, A as one 32-bit word per row and pair), odd K padded with a zero.
//! Elsewhere the operands are widened to f32 and the f32 GEMM runs. Like the f32 path, tasks
//! split M and N, never K, so results do not depend on the thread count.

use half::bf16;

use super::Product;
use crate::cpu::check::KResult;
use crate::layout::{Dims, Layout};

/// How a bf16 product is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// Operands widened to f32, then the f32 GEMM (any CPU).
    Widen,
    /// 14 x 32 tiles of `vdpbf16ps` (x86-64 with AVX-512F and AVX-512 BF16).
    Avx512Bf16,
}

fn supported(kernel: Bf16Kernel) -> bool {
    match kernel {
        Bf16Kernel::Widen => true,
        #[cfg(target_arch = "x86_64")]
        Bf16Kernel::Avx512Bf16 => {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        Bf16Kernel::Avx512Bf16 => false,
    }
}

/// Every bf16 kernel this CPU runs.
pub fn bf16_kernels() -> Vec<Bf16Kernel> {
    [Bf16Kernel::Widen, Bf16Kernel::Avx512Bf16]
        .into_iter()
        .filter(|&k| supported(k))
        .collect()
}

/// The kernel `matmul_bf16` uses. `RTX_BF16=widen` or `RTX_BF16=dpbf16` forces one (the
/// second only where the CPU has it); otherwise `vdpbf16ps` on AMD CPUs that have it, and
/// widening elsewhere. Measured (2 cores, `models bench --filter gemm_bf16` with each):
/// on a Sapphire Rapids Xeon widening then the f32 GEMM runs at 309 GFLOP/s for n = 1024
/// and `vdpbf16ps` at 178 (it does twice the multiply-adds per instruction but issues at
/// half the rate of an f32 FMA there, and its pair packing costs more); on an AMD EPYC Zen 4
/// `vdpbf16ps` runs at 214-274 GFLOP/s for n = 512-2048 and widening at 153-165, as Zen 4
/// issues it at the rate of its f32 FMA.
pub fn bf16_kernel() -> Bf16Kernel {
    static KERNEL: std::sync::OnceLock<Bf16Kernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(|| {
        let dpbf16 = supported(Bf16Kernel::Avx512Bf16);
        match std::env::var("RTX_BF16").as_deref() {
            Ok("widen") => Bf16Kernel::Widen,
            Ok("dpbf16") if dpbf16 => Bf16Kernel::Avx512Bf16,
            _ if dpbf16 && cpu_vendor_is_amd() => Bf16Kernel::Avx512Bf16,
            _ => Bf16Kernel::Widen,
        }
    })
}

/// Whether CPUID names AMD as the vendor ("AuthenticAMD").
fn cpu_vendor_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let leaf = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&leaf.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&leaf.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&leaf.ecx.to_le_bytes());
        &vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Batched bf16 matmul with f32 results: a [..., M, K] @ b [..., K, N] -> [..., M, N], batch
/// dims broadcast NumPy style, rank >= 2 each, with `bf16_kernel()`.
pub fn matmul_bf16(a: &[bf16], la: &Layout, b: &[bf16], lb: &Layout) -> KResult<(Vec<f32>, Dims)> {
    matmul_bf16_with(bf16_kernel(), a, la, b, lb)
}

/// `matmul_bf16` with a given kernel (tests run each one); one the CPU lacks falls back to
/// `Widen`.
pub fn matmul_bf16_with(
    kernel: Bf16Kernel,
    a: &[bf16],
    la: &Layout,
    b: &[bf16],
    lb: &Layout,
) -> KResult<(Vec<f32>, Dims)> {
    let product = Product::check("matmul_bf16", a.len(), la, b.len(), lb)?;
    #[cfg(target_arch = "x86_64")]
    if kernel == Bf16Kernel::Avx512Bf16 && supported(kernel) {
        let out = pairs::packed_pairs(a, la, b, lb, &product);
        return Ok((out, product.out_shape));
    }
    let _ = kernel;
    let widen = |x: &[bf16]| {
        let mut out = crate::pool::take(x.len());
        for (o, v) in out.iter_mut().zip(x) {
            *o = v.to_f32();
        }
        crate::pool::Scratch(out)
    };
    let (af, bf) = (widen(a), widen(b));
    let out = super::gemm(super::gemm_kernel(), &af, la, &bf, lb, &product, None);
    Ok((out, product.out_shape))
}

/// The `vdpbf16ps` path (x86-64 only).
#[cfg(target_arch = "x86_64")]
mod pairs {
    use half::bf16;
    use rayon::prelude::*;

    use super::super::{Blocking, OutPtr, PARALLEL_WORK, Product, batch_layout, blocking};
    use crate::cpu::strided::{numel, position};
    use crate::layout::Layout;

    /// Tile of the `vdpbf16ps` kernel.
    const MR: usize = 14;
    const NR: usize = 32;
    /// K pairs per slice (512 values of K).
    const KCP: usize = 256;

    /// The product of operands that passed [`Product::check`], with `vdpbf16ps`; C has shape
    /// `product.out_shape`.
    pub(super) fn packed_pairs(
        a: &[bf16],
        la: &Layout,
        b: &[bf16],
        lb: &Layout,
        product: &Product,
    ) -> Vec<f32> {
        let (rank_a, rank_b) = (la.rank(), lb.rank());
        let Product {
            m,
            k,
            n,
            ref batch_shape,
            ref out_shape,
        } = *product;
        if numel(out_shape) == 0 || k == 0 {
            return crate::pool::take_zeroed(numel(out_shape));
        }
        let mut out = crate::pool::take(numel(out_shape));
        let batches = numel(batch_shape);
        let (a_batches, b_batches) = (batch_layout(la, batch_shape), batch_layout(lb, batch_shape));
        let a_base =
            |batch: usize| a_batches.offset + position(batch, batch_shape, &a_batches.strides);
        let b_base =
            |batch: usize| b_batches.offset + position(batch, batch_shape, &b_batches.strides);
        let (a_rs, a_cs) = (la.strides[rank_a - 2], la.strides[rank_a - 1]);
        let (b_rs, b_cs) = (lb.strides[rank_b - 2], lb.strides[rank_b - 1]);
        let pairs = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        let b_shared = b_batches.strides.iter().all(|&s| s == 0);
        let b_count = if b_shared { 1 } else { batches };
        let panel_len = pairs * NR * 2;
        let b_len = panels * panel_len;
        let parallel = (batches * m * n).saturating_mul(k) >= PARALLEL_WORK;

        // B: per column panel, per K pair, the 32 columns' (k, k + 1) values side by side.
        let mut packed_b = vec![0u16; b_count * b_len];
        let pack_b = |(index, dst): (usize, &mut [u16])| {
            let (batch, panel) = (index / panels, index % panels);
            let base = b_base(batch);
            let col0 = panel * NR;
            let width = NR.min(n - col0);
            for (p, pair) in dst.chunks_exact_mut(NR * 2).enumerate() {
                for j in 0..width {
                    for half in 0..2 {
                        let kk = 2 * p + half;
                        pair[2 * j + half] = if kk < k {
                            b[base + kk * b_rs + (col0 + j) * b_cs].to_bits()
                        } else {
                            0
                        };
                    }
                }
            }
        };
        if parallel {
            packed_b
                .par_chunks_mut(panel_len)
                .enumerate()
                .for_each(pack_b);
        } else {
            packed_b.chunks_mut(panel_len).enumerate().for_each(pack_b);
        }

        let work = (batches * m * n).saturating_mul(k);
        let blocks = blocking(m, n, batches, k, MR, NR, parallel.then_some(work));
        let Blocking {
            row_blocks,
            nc,
            col_blocks,
            ..
        } = blocks;
        let tasks = batches * row_blocks * col_blocks;
        let c = OutPtr(out.as_mut_ptr());
        let packed_b = &packed_b;
        let run = |task: usize| {
            let batch = task / (row_blocks * col_blocks);
            let (row0, rows) = blocks.rows((task / col_blocks) % row_blocks);
            let col0 = task % col_blocks * nc;
            let cols = nc.min(n - col0);
            let b_batch = &packed_b[if b_shared { 0 } else { batch * b_len }..][..b_len];
            let row_panels = rows.div_ceil(MR);
            let base = a_base(batch);
            let a_at = |row: usize, col: usize| a[base + row * a_rs + col * a_cs].to_bits() as u32;
            let mut packed_a = vec![0u32; row_panels * KCP.min(pairs) * MR];
            for p0 in (0..pairs).step_by(KCP) {
                let kp = KCP.min(pairs - p0);
                let packed_a = &mut packed_a[..row_panels * kp * MR];
                // A: per row panel, per K pair, one word per row holding (k, k + 1).
                for (panel, dst) in packed_a.chunks_exact_mut(kp * MR).enumerate() {
                    for p in 0..kp {
                        for r in 0..MR {
                            let row = row0 + panel * MR + r;
                            dst[p * MR + r] = if row < row0 + rows {
                                let kk = 2 * (p0 + p);
                                let lo = a_at(row, kk);
                                let hi = if kk + 1 < k { a_at(row, kk + 1) } else { 0 };
                                lo | (hi << 16)
                            } else {
                                0
                            };
                        }
                    }
                }
                for col_panel in col0 / NR..(col0 + cols).div_ceil(NR) {
                    let j0 = col_panel * NR;
                    let width = NR.min(n - j0);
                    let b_panel = &b_batch[col_panel * panel_len + p0 * NR * 2..][..kp * NR * 2];
                    for row_panel in 0..row_panels {
                        let i0 = row0 + row_panel * MR;
                        let height = MR.min(m - i0);
                        let a_panel = &packed_a[row_panel * kp * MR..][..kp * MR];
                        let accumulate = p0 > 0;
                        // SAFETY: (i0, j0) lies in this task's block of batch `batch`'s C.
                        let dst = unsafe { c.get().add(batch * m * n + i0 * n + j0) };
                        if height == MR && width == NR {
                            // SAFETY: a full tile; the panels hold kp pairs; the CPU has the
                            // instructions (checked by `supported`).
                            unsafe {
                                tile(kp, a_panel.as_ptr(), b_panel.as_ptr(), dst, n, accumulate)
                            };
                        } else {
                            let mut buf = [0.0f32; MR * NR];
                            // SAFETY: `buf` holds one whole tile at stride NR.
                            unsafe {
                                tile(
                                    kp,
                                    a_panel.as_ptr(),
                                    b_panel.as_ptr(),
                                    buf.as_mut_ptr(),
                                    NR,
                                    false,
                                )
                            };
                            for (r, buf_row) in buf.chunks_exact(NR).take(height).enumerate() {
                                for (j, &v) in buf_row[..width].iter().enumerate() {
                                    // SAFETY: row i0 + r < m and column j0 + j < n.
                                    unsafe {
                                        let d = dst.add(r * n + j);
                                        *d = if accumulate { *d + v } else { v };
                                    }
                                }
                            }
                        }
                    }
                }
            }
        };
        if parallel {
            (0..tasks).into_par_iter().for_each(run);
        } else {
            (0..tasks).for_each(run);
        }
        out
    }

    /// One 14 x 32 tile over `kp` K pairs: 28 `zmm` accumulators, two B vectors (16 columns x
    /// 2 values each), one broadcast A pair per row.
    ///
    /// # Safety
    /// `a` holds `kp * 14` words, `b` holds `kp * 64` values, `c` covers the tile at stride `ldc`,
    /// and the CPU has AVX-512F and AVX-512 BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile(
        kp: usize,
        a: *const u32,
        b: *const u16,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        use std::arch::x86_64::*;
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..kp {
            // SAFETY (whole block): the caller guarantees the panel lengths; `__m512bh` is 32
            // bf16 values, the same 64 bytes as the loaded integer vector.
            unsafe {
                let b0: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b.add(p * 64) as *const _));
                let b1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b.add(p * 64 + 32) as *const _));
                for (r, acc_row) in acc.iter_mut().enumerate() {
                    let pair: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*a.add(p * MR + r) as i32));
                    acc_row[0] = _mm512_dpbf16_ps(acc_row[0], pair, b0);
                    acc_row[1] = _mm512_dpbf16_ps(acc_row[1], pair, b1);
                }
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            for (half, &v) in acc_row.iter().enumerate() {
                // SAFETY: the caller guarantees `c` covers the tile at stride `ldc`.
                unsafe {
                    let dst = c.add(r * ldc + half * 16);
                    let v = if accumulate {
                        _mm512_add_ps(_mm512_loadu_ps(dst), v)
                    } else {
                        v
                    };
                    _mm512_storeu_ps(dst, v);
                }
            }
        }
    }
}
