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

// Files: this one the entry points, the driver (`gemm`) and the kernel choice; `packed.rs`
// the packed path (`packed`, `Block`, `tile`); `implicit.rs` products whose B is built per
// block; `blocking.rs` how a product is split into tasks; `epilogue.rs` `matmul_fused`;
// `scratch.rs` the packing buffers; `pack.rs` packing; `kernels.rs` micro-kernels;
// `direct.rs` the unpacked paths; `bf16.rs` and `f16.rs` the half-precision operands.

pub(crate) mod bf16;
mod blocking;
mod direct;
mod epilogue;
pub(crate) mod f16;
mod implicit;
mod kernels;
mod pack;
mod packed;
mod scratch;
mod transpose;

// The bf16 kernels (x86 only) reach these through `super::super`.
#[cfg(target_arch = "x86_64")]
pub(crate) use blocking::{Blocking, blocking};
pub use epilogue::{matmul_fused, matmul_fused_into};
pub(crate) use implicit::{PackB, matmul_implicit_b};
use packed::{PackedProduct, packed};
pub(crate) use packed::{TileShape, tile};
#[cfg(target_arch = "x86_64")]
use scratch::with_cached_scratch;
use scratch::{PACKED_B, with_scratch};
pub(crate) use transpose::transpose_scaled;

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
/// Most values of A packed once for all column blocks (32 MiB); larger products pack each
/// task's block.
const SHARED_A_MAX: usize = 1 << 23;
/// Row panels per piece when A is packed up front.
const SHARED_A_PANELS: usize = 4;
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

