//! `matmul_fused`: the GEMM with a compiler-generated pointwise body run on each finished
//! block of C while it is in cache (`Step::MatMulEpilogue` of the fusion planner).

use super::{CBlock, OutPtr, Product, gemm_kernel};
use crate::cpu::check::{self, KResult};
use crate::cpu::fused::{gather, pointer_loop};
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
    let shape = Product::check("matmul_fused", a.len(), la, b.len(), lb)?.out_shape;
    let total = numel(&shape);
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|_| crate::pool::take(total));
    matmul_fused_into(
        a,
        la,
        b,
        lb,
        extras,
        outs.each_mut().map(|o| &mut o[..]),
        body,
    )?;
    Ok((outs, shape))
}

/// [`matmul_fused`] writing into `outs`, `M` buffers of the product's element count the
/// caller provides; returns the product's shape.
pub fn matmul_fused_into<const N: usize, const M: usize, F>(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    extras: &[(&[f32], &Layout)],
    outs: [&mut [f32]; M],
    body: F,
) -> KResult<Dims>
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
    for (o, out) in outs.iter().enumerate() {
        check::shapes(K, out.len() == total, || {
            format!("output {o} holds {} values, the product {total}", out.len())
        })?;
    }
    let mut outs = outs;
    let out_ptrs: [OutPtr; M] = std::array::from_fn(|o| OutPtr(outs[o].as_mut_ptr()));
    let epilogue = |block: CBlock| {
        // Where each extra operand's part of the block starts, and how it steps.
        let mut bases = [0usize; N];
        let mut row_strides = [0usize; N];
        let mut col_strides = [0usize; N];
        for (i, (_, l)) in extras.iter().enumerate().take(N.saturating_sub(1)) {
            row_strides[i + 1] = l.strides[batch_rank];
            col_strides[i + 1] = l.strides[batch_rank + 1];
            bases[i + 1] = l.offset
                + position(block.batch, batch_shape, &l.strides[..batch_rank])
                + block.row0 * row_strides[i + 1]
                + block.col0 * col_strides[i + 1];
        }
        let flat0 = (block.batch * m + block.row0) * n + block.col0;
        // The body copied into this frame: read through a reference, the values it captured
        // (the call's rounding) were reloaded every element.
        let body: F = body;
        // Compiled for the widest vectors this CPU has, once for the whole block.
        crate::cpu::simd::widest(
            #[inline(always)]
            move || {
                let body = body;
                // Operands that do not step by 1 along the row (a broadcast bias gradient, a
                // transposed extra) and C itself are staged in these stack pieces, so every
                // piece runs as one plain pointer loop that LLVM vectorizes.
                let mut staged = [[0.0f32; PIECE]; N];
                for r in 0..block.rows {
                    let mut start = 0;
                    while start < block.cols {
                        let len = PIECE.min(block.cols - start);
                        // SAFETY: row `r < rows` of the block, columns `start..start + len`
                        // inside its `cols`: owned by this task (`CBlock`'s contract).
                        let c = unsafe { block.ptr.add(r * block.stride + start) };
                        // SAFETY: as above, `len` values from `c`; `staged[0]` holds PIECE.
                        unsafe { std::ptr::copy_nonoverlapping(c, staged[0].as_mut_ptr(), len) };
                        let mut direct: [Option<*const f32>; N] = [None; N];
                        for i in 1..N {
                            let (data, _) = extras[i - 1];
                            let (stride, at) = (
                                col_strides[i],
                                bases[i] + r * row_strides[i] + start * col_strides[i],
                            );
                            if stride == 1 {
                                direct[i] = Some(data[at..at + len].as_ptr());
                            } else {
                                gather(&mut staged[i][..len], data, at, stride);
                            }
                        }
                        let ins: [*const f32; N] =
                            std::array::from_fn(|i| direct[i].unwrap_or(staged[i].as_ptr()));
                        let flat = flat0 + r * n + start;
                        let outs: [*mut f32; M] = std::array::from_fn(|o| {
                            if o == 0 {
                                c
                            } else {
                                // SAFETY: output `o` holds as many elements as C, and this
                                // task owns these `len` of them.
                                unsafe { out_ptrs[o].get().add(flat) }
                            }
                        });
                        // SAFETY: every input holds `len` values (stack pieces, or slices
                        // checked just above) and every output `len` writable values; C is
                        // read from its staged copy, so no output overlaps an input.
                        unsafe { pointer_loop(ins, outs, len, &body) };
                        start += len;
                    }
                }
            },
        );
    };
    let kernel = gemm_kernel();
    // Output 0 is C itself (`M >= 1` was checked above).
    if let Some(c) = outs.first_mut() {
        super::gemm_summing(kernel, a, la, b, lb, &product, Some(&epilogue), None, c);
    }
    Ok(product.out_shape)
}

/// Values per piece of a matmul epilogue row (1 KiB of stack per operand).
const PIECE: usize = 256;
