//! The packed path of the GEMM: B packed once into column panels, then tasks over blocks of
//! C, each packing its block of A per K slice (or reading A packed once for all column
//! blocks), running the micro-kernel over every tile and the epilogue over the finished block.

use rayon::prelude::*;

use super::blocking::{Blocking, blocking};
use super::kernels::MicroKernel;
use super::scratch::{with_cached_scratch, with_packed_a};
use super::{
    Epilogue, GemmKernel, KC, MAX_TILE, MatrixView, OutPtr, PARALLEL_WORK, PackA, SHARED_A_MAX,
    SHARED_A_PANELS, pack,
};

/// The sizes of a product on the packed path: `batches` products `[m, k] @ [k, n]`, with
/// one B for all of them when `b_shared`.
#[derive(Clone, Copy)]
pub(super) struct PackedProduct {
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) batches: usize,
    pub(super) b_shared: bool,
    /// Whether packing A costs more than reading a matrix (an implicit A, built from an
    /// image): then tasks never split columns, which would build each block of A again.
    pub(super) costly_a: bool,
    /// Where each row's sum of A goes (`batches * m` values), added up as A is packed.
    pub(super) row_sums: Option<OutPtr>,
}

/// The packed path: B packed once into column panels, then tasks over blocks of C, each
/// packing its A block per K slice through `a_of(batch)`. Writes every element of `out`
/// (`batches * m * n` values, `k > 0`).
pub(super) fn packed<'b, A: PackA>(
    kernel: GemmKernel,
    sizes: PackedProduct,
    a_of: &(dyn Fn(usize) -> A + Sync),
    b_view: &(dyn Fn(usize) -> MatrixView<'b> + Sync),
    epilogue: Option<Epilogue<'_>>,
    out: &mut [f32],
) {
    let PackedProduct {
        m,
        k,
        n,
        batches,
        b_shared,
        costly_a,
        row_sums,
    } = sizes;
    let (mr, nr, micro) = kernel.spec_for(n);
    let parallel = (batches * m * n).saturating_mul(k) >= PARALLEL_WORK;
    // A B shared by every batch (a weight) is packed once.
    let b_count = if b_shared { 1 } else { batches };
    let panels = n.div_ceil(nr);
    let b_len = panels * k * nr;

    let work = (batches * m * n).saturating_mul(k);
    let mut blocks = blocking(m, n, batches, k, mr, nr, parallel.then_some(work));
    if costly_a {
        // Each column block would build A again: split rows only.
        blocks = blocks.rows_only(n);
    }
    let Blocking {
        row_blocks,
        nc,
        col_blocks,
        ..
    } = blocks;
    let tasks = batches * row_blocks * col_blocks;
    // Every column block of a row block packs the same A: when there are several, pack all of
    // A once up front instead (unless A is built from an image, or too large to keep).
    let a_panels = m.div_ceil(mr);
    let a_len = a_panels * mr * k;
    // Row sums are added up while a task packs its block or, when A is packed once, from
    // that packed A (a weight gradient with K = 2048 split into column blocks packed all of
    // A again per block, which cost it a fifth of its time).
    let share_a = col_blocks > 1 && !costly_a && batches * a_len <= SHARED_A_MAX;

    let c = OutPtr(out.as_mut_ptr());
    // Packed B comes from the shared buffer cache, not this thread's scratch: a call from
    // outside the pool is driven by whichever worker picks it up, and a per-thread buffer
    // would first grow on each worker at some arbitrary later step.
    with_cached_scratch(b_count * b_len, |packed_b| {
        pack::pack_b(b_view, b_count, k, n, nr, packed_b, parallel);
        let packed_b = &*packed_b;
        with_cached_scratch(if share_a { batches * a_len } else { 0 }, |shared_a| {
            if share_a {
                // Per batch, K slice `k0` holds every row panel over that slice from
                // `a_panels * mr * k0`, as a task would pack it.
                pack_shared_a(a_of, (batches, m, k), (mr, a_panels), shared_a, parallel);
                if let Some(sums) = row_sums {
                    for (batch, batch_a) in shared_a.chunks(a_len).enumerate() {
                        // SAFETY: `batch * m` is inside the `batches * m` sums.
                        let sums = OutPtr(unsafe { sums.get().add(batch * m) });
                        sum_shared_rows(batch_a, m, k, mr, sums, parallel);
                    }
                }
            }
            let shared_a = &*shared_a;
            let run = |task: usize| {
                let batch = task / (row_blocks * col_blocks);
                let (row0, rows) = blocks.rows((task / col_blocks) % row_blocks);
                let col0 = task % col_blocks * nc;
                let a = a_of(batch);
                let block = Block {
                    batch,
                    epilogue,
                    a: &a,
                    shared_a: share_a.then(|| (&shared_a[batch * a_len..][..a_len], a_panels)),
                    // The first column block of each row block adds up its rows.
                    // SAFETY: `batch * m` is inside the `batches * m` sums.
                    row_sums: row_sums
                        .filter(|_| col0 == 0 && !share_a)
                        .map(|p| OutPtr(unsafe { p.get().add(batch * m) })),
                    packed_b: &packed_b[if b_shared { 0 } else { batch * b_len }..][..b_len],
                    // SAFETY: `batch * m * n` is inside `out`, which holds `batches * m * n`.
                    c: unsafe { c.get().add(batch * m * n) },
                    m,
                    n,
                    k,
                    rows: (row0, rows),
                    cols: (col0, nc.min(n - col0)),
                    mr,
                    nr,
                    micro,
                };
                // SAFETY: tasks cover disjoint blocks of C, and `micro` runs on this CPU.
                unsafe { block.multiply() };
            };
            if parallel {
                (0..tasks).into_par_iter().for_each(run);
            } else {
                (0..tasks).for_each(run);
            }
        });
    });
}

