//! Packing: copying operands into the order the micro-kernels read them, so the kernel's
//! loads are unit-stride whatever the operand's strides (transposed inputs need no copy
//! beforehand). Edges are zero-padded to whole panels, so the kernels have no edge case.

use super::MatrixView;

/// Panel `panel` of B [k, n] packed as column panels `nr` wide, each `k x nr` row-major, so
/// a K slice of a panel is one contiguous run (columns past `n` are zero). `dst` holds
/// `k * nr` values.
pub(super) fn pack_b_panel(
    b: MatrixView,
    k: usize,
    n: usize,
    nr: usize,
    panel: usize,
    dst: &mut [f32],
) {
    let col0 = panel * nr;
    let width = nr.min(n - col0);
    if b.row_stride == 1 && b.col_stride != 1 {
        // B stored column-major (a transposed weight): read down each column, a full panel
        // by 8 x 8 transposes where the CPU has them.
        if width == nr && super::transpose::columns_k_major(b, k, nr, col0, dst) {
            return;
        }
        if width < nr {
            dst.fill(0.0);
        }
        // In slices of K, so the part of the panel being written (`KB x nr`) stays in L1
        // while every column passes over it.
        const KB: usize = 64;
        for k0 in (0..k).step_by(KB) {
            let kb = KB.min(k - k0);
            let block = &mut dst[k0 * nr..(k0 + kb) * nr];
            for j in 0..width {
                let start = b.offset + (col0 + j) * b.col_stride + k0;
                for (kk, &v) in b.data[start..start + kb].iter().enumerate() {
                    block[kk * nr + j] = v;
                }
            }
        }
        return;
    }
    if b.col_stride == 1 && width == nr {
        // Full panels of the kernels' widths copy a constant width: a few vector moves per k
        // rather than a memcpy call for 16 values.
        match nr {
            16 => return pack_b_rows::<16>(b, k, col0, dst),
            32 => return pack_b_rows::<32>(b, k, col0, dst),
            _ => {}
        }
    }
    for (kk, dst_row) in dst.chunks_exact_mut(nr).enumerate().take(k) {
        if b.col_stride == 1 {
            let start = b.offset + kk * b.row_stride + col0;
            dst_row[..width].copy_from_slice(&b.data[start..start + width]);
        } else {
            for (j, d) in dst_row[..width].iter_mut().enumerate() {
                *d = b.get(kk, col0 + j);
            }
        }
        dst_row[width..].fill(0.0);
    }
}

/// All of B packed as [`pack_b_panel`] packs each panel, for `count` operands (`b_of(i)`,
/// each `k x n`), into `dst` (`count * panels * k * nr` values, operand by operand).
///
/// A row-major B is packed a band of K rows at a time into every panel: one panel at a time
/// reads a `nr`-value stripe of each of the k rows, which for an activation that has left
/// the caches (a weight gradient's B, packed cold) is a miss per row with the prefetcher
/// unable to follow, while a band reads B front to back.
pub(super) fn pack_b<'b>(
    b_of: &(dyn Fn(usize) -> MatrixView<'b> + Sync),
    count: usize,
    k: usize,
    n: usize,
    nr: usize,
    dst: &mut [f32],
    parallel: bool,
) {
    use rayon::prelude::*;
    let panels = n.div_ceil(nr);
    let by_rows = panels > 1 && (0..count).all(|i| b_of(i).col_stride == 1);
    if !by_rows {
        let pack = |(index, dst): (usize, &mut [f32])| {
            let (operand, panel) = (index / panels, index % panels);
            pack_b_panel(b_of(operand), k, n, nr, panel, dst);
        };
        if parallel {
            dst.par_chunks_mut(k * nr).enumerate().for_each(pack);
        } else {
            dst.chunks_mut(k * nr).enumerate().for_each(pack);
        }
        return;
    }
    // Band `band` of operand `i` writes rows `band * ROW_BAND..` of each of that operand's
    // panels: through a raw pointer, since those rows are no one contiguous slice (and a list
    // of slices per band would allocate on every product).
    let per_operand = k.div_ceil(ROW_BAND);
    // The bound every write below relies on (the caller sizes `dst` so).
    assert!(
        dst.len() >= count * panels * k * nr,
        "packed B buffer too short"
    );
    let base = super::OutPtr(dst.as_mut_ptr());
    let pack = |index: usize| {
        let (operand, band) = (index / per_operand, index % per_operand);
        let k0 = band * ROW_BAND;
        // SAFETY: `dst` holds `count * panels * k * nr` values; this band's rows of this
        // operand's panels are written by this call alone.
        unsafe {
            let panels_at = base.get().add(operand * panels * k * nr);
            pack_b_band(
                b_of(operand),
                k0,
                ROW_BAND.min(k - k0),
                n,
                nr,
                panels_at,
                k * nr,
            );
        }
    };
    if parallel {
        (0..count * per_operand).into_par_iter().for_each(pack);
    } else {
        (0..count * per_operand).for_each(pack);
    }
}

