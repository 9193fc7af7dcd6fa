//! `matmul_fused`: the GEMM with a compiler-generated pointwise body run on each finished
//! block of C while it is in cache (`Step::MatMulEpilogue` of the fusion planner).

use super::{OutPtr, Product, gemm, gemm_kernel};
use crate::cpu::check::{self, KResult};
use crate::cpu::strided::{numel, position};
use crate::layout::{Dims, Layout};

/// `matmul` followed by a pointwise epilogue applied to each block of C while it is in cache:
/// output element `e` of the product, with `extras[i]` read at the same position (layouts
/// already broadcast to the product's shape, refused otherwise), goes through
/// `body([e, extras..])`, whose `M >= 1` results are the `M` outputs. `N` must be
/// `extras.len() + 1`. The compiler's fusion planner emits these for `relu(x @ w + b)` and
/// its backward.
pub fn matmul_fused<const N: usize, const M: usize, F>(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    extras: &[(&[f32], &Layout)],
    body: F,
) -> KResult<([Vec<f32>; M], Dims)>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    const K: &str = "matmul_fused";
    let product = Product::check(K, a.len(), la, b.len(), lb)?;
    check::argument(K, extras.len() + 1 == N && M >= 1, || {
        format!(
            "an epilogue of {N} arguments and {M} results over the product and {} more values",
            extras.len()
        )
    })?;
    for &(data, l) in extras {
        check::view(K, "extras", data.len(), l)?;
        check::same_shape(K, "extras", l, &product.out_shape)?;
    }
    let Product {
        m,
        n,
        ref batch_shape,
        ..
    } = product;
    let batch_rank = batch_shape.len();
    let total = numel(batch_shape) * m * n;
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|o| {
        if o == 0 {
            Vec::new()
        } else {
            crate::pool::take(total)
        }
    });
    let out_ptrs: [OutPtr; M] = std::array::from_fn(|o| OutPtr(outs[o].as_mut_ptr()));
    let epilogue = |batch: usize, row: usize, col0: usize, values: &mut [f32]| {
        let mut bases = [0usize; N];
        let mut col_strides = [0usize; N];
        for (i, (_, l)) in extras.iter().enumerate().take(N.saturating_sub(1)) {
            bases[i + 1] = l.offset
                + position(batch, batch_shape, &l.strides[..batch_rank])
                + row * l.strides[batch_rank]
                + col0 * l.strides[batch_rank + 1];
            col_strides[i + 1] = l.strides[batch_rank + 1];
        }
        // Pieces of at most SEGMENT values: the arguments are gathered into fixed-size arrays
        // first, so the body runs as a loop the compiler vectorizes (lanes past the piece's
        // end compute on zeros and are dropped).
        // Compiled for the widest vectors this CPU has (`simd::widest`).
        // The body copied into this frame: read through a reference, the values it captured
        // (the call's rounding) were reloaded every element.
        let body: F = body;
        crate::cpu::simd::widest(
            #[inline(always)]
            move || {
                let body = body;
                for (piece, chunk) in values.chunks_mut(SEGMENT).enumerate() {
                    let start = piece * SEGMENT;
                    let flat = (batch * m + row) * n + col0 + start;
                    let at = EpilogueAt {
                        extras,
                        bases: &bases,
                        col_strides: &col_strides,
                        start,
                        flat,
                        out_ptrs: &out_ptrs,
                    };
                    // A whole piece with its width as a constant: the copies in and out become a
                    // few vector moves instead of memcpy calls.
                    if chunk.len() == SEGMENT {
                        epilogue_piece(chunk, SEGMENT, &at, &body);
                    } else {
                        let width = chunk.len();
                        epilogue_piece(chunk, width, &at, &body);
                    }
                }
            },
        );
    };
    outs[0] = gemm(gemm_kernel(), a, la, b, lb, &product, Some(&epilogue));
    Ok((outs, product.out_shape))
}

/// Where one piece of a matmul epilogue reads its other arguments and writes its other
/// results.
struct EpilogueAt<'a, const N: usize, const M: usize> {
    extras: &'a [(&'a [f32], &'a Layout)],
    bases: &'a [usize; N],
    col_strides: &'a [usize; N],
    /// The piece's first column within the row segment.
    start: usize,
    /// The piece's first element in C.
    flat: usize,
    out_ptrs: &'a [OutPtr; M],
}

/// The epilogue body over `width` values of C (`chunk`, rewritten with result 0): the
/// arguments are gathered into fixed-size arrays first, so the body runs as a loop the
/// compiler vectorizes (lanes past `width` compute on zeros and are dropped).
#[inline(always)]
fn epilogue_piece<const N: usize, const M: usize, F>(
    chunk: &mut [f32],
    width: usize,
    at: &EpilogueAt<'_, N, M>,
    body: &F,
) where
    F: Fn([f32; N]) -> [f32; M] + Copy,
{
    let mut args = [[0.0f32; SEGMENT]; N];
    args[0][..width].copy_from_slice(&chunk[..width]);
    for (i, arg) in args.iter_mut().enumerate().skip(1) {
        let (data, _) = at.extras[i - 1];
        let stride = at.col_strides[i];
        let base = at.bases[i] + at.start * stride;
        if stride == 1 {
            arg[..width].copy_from_slice(&data[base..base + width]);
        } else {
            for (j, a) in arg[..width].iter_mut().enumerate() {
                *a = data[base + j * stride];
            }
        }
    }
    let mut results = [[0.0f32; SEGMENT]; M];
    for j in 0..SEGMENT {
        let r = body(std::array::from_fn(|i| args[i][j]));
        for (o, result) in results.iter_mut().enumerate() {
            result[j] = r[o];
        }
    }
    chunk[..width].copy_from_slice(&results[0][..width]);
    for (o, ptr) in at.out_ptrs.iter().enumerate().skip(1) {
        // SAFETY: each element of C is visited once, by the task that owns it, and output
        // `o` holds as many elements as C.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(at.flat), width) };
        dst.copy_from_slice(&results[o][..width]);
    }
}

/// Values per piece of a matmul epilogue (the widest tile).
const SEGMENT: usize = 32;
