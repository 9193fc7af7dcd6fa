//! Tensor operations outside `graph!`: arithmetic with NumPy broadcasting, `argmax`, `concat`,
//! `narrow` (a slice along one axis; `matmul` is in `half.rs`), and a readable `Display`, for the code around a model (evaluation, decoding, inspection).
//!
//! Each method runs one core op through `ops::run_op`, which checks the shapes first, so a
//! mismatch is an `RtxError` naming both shapes, never a panic. Nothing here records a tape:
//! gradients come from the compiled graph functions.

use crate::ctx::Ctx;
use crate::error::Result;
use crate::ops::run_op;
use crate::tensor::{DType, Tensor};
use rtx_ir::Op;
use std::fmt;

impl Tensor {
    fn binary(&self, op: Op, other: &Tensor) -> Result<Tensor> {
        run_op(&op, &[self, other], &mut Ctx::eval())
    }

    /// `self + other`, broadcasting like NumPy.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Op::Add, other)
    }

    /// `self - other`, broadcasting like NumPy.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Op::Sub, other)
    }

    /// `self * other` elementwise, broadcasting like NumPy.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Op::Mul, other)
    }

    /// `self / other` elementwise, broadcasting like NumPy.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(Op::Div, other)
    }

    /// i64 index of the largest value along `axis` (removed): the first on ties, a NaN
    /// counting as the largest, as `torch.argmax(x, dim)`.
    pub fn argmax(&self, axis: usize) -> Result<Tensor> {
        run_op(&Op::ArgMax { axis }, &[self], &mut Ctx::eval())
    }

    /// `parts` joined along `axis` (every other axis must agree), as `torch.cat`.
    pub fn concat(parts: &[&Tensor], axis: usize) -> Result<Tensor> {
        run_op(&Op::Concat { axis }, parts, &mut Ctx::eval())
    }

    /// Positions `start .. start + len` along `axis`, as `torch.narrow` (a copy).
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        run_op(&Op::Narrow { axis, start, len }, &[self], &mut Ctx::eval())
    }
}

/// At most this many values are shown along an axis; longer ones show their first and last
/// three around `...`, as NumPy and PyTorch print.
const SHOWN: usize = 6;

impl fmt::Display for Tensor {
    /// `tensor([[1.0000, 2.5000], [3.0000, 4.0000]], shape=[2, 2], dtype=f32)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values: Vec<String> = match self.dtype() {
            DType::I64 => match self.to_vec_i64() {
                Ok(v) => v.iter().map(|x| x.to_string()).collect(),
                Err(_) => return write!(f, "tensor(<unreadable>)"),
            },
            _ => match self.to_vec_f32() {
                Ok(v) => v.iter().map(|x| format!("{x:.4}")).collect(),
                Err(_) => return write!(f, "tensor(<unreadable>)"),
            },
        };
        let mut body = String::new();
        nest(&mut body, &values, self.shape());
        write!(
            f,
            "tensor({body}, shape={:?}, dtype={})",
            self.shape(),
            self.dtype()
        )
    }
}

/// Writes `values` (row-major, of `shape`) as nested brackets, eliding long axes.
fn nest(out: &mut String, values: &[String], shape: &[usize]) {
    let Some((&n, rest)) = shape.split_first() else {
        out.push_str(values.first().map(String::as_str).unwrap_or(""));
        return;
    };
    let stride: usize = rest.iter().product();
    out.push('[');
    let shown: Vec<Option<usize>> = if n > SHOWN {
        (0..SHOWN / 2)
            .map(Some)
            .chain([None])
            .chain((n - SHOWN / 2..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (i, index) in shown.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        match index {
            Some(j) => nest(out, &values[j * stride..(j + 1) * stride], rest),
            None => out.push_str("..."),
        }
    }
    out.push(']');
}