/// Packs `rows` rows of the row-major block `block` (`kc` values per row) as A's row panels
/// `mr` tall (see `PackA::pack`): for operands built row by row, such as a convolution's
/// column matrix.
pub(crate) fn pack_a_row_major(block: &[f32], rows: usize, kc: usize, mr: usize, dst: &mut [f32]) {
    let view = MatrixView {
        data: block,
        offset: 0,
        row_stride: kc,
        col_stride: 1,
    };
    pack::pack_a(view, 0, rows, 0, kc, mr, dst);
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

    /// `spec` for a product of `n` columns: AVX-512 takes a 14 x 16 tile for `n <= 16`.
    fn spec_for(self, n: usize) -> (usize, usize, MicroKernel) {
        let _ = n; // read only by the x86 arm
        match self {
            #[cfg(target_arch = "x86_64")]
            GemmKernel::Avx512 if n <= 16 => (14, 16, kernels::avx512_14x16),
            _ => self.spec(),
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

/// [`matmul`] writing into the buffer `out(len)` returns for the product's `len` values (a
/// compiled call's arena region, say), which must hold exactly `len`: every value is
/// overwritten, none is read.
pub fn matmul_into<B: AsMut<[f32]>>(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    out: impl FnOnce(usize) -> B,
) -> KResult<(B, Dims)> {
    const K: &str = "matmul";
    let product = Product::check(K, a.len(), la, b.len(), lb)?;
    let len = numel(&product.out_shape);
    let mut buffer = out(len);
    let slice = buffer.as_mut();
    check::argument(K, slice.len() == len, || {
        format!("an output buffer of {len} values, got {}", slice.len())
    })?;
    gemm_summing(gemm_kernel(), a, la, b, lb, &product, None, None, slice);
    Ok((buffer, product.out_shape))
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
        row_sums: None,
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

/// `a @ b` of two matrices (rank 2 each) and the sums of A's rows, `[m]`: a weight gradient
/// `dY^T @ x` with its bias gradient, the column sums of dY, added up while the GEMM packs
/// dY^T (K order, f64, then rounded; the same bits on every path and thread count).
pub fn matmul_row_sums(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
) -> KResult<(Vec<f32>, Vec<f32>, Dims)> {
    const K: &str = "matmul_row_sums";
    let product = Product::check(K, a.len(), la, b.len(), lb)?;
    check::shapes(K, la.rank() == 2 && lb.rank() == 2, || {
        format!(
            "{:?} @ {:?}: both operands need rank 2",
            &la.shape[..],
            &lb.shape[..]
        )
    })?;
    let mut sums = crate::pool::take(product.m);
    let mut out = crate::pool::take(numel(&product.out_shape));
    let sums_out = Some(&mut sums[..]);
    gemm_summing(
        gemm_kernel(),
        a,
        la,
        b,
        lb,
        &product,
        None,
        sums_out,
        &mut out,
    );
    Ok((out, sums, product.out_shape))
}

/// The output pointer shared by the tasks; each task writes a disjoint block of C.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint blocks of one buffer that outlives the parallel section.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    pub(super) fn get(self) -> *mut f32 {
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

/// A finished block of one batch's C, handed to an epilogue while it is in cache: `rows x
/// cols` values from row `row0` and column `col0`, rows `stride` apart from `ptr`. The task
/// that made the block owns it until the epilogue returns; no other thread touches it.
#[derive(Clone, Copy)]
pub(crate) struct CBlock {
    pub batch: usize,
    pub row0: usize,
    pub col0: usize,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub ptr: *mut f32,
}

/// Code run once on each finished block of C (it may rewrite the values): one call per
/// block, not per row, so the epilogue's set-up (its SIMD dispatch, where its other operands
/// start) is paid once per block; per row it cost more than a small product's arithmetic.
type Epilogue<'e> = &'e (dyn Fn(CBlock) + Sync);

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
    let mut out = crate::pool::take(numel(&product.out_shape));
    gemm_summing(kernel, a, la, b, lb, product, epilogue, None, &mut out);
    out
}

/// `gemm`, also writing each row's sum of A (over K, in K order, in f64, then rounded) to
/// `row_sums` (`batches * m` values) when given: the packed path adds up the rows as it packs
/// them, the other paths in a pass of their own, with the same bits.
#[allow(clippy::too_many_arguments)]
fn gemm_summing(
    kernel: GemmKernel,
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    product: &Product,
    epilogue: Option<Epilogue<'_>>,
    row_sums: Option<&mut [f32]>,
    out: &mut [f32],
) {
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
    // The epilogue over each batch's whole C, where C was not computed tile by tile.
    let finish_rows = |out: &mut [f32]| {
        if let (Some(epilogue), true) = (epilogue, n > 0 && m > 0) {
            for (batch, c) in out.chunks_mut(m * n).enumerate() {
                epilogue(CBlock {
                    batch,
                    row0: 0,
                    col0: 0,
                    rows: c.len() / n,
                    cols: n,
                    stride: n,
                    ptr: c.as_mut_ptr(),
                });
            }
        }
    };
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
    // The row sums, by a pass of their own, where the packed path does not run.
    let sum_rows_apart = |row_sums: Option<&mut [f32]>| {
        if let Some(sums) = row_sums {
            for (batch, sums) in sums.chunks_mut(m.max(1)).enumerate().take(batches) {
                direct::sum_rows(a_view(batch), k, sums);
            }
        }
    };
    if numel(out_shape) == 0 || k == 0 {
        out.fill(0.0);
        finish_rows(out);
        sum_rows_apart(row_sums);
        return;
    }
    // Every element is written: by the first K slice of its tile, or by the direct path.
    if m <= DIRECT_ROWS {
        for (batch, c) in out.chunks_mut(m * n).enumerate() {
            direct::multiply_direct(a_view(batch), b_view(batch), m, k, c);
        }
        finish_rows(out);
        sum_rows_apart(row_sums);
        return;
    }

    #[cfg(target_arch = "x86_64")]
    if n <= 16 && kernel == GemmKernel::Avx512 && la.strides[rank_a - 1] == 1 {
        for (batch, c) in out.chunks_mut(m * n).enumerate() {
            direct::multiply_narrow(a_view(batch), b_view(batch), m, k, c);
        }
        finish_rows(out);
        sum_rows_apart(row_sums);
        return;
    }

    if n <= DOT_COLS && la.strides[rank_a - 1] == 1 && lb.strides[rank_b - 2] == 1 {
        for (batch, c) in out.chunks_mut(m * n).enumerate() {
            direct::multiply_dots(kernel, a_view(batch), b_view(batch), m, k, c);
        }
        finish_rows(out);
        sum_rows_apart(row_sums);
        return;
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
            row_sums: row_sums.map(|sums| OutPtr(sums.as_mut_ptr())),
        },
        &a_view,
        &b_view,
        epilogue,
        out,
    );
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