/// Rows of K per band when a row-major B is packed by bands (`pack_b`): a band's slice of a
/// 32-wide panel is 8 KiB.
const ROW_BAND: usize = 64;

/// Rows `k0..k0 + kb` of a row-major B (`col_stride == 1`) into each of its panels, which
/// start `panel_len` values apart from `panels` (columns past `n` are zero).
///
/// # Safety
/// `panels` points at `n.div_ceil(nr)` panels of `panel_len >= (k0 + kb) * nr` values, whose
/// rows `k0..k0 + kb` no one else touches during the call.
unsafe fn pack_b_band(
    b: MatrixView,
    k0: usize,
    kb: usize,
    n: usize,
    nr: usize,
    panels: *mut f32,
    panel_len: usize,
) {
    // SAFETY: the caller's guarantees, passed on.
    unsafe {
        match nr {
            16 => pack_b_band_of::<16>(b, k0, kb, n, panels, panel_len),
            32 => pack_b_band_of::<32>(b, k0, kb, n, panels, panel_len),
            8 => pack_b_band_of::<8>(b, k0, kb, n, panels, panel_len),
            _ => pack_b_band_any(b, k0, kb, n, nr, panels, panel_len),
        }
    }
}

/// [`pack_b_band`] for a kernel width known at compile time: each panel row is a copy of a
/// constant `NR` values, which compiles to a few vector moves. With the width a run-time
/// value every panel row was a `memmove` call for 128 bytes, and those calls were a third of
/// a weight gradient's time beside its micro-kernel (m = 128, k = 2048, n = 512).
///
/// # Safety
/// As [`pack_b_band`], with `nr == NR`.
#[inline(always)]
unsafe fn pack_b_band_of<const NR: usize>(
    b: MatrixView,
    k0: usize,
    kb: usize,
    n: usize,
    panels: *mut f32,
    panel_len: usize,
) {
    for kk in 0..kb {
        let start = b.offset + (k0 + kk) * b.row_stride;
        let (full, tail) = b.data[start..start + n].as_chunks::<NR>();
        for (p, src) in full.iter().enumerate() {
            // SAFETY: row `k0 + kk` of panel `p`, inside it and this call's alone.
            unsafe {
                let dst = panels
                    .add(p * panel_len + (k0 + kk) * NR)
                    .cast::<[f32; NR]>();
                dst.write_unaligned(*src);
            }
        }
        if !tail.is_empty() {
            // SAFETY: as above, for the last, partial panel.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    panels.add(full.len() * panel_len + (k0 + kk) * NR),
                    NR,
                )
            };
            dst[..tail.len()].copy_from_slice(tail);
            dst[tail.len()..].fill(0.0);
        }
    }
}

/// [`pack_b_band`] for any kernel width.
///
/// # Safety
/// As [`pack_b_band`].
unsafe fn pack_b_band_any(
    b: MatrixView,
    k0: usize,
    kb: usize,
    n: usize,
    nr: usize,
    panels: *mut f32,
    panel_len: usize,
) {
    let count = n.div_ceil(nr);
    for kk in 0..kb {
        let start = b.offset + (k0 + kk) * b.row_stride;
        let row = &b.data[start..start + n];
        for p in 0..count {
            // SAFETY: row `k0 + kk` of panel `p`, inside it and this call's alone.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(panels.add(p * panel_len + (k0 + kk) * nr), nr)
            };
            let width = nr.min(n - p * nr);
            dst[..width].copy_from_slice(&row[p * nr..p * nr + width]);
            dst[width..].fill(0.0);
        }
    }
}

/// A full `NR`-wide panel of a row-major B (`col_stride == 1`) from column `col0`, into
/// `dst` (`k * NR` values).
#[inline(always)]
fn pack_b_rows<const NR: usize>(b: MatrixView, k: usize, col0: usize, dst: &mut [f32]) {
    for (kk, dst_row) in dst.chunks_exact_mut(NR).enumerate().take(k) {
        let start = b.offset + kk * b.row_stride + col0;
        dst_row.copy_from_slice(&b.data[start..start + NR]);
    }
}

