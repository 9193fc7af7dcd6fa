//! Batched matrix multiply, BLIS-style: B packed once into column panels, A packed per task
//! into row panels sized for L2, and a register-tiled micro-kernel per instruction set
//! (AVX-512, AVX2+FMA, NEON, portable) chosen once at run time.
//!
//! Loop order per task (a block of rows and columns of C): K slices of `KC` outermost, then
//! the B micro-panels of the block (each `KC x NR`, kept in L1), then the A micro-panels
//! (`MR x KC`, streamed from L2). Tasks split M and N, never K, and a micro-kernel sums its
//! `KC` terms in k order, so each output element sums its terms in the same order whatever
//! the blocking or the thread count: results are bit-identical across thread counts.
//!
//! Nothing here allocates after warm-up: the output and packed B come from `crate::pool`,
//! whose exact-size cache hands the same buffers back every step whichever thread drives the
//! product, and the packed-A buffers are made together, one per thread, by the first product.

// Files: this one the driver (`gemm`, `Block`) and the kernel choice; `blocking.rs` how a
// product is split into tasks; `epilogue.rs` `matmul_fused`; `scratch.rs` the packing buffers;
// `pack.rs` packing; `kernels.rs` micro-kernels; `direct.rs` the unpacked paths; `bf16.rs`.

pub(crate) mod bf16;
mod blocking;
mod direct;
mod epilogue;
mod implicit;
mod kernels;
mod pack;
mod scratch;

pub(crate) use blocking::{Blocking, blocking};
pub use epilogue::matmul_fused;
pub(crate) use implicit::{PackB, matmul_implicit_b};
use scratch::{PACKED_B, with_cached_scratch, with_packed_a, with_scratch};

use rayon::prelude::*;

use crate::layout::{Dims, Layout};

use super::check::{self, KResult, KernelError};
use super::elementwise::broadcast_shape;
use super::strided::{numel, position};
use kernels::MicroKernel;

/// Rows up to which a product skips packing (`direct::multiply_direct`).
const DIRECT_ROWS: usize = 4;
/// Columns up to which a product whose A rows and B columns are contiguous along K runs as
/// dot products (`direct::multiply_dots`): a packed tile would be mostly padding.
const DOT_COLS: usize = 16;
/// K slice per pass: a B micro-panel (`KC x NR`) stays in L1, an A block in L2.
pub(crate) const KC: usize = 256;
/// Most micro-panels of A per task (rows of C per task = this times MR), so the packed A
/// block (`MC x KC`) stays within L2.
const MAX_ROW_PANELS: usize = 24;
/// Bytes of packed B above which re-reading it per row block goes to L3.
const B_IN_L2: usize = 1 << 20;
/// Fewest multiply-adds per task of a parallel product.
const TASK_WORK: usize = 1 << 19;
/// Multiply-adds below which forking costs more than it saves.
const PARALLEL_WORK: usize = 1 << 17;
/// The largest tile of any kernel, for the edge tiles computed into a local buffer.
const MAX_TILE: usize = 14 * 32;
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

/// What the packed path reads A through: a strided matrix, or an operand that is never
/// stored whole and is built panel by panel as it is packed (a convolution's column matrix,
/// `conv.rs`), so the GEMM sees it only as L2-sized blocks.
pub(crate) trait PackA: Sync {
    /// Rows `row0..row0 + rows`, columns `k0..k0 + kc` of A as row panels `mr` tall, each
    /// stored k-major (`mr` values per k), rows past the end zero. `dst` holds
    /// `rows.div_ceil(mr) * kc * mr` values.
    fn pack(&self, row0: usize, rows: usize, k0: usize, kc: usize, mr: usize, dst: &mut [f32]);
}

impl PackA for MatrixView<'_> {
    fn pack(&self, row0: usize, rows: usize, k0: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        pack::pack_a(*self, row0, rows, k0, kc, mr, dst);
    }
}

/// A register-tiled micro-kernel, chosen once per process from what the CPU supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// 4 x 8 tiles in plain Rust that the compiler vectorizes for the build's baseline ISA.
    Portable,
    /// 6 x 16 tiles with AVX2 and fused multiply-add (x86-64 with AVX2 and FMA).
    Avx2Fma,
    /// 14 x 32 tiles with AVX-512F (x86-64 with AVX-512 Foundation).
    Avx512,
    /// 8 x 12 tiles with NEON (every aarch64 CPU).
    Neon,
}

