//! Packing A is a transpose: the micro-kernel reads A k-major (`mr` values per k), while a
//! row-major A (an activation in `x @ W^T`, the column matrix of a convolution's weight
//! gradient) holds each row contiguously. One value at a time this costs a load and a store
//! per value; with AVX-512 a 16 x 16 block transposes in 64 shuffles, a quarter of an
//! operation per value, so the 14-row panels of the AVX-512 kernel take this path, and the
//! 6-row panels of the AVX2 kernel go through 8 x 8 blocks (two rows of zeros).
//!
//! Packing a transposed B (the weight of `x @ W^T`, every Linear's forward pass) is the same
//! transpose: a panel's columns are rows of W. With AVX2, 8 x 8 blocks transpose in 24
//! shuffles ([`columns_k_major`]).

use super::MatrixView;

/// Writes `rows[r][k]` to `dst[k * 14 + r]` for `k < kc`, when the CPU has AVX-512F; returns
/// false (and writes nothing) otherwise. Every row holds at least `kc` values and `dst` at
/// least `14 * kc`.
#[cfg(target_arch = "x86_64")]
pub(super) fn rows14_k_major(rows: &[&[f32]; 14], kc: usize, dst: &mut [f32]) -> bool {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return false;
    }
    assert!(rows.iter().all(|r| r.len() >= kc) && dst.len() >= 14 * kc);
    // SAFETY: the CPU has AVX-512F (checked above) and the lengths were checked.
    unsafe { rows14_avx512(rows, kc, dst) };
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn rows14_k_major(_rows: &[&[f32]; 14], _kc: usize, _dst: &mut [f32]) -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows14_avx512(rows: &[&[f32]; 14], kc: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = kc / 16 * 16;
    let mut kb = 0;
    while kb < full {
        let mut block = [_mm512_setzero_ps(); 16];
        for (r, row) in rows.iter().enumerate() {
            // SAFETY: kb + 16 <= kc <= row.len().
            block[r] = unsafe { _mm512_loadu_ps(row.as_ptr().add(kb)) };
        }
        transpose16(&mut block);
        for (j, column) in block.iter().enumerate() {
            // SAFETY: (kb + j) * 14 + 14 <= kc * 14 <= dst.len(); the mask writes 14 lanes.
            unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr().add((kb + j) * 14), 0x3fff, *column) };
        }
        kb += 16;
    }
    for k in full..kc {
        for (r, row) in rows.iter().enumerate() {
            dst[k * 14 + r] = row[k];
        }
    }
}

/// Writes `rows[r][k]` to `dst[k * 6 + r]` for `k < kc` (the 6-row panels of the AVX2
/// kernel), when the CPU has AVX2; returns false (and writes nothing) otherwise. Every row
/// holds at least `kc` values and `dst` at least `6 * kc`.
#[cfg(target_arch = "x86_64")]
pub(super) fn rows6_k_major(rows: &[&[f32]; 6], kc: usize, dst: &mut [f32]) -> bool {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return false;
    }
    assert!(rows.iter().all(|r| r.len() >= kc) && dst.len() >= 6 * kc);
    // SAFETY: the CPU has AVX2 (checked above) and the lengths were checked.
    unsafe { rows6_avx2(rows, kc, dst) };
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn rows6_k_major(_rows: &[&[f32]; 6], _kc: usize, _dst: &mut [f32]) -> bool {
    false
}

/// Eight k at a time: the six rows' runs and two zero rows transpose as an 8 x 8 block, and
/// each k's first six lanes are stored. Seven of the eight stores are whole vectors whose two
/// extra lanes the next k's store overwrites; the eighth stores four lanes and then two, so
/// nothing past the block is touched.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows6_avx2(rows: &[&[f32]; 6], kc: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = kc / 8 * 8;
    let out = dst.as_mut_ptr();
    let mut kb = 0;
    while kb < full {
        let mut block = [_mm256_setzero_ps(); 8];
        for (r, row) in rows.iter().enumerate() {
            // SAFETY: kb + 8 <= kc <= row.len().
            block[r] = unsafe { _mm256_loadu_ps(row.as_ptr().add(kb)) };
        }
        transpose8(&mut block);
        // SAFETY: the whole-vector stores for k = kb..kb + 7 end at (kb + 6) * 6 + 8 <=
        // (kb + 8) * 6 <= kc * 6 <= dst.len(); the last k writes exactly its six values.
        unsafe {
            for (j, column) in block.iter().enumerate().take(7) {
                _mm256_storeu_ps(out.add((kb + j) * 6), *column);
            }
            let last = out.add((kb + 7) * 6);
            _mm_storeu_ps(last, _mm256_castps256_ps128(block[7]));
            _mm_store_sd(
                last.add(4).cast(),
                _mm_castps_pd(_mm256_extractf128_ps::<1>(block[7])),
            );
        }
        kb += 8;
    }
    for k in full..kc {
        for (r, row) in rows.iter().enumerate() {
            dst[k * 6 + r] = row[k];
        }
    }
}

