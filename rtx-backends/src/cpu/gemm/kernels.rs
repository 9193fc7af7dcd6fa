//! Register-tiled micro-kernels: `C[MR x NR] (+)= A-panel (MR x kc, k-major) * B-panel
//! (kc x NR, row-major)`, one per instruction set, picked once at run time.
//!
//! Every kernel sums each element's `kc` terms in k order (one accumulator per element), so
//! a kernel's result does not depend on how the driver splits M and N across threads.

/// A micro-kernel: `c` points at an `MR x NR` tile with row stride `ldc`; with `accumulate`
/// the tile is added to what `c` holds, otherwise it overwrites it.
///
/// # Safety
/// `a` holds `kc * MR` values, `b` holds `kc * NR`, `c` is valid for the tile, and the CPU
/// has the kernel's instruction set.
pub(super) type MicroKernel =
    unsafe fn(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool);

/// Plain Rust over fixed-size arrays, which the compiler vectorizes for the build's baseline
/// (SSE2 on x86-64, NEON on aarch64).
pub(super) unsafe fn portable<const MR: usize, const NR: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees the panel lengths.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, kc * MR),
            std::slice::from_raw_parts(b, kc * NR),
        )
    };
    let mut acc = [[0.0f32; NR]; MR];
    for (a_col, b_row) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for (acc_row, &a_value) in acc.iter_mut().zip(a_col) {
            for (out, &b_value) in acc_row.iter_mut().zip(b_row) {
                *out += a_value * b_value;
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        for (j, &v) in acc_row.iter().enumerate() {
            // SAFETY: the caller guarantees `c` covers MR rows of NR values at stride `ldc`.
            unsafe {
                let dst = c.add(r * ldc + j);
                *dst = if accumulate { *dst + v } else { v };
            }
        }
    }
}

/// 6 x 16 with AVX2 and FMA: twelve `ymm` accumulators, two B vectors, one broadcast of A.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn avx2_6x16(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    const MR: usize = 6;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..kc {
        // SAFETY (whole block): the caller guarantees `kc * 16` values of B and `kc * 6` of A.
        unsafe {
            let b0 = _mm256_loadu_ps(b.add(p * 16));
            let b1 = _mm256_loadu_ps(b.add(p * 16 + 8));
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let a_value = _mm256_broadcast_ss(&*a.add(p * MR + r));
                acc_row[0] = _mm256_fmadd_ps(a_value, b0, acc_row[0]);
                acc_row[1] = _mm256_fmadd_ps(a_value, b1, acc_row[1]);
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        for (half, &v) in acc_row.iter().enumerate() {
            // SAFETY: the caller guarantees `c` covers the 6 x 16 tile at stride `ldc`.
            unsafe {
                let dst = c.add(r * ldc + half * 8);
                let v = if accumulate {
                    _mm256_add_ps(_mm256_loadu_ps(dst), v)
                } else {
                    v
                };
                _mm256_storeu_ps(dst, v);
            }
        }
    }
}