impl GemmKernel {
    /// Tile height (rows of A per micro-kernel), width (columns of B) and the kernel itself.
    fn spec(self) -> (usize, usize, MicroKernel) {
        match self {
            #[cfg(target_arch = "x86_64")]
            GemmKernel::Avx2Fma => (6, 16, kernels::avx2_6x16),
            #[cfg(target_arch = "x86_64")]
            GemmKernel::Avx512 => (14, 32, kernels::avx512_14x32),
            #[cfg(target_arch = "aarch64")]
            GemmKernel::Neon => (8, 12, kernels::neon_8x12),
            _ => (4, 8, kernels::portable::<4, 8>),
        }
    }
}

/// Whether this CPU can run `kernel` (std caches the feature detection).
fn supported(kernel: GemmKernel) -> bool {
    match kernel {
        GemmKernel::Portable => true,
        #[cfg(target_arch = "x86_64")]
        GemmKernel::Avx2Fma => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
        #[cfg(target_arch = "x86_64")]
        GemmKernel::Avx512 => is_x86_feature_detected!("avx512f"),
        // NEON is part of the aarch64 baseline.
        GemmKernel::Neon => cfg!(target_arch = "aarch64"),
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    }
}

/// Every kernel this CPU can run, the best last.
pub fn gemm_kernels() -> Vec<GemmKernel> {
    [
        GemmKernel::Portable,
        GemmKernel::Avx2Fma,
        GemmKernel::Avx512,
        GemmKernel::Neon,
    ]
    .into_iter()
    .filter(|&k| supported(k))
    .collect()
}

/// The kernel `matmul` uses: the best this CPU runs, or the one the environment variable
/// `RTX_GEMM` names (`portable`, `avx2`, `avx512`, `neon`) when this CPU runs it.
pub fn gemm_kernel() -> GemmKernel {
    static KERNEL: std::sync::OnceLock<GemmKernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(|| {
        let forced = match std::env::var("RTX_GEMM").as_deref() {
            Ok("portable") => Some(GemmKernel::Portable),
            Ok("avx2") => Some(GemmKernel::Avx2Fma),
            Ok("avx512") => Some(GemmKernel::Avx512),
            Ok("neon") => Some(GemmKernel::Neon),
            _ => None,
        };
        forced
            .filter(|&k| supported(k))
            .or_else(|| gemm_kernels().last().copied())
            .unwrap_or(GemmKernel::Portable)
    })
}

/// Batched matmul: a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast NumPy
/// style; rank >= 2 each (caller promotes 1-D). Returns (out, out_shape).
pub fn matmul(a: &[f32], la: &Layout, b: &[f32], lb: &Layout) -> KResult<(Vec<f32>, Dims)> {
    matmul_with(gemm_kernel(), a, la, b, lb)
}

/// The sizes of a product whose operands passed [`Product::check`]: `[.., M, K] @ [.., K, N]`
/// over the broadcast batch shape.
pub(crate) struct Product {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub batch_shape: Dims,
    pub out_shape: Dims,
}

impl Product {
    /// Refuses operands the GEMM cannot use: a layout reaching past its buffer, a rank below
    /// 2, inner dimensions that differ, batch dimensions that do not broadcast, or an operand
    /// or output whose element count overflows.
    pub(crate) fn check(
        kernel: &'static str,
        a_len: usize,
        la: &Layout,
        b_len: usize,
        lb: &Layout,
    ) -> KResult<Product> {
        check::view(kernel, "a", a_len, la)?;
        check::view(kernel, "b", b_len, lb)?;
        let (rank_a, rank_b) = (la.rank(), lb.rank());
        check::shapes(kernel, rank_a >= 2 && rank_b >= 2, || {
            format!(
                "{:?} @ {:?}: both operands need rank 2 or more",
                &la.shape[..],
                &lb.shape[..]
            )
        })?;
        let (m, k) = (la.shape[rank_a - 2], la.shape[rank_a - 1]);
        let n = lb.shape[rank_b - 1];
        check::shapes(kernel, lb.shape[rank_b - 2] == k, || {
            format!(
                "{:?} @ {:?}: the inner dimensions {k} and {} differ",
                &la.shape[..],
                &lb.shape[..],
                lb.shape[rank_b - 2]
            )
        })?;
        let Some(batch_shape) = broadcast_shape(&la.shape[..rank_a - 2], &lb.shape[..rank_b - 2])
        else {
            return Err(KernelError::Shapes {
                kernel,
                detail: format!(
                    "{:?} @ {:?}: the batch dimensions do not broadcast",
                    &la.shape[..],
                    &lb.shape[..]
                ),
            });
        };
        check::elements(kernel, &la.shape)?;
        check::elements(kernel, &lb.shape)?;
        let mut out_shape = batch_shape.clone();
        out_shape.extend([m, n]);
        check::elements(kernel, &out_shape)?;
        Ok(Product {
            m,
            k,
            n,
            batch_shape,
            out_shape,
        })
    }