/// Every batch's A packed once for all column blocks into `shared_a` (`batches` runs of
/// `a_panels * mr * k` values): per batch, K slice `k0` holds every row panel over that slice
/// from `a_panels * mr * k0`, as a task would pack it. One parallel pass over all (batch,
/// K slice, group of `SHARED_A_PANELS` panels) pieces: forking once per K slice over a
/// weight gradient's three groups left one of two threads idle a third of the time.
fn pack_shared_a<A: PackA>(
    a_of: &(dyn Fn(usize) -> A + Sync),
    (batches, m, k): (usize, usize, usize),
    (mr, a_panels): (usize, usize),
    shared_a: &mut [f32],
    parallel: bool,
) {
    let a_len = a_panels * mr * k;
    let slices = k.div_ceil(KC);
    let groups = a_panels.div_ceil(SHARED_A_PANELS);
    // The bound every write below relies on (the caller sizes `shared_a` so).
    assert!(
        shared_a.len() >= batches * a_len,
        "shared A buffer too short"
    );
    let base = OutPtr(shared_a.as_mut_ptr());
    let pack = |piece: usize| {
        let (batch, rest) = (piece / (slices * groups), piece % (slices * groups));
        let (slice, g) = (rest / groups, rest % groups);
        let (k0, row0) = (slice * KC, g * SHARED_A_PANELS * mr);
        let kc = KC.min(k - k0);
        let panels = SHARED_A_PANELS.min(a_panels - g * SHARED_A_PANELS);
        let at = batch * a_len + a_panels * mr * k0 + g * SHARED_A_PANELS * kc * mr;
        // SAFETY: `at + panels * kc * mr` lies inside this batch's K slice, and no other
        // piece writes these panels of it.
        let dst = unsafe { std::slice::from_raw_parts_mut(base.get().add(at), panels * kc * mr) };
        a_of(batch).pack(row0, (panels * mr).min(m - row0), k0, kc, mr, dst);
    };
    let pieces = batches * slices * groups;
    if parallel {
        (0..pieces).into_par_iter().for_each(pack);
    } else {
        (0..pieces).for_each(pack);
    }
}

/// One task: rows `rows.0..rows.0 + rows.1` and columns `cols.0..cols.0 + cols.1` of one
/// batch's C [m, n] (row-major at `c`).
struct Block<'a> {
    batch: usize,
    epilogue: Option<Epilogue<'a>>,
    a: &'a dyn PackA,
    /// Where this batch's row sums go, when this task adds up its rows.
    row_sums: Option<OutPtr>,
    /// All of this batch's A, already packed (K slice by K slice, every row panel), and its
    /// row-panel count; `None` when the task packs its own block.
    shared_a: Option<(&'a [f32], usize)>,
    packed_b: &'a [f32],
    c: *mut f32,
    m: usize,
    n: usize,
    k: usize,
    rows: (usize, usize),
    cols: (usize, usize),
    mr: usize,
    nr: usize,
    micro: MicroKernel,
}

