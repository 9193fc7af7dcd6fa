//! f16 x f16 -> f32 matrix multiply: f16 operands (half the bytes of f32 to store), f32
//! accumulation and output. x86 has no f16 dot-product instruction that accumulates in f32
//! (AVX-512 FP16 accumulates in f16), so the operands are widened to f32 (F16C conversions,
//! picked at run time by the `half` crate) and the f32 GEMM runs: its kernel, blocking and
//! determinism across thread counts carry over.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::Product;
use crate::cpu::check::KResult;
use crate::layout::{Dims, Layout};

/// Batched f16 matmul with f32 results: a [..., M, K] @ b [..., K, N] -> [..., M, N], batch
/// dims broadcast NumPy style, rank >= 2 each.
pub fn matmul_f16(a: &[f16], la: &Layout, b: &[f16], lb: &Layout) -> KResult<(Vec<f32>, Dims)> {
    let product = Product::check("matmul_f16", a.len(), la, b.len(), lb)?;
    let widen = |x: &[f16]| {
        let mut out = crate::pool::take(x.len());
        x.convert_to_f32_slice(&mut out);
        crate::pool::Scratch(out)
    };
    let (af, bf) = (widen(a), widen(b));
    let out = super::gemm(super::gemm_kernel(), &af, la, &bf, lb, &product, None);
    Ok((out, product.out_shape))
}