    /// A product of two matrices (rank 2 each) that an internal caller built over buffers it
    /// owns, with equal inner dimensions.
    fn matrices(la: &Layout, lb: &Layout) -> Product {
        debug_assert!(la.rank() == 2 && lb.rank() == 2 && la.shape[1] == lb.shape[0]);
        let (m, k, n) = (la.shape[0], la.shape[1], lb.shape[1]);
        Product {
            m,
            k,
            n,
            batch_shape: Dims::new(),
            out_shape: smallvec::smallvec![m, n],
        }
    }
}

/// `a @ b` of two matrices an internal caller built (the convolutions' im2col products),
/// without the public entry's checks.
pub(crate) fn matmul_2d(a: &[f32], la: &Layout, b: &[f32], lb: &Layout) -> Vec<f32> {
    let product = Product::matrices(la, lb);
    gemm(gemm_kernel(), a, la, b, lb, &product, None)
}

/// C [m, n] = A [m, k] @ B [k, n] where A is never stored: `a` builds each block as the GEMM
/// packs it (`PackA`); `b` is a matrix an internal caller built (`lb` of rank 2).
pub(crate) fn matmul_implicit<A: PackA>(
    a: A,
    m: usize,
    k: usize,
    b: &[f32],
    lb: &Layout,
) -> Vec<f32> {
    debug_assert!(lb.rank() == 2 && lb.shape[0] == k);
    let n = lb.shape[1];
    if m * n == 0 || k == 0 {
        return crate::pool::take_zeroed(m * n);
    }
    let mut out = crate::pool::take(m * n);
    let b_view = |_| MatrixView {
        data: b,
        offset: lb.offset,
        row_stride: lb.strides[0],
        col_stride: lb.strides[1],
    };
    let sizes = PackedProduct {
        m,
        k,
        n,
        batches: 1,
        b_shared: true,
        costly_a: true,
    };
    let a_of = |_| &a;
    packed(gemm_kernel(), sizes, &a_of, &b_view, None, &mut out);
    out
}

impl<A: PackA> PackA for &A {
    fn pack(&self, row0: usize, rows: usize, k0: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        (**self).pack(row0, rows, k0, kc, mr, dst);
    }
}

/// The output pointer shared by the tasks; each task writes a disjoint block of C.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint blocks of one buffer that outlives the parallel section.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `matmul` with a given micro-kernel (tests run every one the CPU supports). A kernel the CPU
/// lacks falls back to the portable one.
pub fn matmul_with(
    kernel: GemmKernel,
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
) -> KResult<(Vec<f32>, Dims)> {
    let product = Product::check("matmul", a.len(), la, b.len(), lb)?;
    let out = gemm(kernel, a, la, b, lb, &product, None);
    Ok((out, product.out_shape))
}

/// Code run on each finished row segment of a task's block of C while it is in cache:
/// `(batch, row, first column, values)`; it may rewrite the values.
type Epilogue<'e> = &'e (dyn Fn(usize, usize, usize, &mut [f32]) + Sync);

/// The GEMM driver over operands that passed [`Product::check`] (or make a
/// [`Product::matrices`]); returns C, of shape `product.out_shape`. `epilogue` runs on every
/// row of every finished block.
fn gemm(
    kernel: GemmKernel,
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    product: &Product,
    epilogue: Option<Epilogue<'_>>,
) -> Vec<f32> {
    let kernel = if supported(kernel) {
        kernel
    } else {
        GemmKernel::Portable
    };
    let (rank_a, rank_b) = (la.rank(), lb.rank());
    let Product {
        m,
        k,
        n,
        ref batch_shape,
        ref out_shape,
    } = *product;
    let batches = numel(batch_shape);
    // The epilogue over whole rows, where C was not computed tile by tile.
    let finish_rows = |out: &mut [f32]| {
        if let (Some(epilogue), true) = (epilogue, n > 0) {
            for (index, row) in out.chunks_mut(n).enumerate() {
                epilogue(index / m, index % m, 0, row);
            }
        }
    };
    if numel(out_shape) == 0 || k == 0 {
        let mut out = crate::pool::take_zeroed(numel(out_shape));
        finish_rows(&mut out);
        return out;
    }
    // Every element is written: by the first K slice of its tile, or by the direct path.
    let mut out = crate::pool::take(numel(out_shape));
    let a_batches = batch_layout(la, batch_shape);
    let b_batches = batch_layout(lb, batch_shape);
    let a_view = |batch| MatrixView {
        data: a,
        offset: a_batches.offset + position(batch, batch_shape, &a_batches.strides),
        row_stride: la.strides[rank_a - 2],
        col_stride: la.strides[rank_a - 1],
    };
    let b_view = |batch| MatrixView {
        data: b,
        offset: b_batches.offset + position(batch, batch_shape, &b_batches.strides),
        row_stride: lb.strides[rank_b - 2],
        col_stride: lb.strides[rank_b - 1],
    };
    if m <= DIRECT_ROWS {
        for (batch, c) in out.chunks_mut(m * n).enumerate() {
            direct::multiply_direct(a_view(batch), b_view(batch), m, k, c);
        }
        finish_rows(&mut out);
        return out;
    }

    if n <= DOT_COLS && la.strides[rank_a - 1] == 1 && lb.strides[rank_b - 2] == 1 {
        for (batch, c) in out.chunks_mut(m * n).enumerate() {
            direct::multiply_dots(kernel, a_view(batch), b_view(batch), m, k, c);
        }
        finish_rows(&mut out);
        return out;
    }

    let b_shared = b_batches.strides.iter().all(|&s| s == 0);
    packed(
        kernel,
        PackedProduct {
            m,
            k,
            n,
            batches,
            b_shared,
            costly_a: false,
        },
        &a_view,
        &b_view,
        epilogue,
        &mut out,
    );
    out
}

