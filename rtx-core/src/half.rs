//! bf16 and f16 tensors: half the memory of f32, computed with f32 accumulation.
//!
//! A reduced-precision tensor holds `half::bf16` or `half::f16` values. `to_dtype` converts
//! between f32, bf16 and f16 (rounding to nearest, ties to even, as PyTorch's `.to()`), and
//! `Tensor::matmul` multiplies two tensors of one dtype: bf16 and f16 operands are multiplied
//! and summed in f32 (`rtx_backends::cpu::matmul_bf16` / `matmul_f16`, the bf16 one with
//! `vdpbf16ps` on AMD CPUs that have it, see `bf16_kernel`), and the product is f32. Other kernels
//! read f32: a half tensor passed to them is an `RtxError::DTypeMismatch` naming its dtype,
//! never a silent conversion. Compiled graphs take f32 inputs (mixed precision in `graph!`
//! is the GPT issue's work).

use crate::error::{Result, RtxError};
use crate::tensor::{DType, Storage, Tensor, check_len};
use half::{bf16, f16};
use rtx_backends::{Layout, cpu};

impl Tensor {
    /// A bf16 tensor of `shape` holding `data` in row-major order.
    pub fn from_bf16(data: Vec<bf16>, shape: &[usize]) -> Result<Tensor> {
        check_len(data.len(), shape, "Tensor::from_bf16")?;
        Ok(Tensor::from_parts(
            Storage::BF16(data),
            Layout::contiguous(shape),
        ))
    }

    /// An f16 tensor of `shape` holding `data` in row-major order.
    pub fn from_f16(data: Vec<f16>, shape: &[usize]) -> Result<Tensor> {
        check_len(data.len(), shape, "Tensor::from_f16")?;
        Ok(Tensor::from_parts(
            Storage::F16(data),
            Layout::contiguous(shape),
        ))
    }

    /// The same values in `dtype` (f32, bf16 or f16), contiguous: narrowing rounds to the
    /// nearest representable value, ties to even; widening is exact. Integer tensors do not
    /// convert.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return self.try_contiguous();
        }
        let floats = |d: DType| matches!(d, DType::F32 | DType::BF16 | DType::F16);
        if !floats(self.dtype()) || !floats(dtype) {
            return Err(RtxError::DTypeMismatch {
                context: format!("Tensor::to_dtype({dtype})"),
                expected: "a conversion between f32, bf16 and f16".into(),
                found: format!("{} to {dtype}", self.dtype()),
            });
        }
        let values = self.to_vec_f32()?;
        let layout = Layout::contiguous(self.shape());
        Ok(match dtype {
            DType::BF16 => Tensor::from_parts(Storage::BF16(narrow(&values)), layout),
            DType::F16 => Tensor::from_parts(Storage::F16(narrow(&values)), layout),
            _ => Tensor::from_parts(Storage::F32(values), layout),
        })
    }

    /// `self @ other` over `[.., M, K] @ [.., K, N]` with batch dimensions broadcast, for two
    /// tensors of one dtype: f32, or bf16 / f16 multiplied and accumulated in f32 (an f32
    /// product).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let f32_pair = self.storage().f32_slice().zip(other.storage().f32_slice());
        let (out, shape) = match (self.storage(), other.storage()) {
            _ if let Some((a, b)) = f32_pair => cpu::matmul(a, self.layout(), b, other.layout())?,
            (Storage::BF16(a), Storage::BF16(b)) => {
                cpu::matmul_bf16(a, self.layout(), b, other.layout())?
            }
            (Storage::F16(a), Storage::F16(b)) => {
                cpu::matmul_f16(a, self.layout(), b, other.layout())?
            }
            _ => {
                return Err(RtxError::DTypeMismatch {
                    context: "Tensor::matmul".into(),
                    expected: "two tensors of one dtype: f32, bf16 or f16".into(),
                    found: format!("{} and {}", self.dtype(), other.dtype()),
                });
            }
        };
        Ok(Tensor::from_kernel(out, &shape))
    }
}

fn narrow<T: HalfFromF32>(values: &[f32]) -> Vec<T> {
    values.iter().map(|&v| T::from_f32(v)).collect()
}

/// The conversion `half` gives both formats (round to nearest, ties to even).
trait HalfFromF32 {
    fn from_f32(v: f32) -> Self;
}

impl HalfFromF32 for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl HalfFromF32 for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