impl Block<'_> {
    /// # Safety
    /// No other thread touches this block of C, and `micro` runs on this CPU.
    unsafe fn multiply(&self) {
        let (mr, nr, n, k) = (self.mr, self.nr, self.n, self.k);
        let (row0, rows) = self.rows;
        let (col0, cols) = self.cols;
        let row_panels = rows.div_ceil(mr);
        let packed_len = if self.shared_a.is_some() {
            0
        } else {
            row_panels * KC.min(k) * mr
        };
        // Per row of this block: its sum so far, in K order.
        let mut sums = [0f64; MAX_BLOCK_ROWS];
        with_packed_a(packed_len, |buffer| {
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                let packed_a: &[f32] = match self.shared_a {
                    // Row blocks start on panel boundaries.
                    Some((all, panels)) => {
                        &all[panels * mr * k0 + row0 / mr * kc * mr..][..row_panels * kc * mr]
                    }
                    None => {
                        let dst = &mut buffer[..row_panels * kc * mr];
                        self.a.pack(row0, rows, k0, kc, mr, dst);
                        dst
                    }
                };
                if self.row_sums.is_some() {
                    add_rows(packed_a, kc, mr, &mut sums[..row_panels * mr]);
                }
                for col_panel in col0 / nr..(col0 + cols).div_ceil(nr) {
                    let j0 = col_panel * nr;
                    let width = nr.min(n - j0);
                    let b_panel = &self.packed_b[col_panel * k * nr + k0 * nr..][..kc * nr];
                    for row_panel in 0..row_panels {
                        let i0 = row0 + row_panel * mr;
                        let height = mr.min(self.m - i0);
                        let a_panel = &packed_a[row_panel * kc * mr..][..kc * mr];
                        // SAFETY: (i0, j0) is inside this block of C.
                        let c = unsafe { self.c.add(i0 * n + j0) };
                        // SAFETY: the panels hold kc * mr and kc * nr values; the tile lies in
                        // this task's block of C.
                        unsafe { self.tile(kc, a_panel, b_panel, c, height, width, k0 > 0) };
                    }
                }
            }
        });
        if let Some(out) = self.row_sums {
            for (r, &sum) in sums[..rows].iter().enumerate() {
                // SAFETY: rows row0..row0 + rows of this batch's sums belong to this task
                // (the first column block of its row block).
                unsafe { *out.get().add(row0 + r) = sum as f32 };
            }
        }
        // The block is final and still in L2: run the epilogue over it.
        if let Some(epilogue) = self.epilogue {
            epilogue(super::CBlock {
                batch: self.batch,
                row0,
                col0,
                rows,
                cols,
                stride: n,
                // SAFETY: (row0, col0) is this task's block of C, which no other task touches.
                ptr: unsafe { self.c.add(row0 * n + col0) },
            });
        }
    }

    /// `tile` at this block's kernel and row stride.
    ///
    /// # Safety
    /// As `multiply`; `c` is the tile's origin inside this task's block.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        &self,
        kc: usize,
        a_panel: &[f32],
        b_panel: &[f32],
        c: *mut f32,
        height: usize,
        width: usize,
        accumulate: bool,
    ) {
        let shape = TileShape {
            micro: self.micro,
            mr: self.mr,
            nr: self.nr,
        };
        // SAFETY: the caller's guarantees.
        unsafe {
            tile(
                shape, kc, a_panel, b_panel, c, self.n, height, width, accumulate,
            )
        };
    }
}

/// A micro-kernel and its tile.
#[derive(Clone, Copy)]
pub(crate) struct TileShape {
    pub micro: MicroKernel,
    pub mr: usize,
    pub nr: usize,
}