/// The sizes of a product on the packed path: `batches` products `[m, k] @ [k, n]`, with
/// one B for all of them when `b_shared`.
#[derive(Clone, Copy)]
struct PackedProduct {
    m: usize,
    k: usize,
    n: usize,
    batches: usize,
    b_shared: bool,
    /// Whether packing A costs more than reading a matrix (an implicit A, built from an
    /// image): then tasks never split columns, which would build each block of A again.
    costly_a: bool,
}

/// The packed path: B packed once into column panels, then tasks over blocks of C, each
/// packing its A block per K slice through `a_of(batch)`. Writes every element of `out`
/// (`batches * m * n` values, `k > 0`).
fn packed<'b, A: PackA>(
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
    } = sizes;
    let (mr, nr, micro) = kernel.spec();
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

    let c = OutPtr(out.as_mut_ptr());
    // Packed B comes from the shared buffer cache, not this thread's scratch: a call from
    // outside the pool is driven by whichever worker picks it up, and a per-thread buffer
    // would first grow on each worker at some arbitrary later step.
    with_cached_scratch(b_count * b_len, |packed_b| {
        let pack = |(index, dst): (usize, &mut [f32])| {
            let (batch, panel) = (index / panels, index % panels);
            pack::pack_b_panel(b_view(batch), k, n, nr, panel, dst);
        };
        if parallel {
            packed_b.par_chunks_mut(k * nr).enumerate().for_each(pack);
        } else {
            packed_b.chunks_mut(k * nr).enumerate().for_each(pack);
        }
        let packed_b = &*packed_b;
        let run = |task: usize| {
            let batch = task / (row_blocks * col_blocks);
            let (row0, rows) = blocks.rows((task / col_blocks) % row_blocks);
            let col0 = task % col_blocks * nc;
            let a = a_of(batch);
            let block = Block {
                batch,
                epilogue,
                a: &a,
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
}

/// `l`'s batch axes (all but the last two) broadcast to `batch_shape`.
pub(crate) fn batch_layout(l: &Layout, batch_shape: &[usize]) -> Layout {
    let batch_rank = l.rank() - 2;
    Layout {
        shape: Dims::from_slice(&l.shape[..batch_rank]),
        strides: Dims::from_slice(&l.strides[..batch_rank]),
        offset: l.offset,
    }
    .broadcast_to(batch_shape)
}

/// One task: rows `rows.0..rows.0 + rows.1` and columns `cols.0..cols.0 + cols.1` of one
/// batch's C [m, n] (row-major at `c`).
struct Block<'a> {
    batch: usize,
    epilogue: Option<Epilogue<'a>>,
    a: &'a dyn PackA,
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
        let packed_len = row_panels * KC.min(k) * mr;
        with_packed_a(packed_len, |packed_a| {
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                let packed_a = &mut packed_a[..row_panels * kc * mr];
                self.a.pack(row0, rows, k0, kc, mr, packed_a);
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
        // The block is final and still in L2: run the epilogue over each of its rows.
        if let Some(epilogue) = self.epilogue {
            for r in 0..rows {
                // SAFETY: the block's rows lie inside this task's part of C, which no other
                // task touches.
                let row = unsafe {
                    std::slice::from_raw_parts_mut(self.c.add((row0 + r) * n + col0), cols)
                };
                epilogue(self.batch, row0 + r, col0, row);
            }
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