/// Rows `row0..row0 + rows`, columns `k0..k0 + kc` of A as row panels `mr` tall, each stored
/// k-major (`mr` values per k; rows past the end are zero). `dst` holds
/// `rows.div_ceil(mr) * kc * mr` values.
pub(super) fn pack_a(
    a: MatrixView,
    row0: usize,
    rows: usize,
    k0: usize,
    kc: usize,
    mr: usize,
    dst: &mut [f32],
) {
    for (panel, panel_dst) in dst.chunks_exact_mut(kc * mr).enumerate() {
        let first = row0 + panel * mr;
        let height = mr.min(rows - panel * mr);
        if height < mr {
            panel_dst.fill(0.0);
        }
        if a.col_stride == 1 && height == mr && matches!(mr, 14 | 8 | 6 | 4) {
            // A full panel of a kernel's height: the row count is a constant, so the loop over
            // rows unrolls and each row's bounds are checked once, not per value.
            match mr {
                14 => pack_rows::<14>(a, first, k0, kc, panel_dst),
                8 => pack_rows::<8>(a, first, k0, kc, panel_dst),
                6 => pack_rows::<6>(a, first, k0, kc, panel_dst),
                _ => pack_rows::<4>(a, first, k0, kc, panel_dst),
            }
        } else if a.col_stride == 1 && mr <= 16 {
            // Rows of A are contiguous: read the panel's rows side by side and write each k's
            // `mr` values contiguously (every kernel's `mr` is at most 16).
            let rows: [&[f32]; 16] = std::array::from_fn(|r| {
                if r < height {
                    let start = a.offset + (first + r) * a.row_stride + k0;
                    &a.data[start..start + kc]
                } else {
                    &[]
                }
            });
            for (kk, dst) in panel_dst.chunks_exact_mut(mr).enumerate() {
                for (d, row) in dst[..height].iter_mut().zip(&rows) {
                    *d = row[kk];
                }
            }
        } else if a.col_stride == 1 {
            for r in 0..height {
                let start = a.offset + (first + r) * a.row_stride + k0;
                for (kk, &v) in a.data[start..start + kc].iter().enumerate() {
                    panel_dst[kk * mr + r] = v;
                }
            }
        } else if a.row_stride == 1 {
            // A stored column-major (a transposed activation in a weight gradient): each k
            // is a contiguous run of rows.
            // Full panels of the kernels' heights copy a constant width: a few vector moves
            // per k rather than a memcpy call for 14 values.
            match (height == mr, mr) {
                (true, 14) => pack_columns::<14>(a, first, k0, kc, panel_dst),
                (true, 8) => pack_columns::<8>(a, first, k0, kc, panel_dst),
                (true, 6) => pack_columns::<6>(a, first, k0, kc, panel_dst),
                (true, 4) => pack_columns::<4>(a, first, k0, kc, panel_dst),
                _ => {
                    for kk in 0..kc {
                        let start = a.offset + (k0 + kk) * a.col_stride + first;
                        panel_dst[kk * mr..kk * mr + height]
                            .copy_from_slice(&a.data[start..start + height]);
                    }
                }
            }
        } else {
            for r in 0..height {
                for kk in 0..kc {
                    panel_dst[kk * mr + r] = a.get(first + r, k0 + kk);
                }
            }
        }
    }
}

/// `MR` rows of a column-major A (`a.row_stride == 1`), columns `k0..k0 + kc`, k-major.
#[inline(always)]
fn pack_columns<const MR: usize>(
    a: MatrixView,
    first: usize,
    k0: usize,
    kc: usize,
    panel_dst: &mut [f32],
) {
    for (kk, dst) in panel_dst.chunks_exact_mut(MR).take(kc).enumerate() {
        let start = a.offset + (k0 + kk) * a.col_stride + first;
        dst.copy_from_slice(&a.data[start..start + MR]);
    }
}

/// `MR` rows of a row-major A (`a.col_stride == 1`), columns `k0..k0 + kc`, k-major: each k
/// gathers one value from every row.
#[inline(always)]
fn pack_rows<const MR: usize>(
    a: MatrixView,
    first: usize,
    k0: usize,
    kc: usize,
    panel_dst: &mut [f32],
) {
    let rows: [&[f32]; MR] = std::array::from_fn(|r| {
        let start = a.offset + (first + r) * a.row_stride + k0;
        &a.data[start..start + kc]
    });
    if let Ok(rows14) = <&[&[f32]; 14]>::try_from(rows.as_slice())
        && super::transpose::rows14_k_major(rows14, kc, panel_dst)
    {
        return;
    }
    if let Ok(rows6) = <&[&[f32]; 6]>::try_from(rows.as_slice())
        && super::transpose::rows6_k_major(rows6, kc, panel_dst)
    {
        return;
    }
    for (kk, dst) in panel_dst.chunks_exact_mut(MR).take(kc).enumerate() {
        for (d, row) in dst.iter_mut().zip(&rows) {
            *d = row[kk];
        }
    }
}