/// Writes `scale * m[j * rs + c]` to `t[c * stride + j]` for `j < rows`, `c < cols`, by
/// 16 x 16 blocks, when the CPU has AVX-512F and both counts are multiples of 16; returns
/// false (and writes nothing) otherwise. Attention transposes its keys and values so, once
/// per slice: one value at a time it was a tenth of the attention kernels' time.
#[cfg(target_arch = "x86_64")]
pub(crate) fn transpose_scaled(
    (m, rs): (&[f32], usize),
    (rows, cols): (usize, usize),
    scale: f32,
    (t, stride): (&mut [f32], usize),
) -> bool {
    if !std::arch::is_x86_feature_detected!("avx512f")
        || !rows.is_multiple_of(16)
        || !cols.is_multiple_of(16)
        || rows == 0
        || cols == 0
        || stride < rows
        || m.len() < (rows - 1) * rs + cols
        || t.len() < (cols - 1) * stride + rows
    {
        return false;
    }
    // SAFETY: the CPU has AVX-512F and every read and write was bounded above.
    unsafe { transpose_scaled_avx512((m, rs), (rows, cols), scale, (t, stride)) };
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn transpose_scaled(
    _m: (&[f32], usize),
    _shape: (usize, usize),
    _scale: f32,
    _t: (&mut [f32], usize),
) -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_scaled_avx512(
    (m, rs): (&[f32], usize),
    (rows, cols): (usize, usize),
    scale: f32,
    (t, stride): (&mut [f32], usize),
) {
    use std::arch::x86_64::*;
    let factor = _mm512_set1_ps(scale);
    for j0 in (0..rows).step_by(16) {
        for c0 in (0..cols).step_by(16) {
            let mut block = [_mm512_setzero_ps(); 16];
            for (r, row) in block.iter_mut().enumerate() {
                // SAFETY: (j0 + r) * rs + c0 + 16 <= (rows - 1) * rs + cols <= m.len().
                *row = _mm512_mul_ps(
                    unsafe { _mm512_loadu_ps(m.as_ptr().add((j0 + r) * rs + c0)) },
                    factor,
                );
            }
            transpose16(&mut block);
            for (c, column) in block.iter().enumerate() {
                // SAFETY: (c0 + c) * stride + j0 + 16 <= (cols - 1) * stride + rows <= t.len().
                unsafe { _mm512_storeu_ps(t.as_mut_ptr().add((c0 + c) * stride + j0), *column) };
            }
        }
    }
}

/// Transposes the 16 x 16 block held one row per register: unpack pairs of rows (2 x 2
/// blocks), then pairs of 64-bit halves (4 x 4 blocks within each 128-bit lane), then swap
/// 128-bit lanes twice.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let lo = |a: __m512, b: __m512| {
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
    };
    let hi = |a: __m512, b: __m512| {
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
    };
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let b = 4 * g;
        u[b] = lo(t[b], t[b + 2]);
        u[b + 1] = hi(t[b], t[b + 2]);
        u[b + 2] = lo(t[b + 1], t[b + 3]);
        u[b + 3] = hi(t[b + 1], t[b + 3]);
    }
    let mut v = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        v[i] = _mm512_shuffle_f32x4::<0x88>(u[i], u[i + 4]);
        v[i + 4] = _mm512_shuffle_f32x4::<0xdd>(u[i], u[i + 4]);
        v[i + 8] = _mm512_shuffle_f32x4::<0x88>(u[i + 8], u[i + 12]);
        v[i + 12] = _mm512_shuffle_f32x4::<0xdd>(u[i + 8], u[i + 12]);
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(v[i], v[i + 8]);
        r[i + 8] = _mm512_shuffle_f32x4::<0xdd>(v[i], v[i + 8]);
    }
}

#[cfg(test)]
mod tests {
    use super::{rows6_k_major, rows14_k_major, transpose_scaled};

    #[test]
    fn a_scaled_transpose_by_blocks_matches_one_value_at_a_time() {
        let (rows, cols, rs, stride) = (32, 48, 53, 40);
        let m: Vec<f32> = (0..rows * rs).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut t = vec![f32::NAN; cols * stride];
        if !transpose_scaled((&m, rs), (rows, cols), 0.5, (&mut t, stride)) {
            return; // no AVX-512 here: the caller's loop runs instead
        }
        for c in 0..cols {
            for j in 0..rows {
                assert_eq!(
                    t[c * stride + j],
                    m[j * rs + c] * 0.5,
                    "column {c}, row {j}"
                );
            }
            assert!(
                t[c * stride + rows..(c + 1) * stride]
                    .iter()
                    .all(|v| v.is_nan())
            );
        }
    }