/// 14 x 32 with AVX-512: twenty-eight `zmm` accumulators, two B vectors, one broadcast of A
/// (31 of the 32 registers), so each B load feeds 14 fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn avx512_14x32(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    const MR: usize = 14;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for p in 0..kc {
        // SAFETY (whole block): the caller guarantees `kc * 32` values of B and `kc * 14` of A.
        unsafe {
            let b0 = _mm512_loadu_ps(b.add(p * 32));
            let b1 = _mm512_loadu_ps(b.add(p * 32 + 16));
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let a_value = _mm512_set1_ps(*a.add(p * MR + r));
                acc_row[0] = _mm512_fmadd_ps(a_value, b0, acc_row[0]);
                acc_row[1] = _mm512_fmadd_ps(a_value, b1, acc_row[1]);
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        for (half, &v) in acc_row.iter().enumerate() {
            // SAFETY: the caller guarantees `c` covers the 14 x 32 tile at stride `ldc`.
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

/// 8 x 12 with NEON (every aarch64 CPU, Apple silicon included): twenty-four `q`
/// accumulators, two A vectors whose lanes are the eight rows (`fmla` by lane, so A needs no
/// broadcast) and three B vectors: 29 of the 32 registers, as in OpenBLAS's 8x12 kernel.
#[cfg(target_arch = "aarch64")]
pub(super) unsafe fn neon_8x12(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::aarch64::*;
    const MR: usize = 8;
    const NR: usize = 12;
    // SAFETY (whole body): the caller guarantees `kc * 12` values of B, `kc * 8` of A and an
    // 8 x 12 tile at `c` with row stride `ldc`; NEON is part of the aarch64 baseline.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 3]; MR];
        for p in 0..kc {
            let a_lo = vld1q_f32(a.add(p * MR));
            let a_hi = vld1q_f32(a.add(p * MR + 4));
            let bs = [
                vld1q_f32(b.add(p * NR)),
                vld1q_f32(b.add(p * NR + 4)),
                vld1q_f32(b.add(p * NR + 8)),
            ];
            for (j, &b_vec) in bs.iter().enumerate() {
                acc[0][j] = vfmaq_laneq_f32::<0>(acc[0][j], b_vec, a_lo);
                acc[1][j] = vfmaq_laneq_f32::<1>(acc[1][j], b_vec, a_lo);
                acc[2][j] = vfmaq_laneq_f32::<2>(acc[2][j], b_vec, a_lo);
                acc[3][j] = vfmaq_laneq_f32::<3>(acc[3][j], b_vec, a_lo);
                acc[4][j] = vfmaq_laneq_f32::<0>(acc[4][j], b_vec, a_hi);
                acc[5][j] = vfmaq_laneq_f32::<1>(acc[5][j], b_vec, a_hi);
                acc[6][j] = vfmaq_laneq_f32::<2>(acc[6][j], b_vec, a_hi);
                acc[7][j] = vfmaq_laneq_f32::<3>(acc[7][j], b_vec, a_hi);
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            for (quarter, &v) in acc_row.iter().enumerate() {
                let dst = c.add(r * ldc + quarter * 4);
                let v = if accumulate {
                    vaddq_f32(vld1q_f32(dst), v)
                } else {
                    v
                };
                vst1q_f32(dst, v);
            }
        }
    }
}

/// 14 x 16 with AVX-512: one `zmm` accumulator per row, for products of at most 16 columns
/// (a classifier head's 10 logits), where the 14 x 32 tile would be two thirds padding; A
/// packed (k-major, 14 values per k).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn avx512_14x16(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller's guarantees.
    unsafe { avx512_14x16_with::<true>(kc, a, 0, b, c, ldc, accumulate) }
}

/// `avx512_14x16` reading A in place: row `r` of the tile is `a + r * lda`, contiguous along
/// K. For products so narrow that packing A would cost more than multiplying it.
///
/// # Safety
/// Rows `a + r * lda` for `r < 14` hold `kc` values each, `b` holds `kc * 16`, `c` covers
/// the tile, and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn avx512_14x16_rows(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller's guarantees.
    unsafe { avx512_14x16_with::<false>(kc, a, lda, b, c, ldc, accumulate) }
}

/// The 14 x 16 tile, A packed (`PACKED`: element (r, p) at `a + 14 p + r`) or in rows
/// (at `a + r lda + p`); a constant, so each form compiles to its own loop.
///
/// # Safety
/// As `avx512_14x16` or `avx512_14x16_rows`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_14x16_with<const PACKED: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    const MR: usize = 14;
    let mut acc = [_mm512_setzero_ps(); MR];
    for p in 0..kc {
        // SAFETY (whole block): the caller's guarantees.
        unsafe {
            let b0 = _mm512_loadu_ps(b.add(p * 16));
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let at = if PACKED { p * MR + r } else { r * lda + p };
                let a_value = _mm512_set1_ps(*a.add(at));
                *acc_row = _mm512_fmadd_ps(a_value, b0, *acc_row);
            }
        }
    }
    for (r, &v) in acc.iter().enumerate() {
        // SAFETY: the caller guarantees `c` covers the 14 x 16 tile at stride `ldc`.
        unsafe {
            let dst = c.add(r * ldc);
            let v = if accumulate {
                _mm512_add_ps(_mm512_loadu_ps(dst), v)
            } else {
                v
            };
            _mm512_storeu_ps(dst, v);
        }
    }
}