/// One `height x width` tile of C at `c` (row stride `ldc`) over a K slice of `kc`: the
/// micro-kernel in place for a full tile, or into a local tile whose valid part is kept.
///
/// # Safety
/// The panels hold `kc * mr` and `kc * nr` values, `c` covers `height <= mr` rows of
/// `width <= nr` values at stride `ldc` that no other thread touches, and the CPU runs
/// `micro`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(
    shape: TileShape,
    kc: usize,
    a_panel: &[f32],
    b_panel: &[f32],
    c: *mut f32,
    ldc: usize,
    height: usize,
    width: usize,
    accumulate: bool,
) {
    let TileShape { micro, mr, nr } = shape;
    if height == mr && width == nr {
        // SAFETY: a full tile (the caller's guarantees).
        unsafe { micro(kc, a_panel.as_ptr(), b_panel.as_ptr(), c, ldc, accumulate) };
        return;
    }
    let mut tile = [0.0f32; MAX_TILE];
    // SAFETY: `tile` holds mr * nr <= MAX_TILE values at stride nr.
    unsafe {
        micro(
            kc,
            a_panel.as_ptr(),
            b_panel.as_ptr(),
            tile.as_mut_ptr(),
            nr,
            false,
        )
    };
    for (r, tile_row) in tile.chunks_exact(nr).take(height).enumerate() {
        for (j, &v) in tile_row[..width].iter().enumerate() {
            // SAFETY: row r < height and column j < width of the tile.
            unsafe {
                let dst = c.add(r * ldc + j);
                *dst = if accumulate { *dst + v } else { v };
            }
        }
    }
}

/// Most rows of one task's block: `MAX_ROW_PANELS` panels of the tallest kernel.
const MAX_BLOCK_ROWS: usize = super::MAX_ROW_PANELS * 14;

/// The row sums of one batch's A from its shared packing (`packed`: K slice by K slice,
/// every row panel in each), written to `sums[..m]`: per group of row panels, each row adds
/// its values in K order in f64 (the order `Block::multiply` uses), then rounds once.
fn sum_shared_rows(packed: &[f32], m: usize, k: usize, mr: usize, sums: OutPtr, parallel: bool) {
    // One panel per piece: a weight gradient's 10 panels in groups of 4 kept one of two
    // threads idle a third of the time.
    const GROUP: usize = 1;
    let panels = m.div_ceil(mr);
    let group_sums = |g: usize| {
        let first = g * GROUP;
        let count = GROUP.min(panels - first);
        let mut acc = [0f64; GROUP * MAX_TILE_ROWS];
        let acc = &mut acc[..count * mr];
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let slice = &packed[panels * mr * k0 + first * kc * mr..][..count * kc * mr];
            add_rows(slice, kc, mr, acc);
        }
        let row0 = first * mr;
        for (r, &sum) in acc.iter().enumerate().take(m - row0) {
            // SAFETY: row `row0 + r < m` of this batch's sums belongs to group `g` alone.
            unsafe { *sums.get().add(row0 + r) = sum as f32 };
        }
    };
    let groups = panels.div_ceil(GROUP);
    if parallel {
        (0..groups).into_par_iter().for_each(group_sums);
    } else {
        (0..groups).for_each(group_sums);
    }
}

/// The most rows a micro-kernel tile has (`mr` of every kernel is at most this).
const MAX_TILE_ROWS: usize = 16;

/// Adds each row of packed A panels (`mr` rows tall, `kc` columns, k-major) to its f64 sum
/// in `sums` (one per row), in K order. Run at the widest SIMD level with the panel height as a constant, so the `mr`
/// sums of a panel are vector lanes: as a scalar loop it cost 10-20% of a weight gradient's
/// GEMM. Each row still adds its values one after another, so the bits do not change.
fn add_rows(packed_a: &[f32], kc: usize, mr: usize, sums: &mut [f64]) {
    crate::cpu::simd::widest(
        #[inline(always)]
        move || match mr {
            14 => add_rows_of::<14>(packed_a, kc, sums),
            8 => add_rows_of::<8>(packed_a, kc, sums),
            6 => add_rows_of::<6>(packed_a, kc, sums),
            4 => add_rows_of::<4>(packed_a, kc, sums),
            _ => {
                for (panel, panel_sums) in packed_a
                    .chunks_exact(kc * mr)
                    .zip(sums.chunks_exact_mut(mr))
                {
                    for column in panel.chunks_exact(mr) {
                        for (s, &v) in panel_sums.iter_mut().zip(column) {
                            *s += v as f64;
                        }
                    }
                }
            }
        },
    );
}

#[inline(always)]
fn add_rows_of<const MR: usize>(packed_a: &[f32], kc: usize, sums: &mut [f64]) {
    for (panel, panel_sums) in packed_a
        .chunks_exact(kc * MR)
        .zip(sums.chunks_exact_mut(MR))
    {
        let mut acc = [0f64; MR];
        acc.copy_from_slice(panel_sums);
        for column in panel.chunks_exact(MR) {
            for r in 0..MR {
                acc[r] += column[r] as f64;
            }
        }
        panel_sums.copy_from_slice(&acc);
    }
}