    #[test]
    fn six_rows_become_k_major_for_any_width_without_writing_past_the_panel() {
        for kc in [1, 7, 8, 9, 16, 17, 64, 129] {
            let data: Vec<Vec<f32>> = (0..6)
                .map(|r| (0..kc).map(|k| (r * 1000 + k) as f32).collect())
                .collect();
            let rows: [&[f32]; 6] = std::array::from_fn(|r| data[r].as_slice());
            let mut dst = vec![f32::NAN; 6 * kc + 4];
            if !rows6_k_major(&rows, kc, &mut dst[..6 * kc]) {
                eprintln!("skipped: no AVX2 on this CPU");
                return;
            }
            for k in 0..kc {
                for r in 0..6 {
                    assert_eq!(dst[k * 6 + r], (r * 1000 + k) as f32, "kc {kc} k {k} r {r}");
                }
            }
            assert!(
                dst[6 * kc..].iter().all(|v| v.is_nan()),
                "kc {kc}: wrote past the panel"
            );
        }
    }

    #[test]
    fn fourteen_rows_become_k_major_for_any_width() {
        for kc in [1, 15, 16, 17, 33, 256] {
            let data: Vec<Vec<f32>> = (0..14)
                .map(|r| (0..kc).map(|k| (r * 1000 + k) as f32).collect())
                .collect();
            let rows: [&[f32]; 14] = std::array::from_fn(|r| data[r].as_slice());
            let mut dst = vec![f32::NAN; 14 * kc];
            if !rows14_k_major(&rows, kc, &mut dst) {
                eprintln!("skipped: no AVX-512F on this CPU");
                return;
            }
            for k in 0..kc {
                for r in 0..14 {
                    assert_eq!(
                        dst[k * 14 + r],
                        (r * 1000 + k) as f32,
                        "kc {kc} k {k} r {r}"
                    );
                }
            }
        }
    }
}

/// Packs the full B panel of columns `col0..col0 + nr` (`nr` a multiple of 8) of the
/// column-major `b` (`row_stride == 1`: each column contiguous along k) k-major into `dst`
/// (`dst[kk * nr + j] = b[kk, col0 + j]` for `kk < k`), when the CPU has AVX2; returns false
/// (and writes nothing) otherwise. The caller checked that the panel lies inside `b` and
/// `dst` holds `k * nr` values.
#[cfg(target_arch = "x86_64")]
pub(super) fn columns_k_major(
    b: MatrixView,
    k: usize,
    nr: usize,
    col0: usize,
    dst: &mut [f32],
) -> bool {
    if !nr.is_multiple_of(8) || !std::arch::is_x86_feature_detected!("avx2") {
        return false;
    }
    let last = b.offset + (col0 + nr - 1) * b.col_stride + k;
    if b.row_stride != 1 || k == 0 || last > b.data.len() || dst.len() < k * nr {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above), every column read holds `k` values inside
    // `b.data` (its last one ends at `last`), and `dst` holds `k * nr`.
    unsafe { columns_avx2(b, k, nr, col0, dst) };
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn columns_k_major(
    _b: MatrixView,
    _k: usize,
    _nr: usize,
    _col0: usize,
    _dst: &mut [f32],
) -> bool {
    false
}

/// # Safety
/// As checked by [`columns_k_major`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn columns_avx2(b: MatrixView, k: usize, nr: usize, col0: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let column = |j: usize| b.offset + (col0 + j) * b.col_stride;
    let full = k / 8 * 8;
    // K blocks outermost, so the part of the panel being written (8 x nr) stays in L1.
    for kb in (0..full).step_by(8) {
        for g in (0..nr).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, row) in r.iter_mut().enumerate() {
                // SAFETY: column `g + i` holds `k >= kb + 8` values from `column(g + i)`.
                *row = unsafe { _mm256_loadu_ps(b.data.as_ptr().add(column(g + i) + kb)) };
            }
            transpose8(&mut r);
            for (t, row) in r.iter().enumerate() {
                // SAFETY: (kb + t) * nr + g + 8 <= k * nr <= dst.len().
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((kb + t) * nr + g), *row) };
            }
        }
    }
    for kk in full..k {
        for j in 0..nr {
            dst[kk * nr + j] = b.data[column(j) + kk];
        }
    }
}

/// Transposes the 8 x 8 block held one row per register: unpack pairs of rows, shuffle
/// pairs of 64-bit halves, then swap 128-bit lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose8(r: &mut [std::arch::x86_64::__m256; 8]) {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
    r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
    r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
    r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
    r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
    r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
    r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
    r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
}
