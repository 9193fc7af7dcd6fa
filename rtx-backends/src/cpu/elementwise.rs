//! Elementwise kernels: unary maps and NumPy-broadcast binary maps.

use crate::layout::Layout;

use super::check::{self, KResult, KernelError};
use super::scalar;
use super::strided::{Walk, for_each_chunk, map_strided, numel};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Relu,
    /// Exact erf form, PyTorch's default: `0.5 * x * (1 + erf(x / sqrt(2)))`.
    Gelu,
    GeluTanh,
    Tanh,
    Sin,
    Cos,
    Sigmoid,
    Exp,
    Log,
    Sqrt,
    PowScalar(f32),
    AddScalar(f32),
    MulScalar(f32),
    /// `scalar::autocast`: rounding to a half type, as f32.
    Autocast(scalar::Rounding),
    /// `scalar::autocast_grad`: a gradient rounded at a loss scale.
    AutocastGrad(scalar::Rounding),
}

/// `op` applied to every element of `x` (read through `l`); a contiguous buffer of `l`'s shape.
pub fn unary(op: UnaryOp, x: &[f32], l: &Layout) -> KResult<Vec<f32>> {
    const K: &str = "unary";
    check::view(K, "x", x.len(), l)?;
    check::elements(K, &l.shape)?;
    Ok(match op {
        UnaryOp::Neg => map_strided(x, l, scalar::neg),
        UnaryOp::Relu => map_strided(x, l, scalar::relu),
        UnaryOp::Gelu => map_strided(x, l, scalar::gelu),
        UnaryOp::GeluTanh => map_strided(x, l, scalar::gelu_tanh),
        UnaryOp::Tanh => map_strided(x, l, scalar::tanh),
        UnaryOp::Sin => map_strided(x, l, scalar::sin),
        UnaryOp::Cos => map_strided(x, l, scalar::cos),
        UnaryOp::Sigmoid => map_strided(x, l, scalar::sigmoid),
        UnaryOp::Exp => map_strided(x, l, scalar::exp),
        UnaryOp::Log => map_strided(x, l, scalar::log),
        UnaryOp::Sqrt => map_strided(x, l, scalar::sqrt),
        UnaryOp::PowScalar(p) => map_strided(x, l, |v| scalar::pow(v, p)),
        UnaryOp::AddScalar(c) => map_strided(x, l, |v| v + c),
        UnaryOp::MulScalar(c) => map_strided(x, l, |v| v * c),
        UnaryOp::Autocast(r) => map_strided(x, l, |v| scalar::autocast(v, r)),
        UnaryOp::AutocastGrad(r) => map_strided(x, l, |g| scalar::autocast_grad(g, r)),
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// `a` = x, `b` = upstream gradient: `b * (a > 0)`.
    ReluGrad,
    /// `a` = x, `b` = upstream gradient: `b * d gelu(a) / da`.
    GeluGrad,
    GeluTanhGrad,
    /// NaN-propagating, like PyTorch's `maximum`.
    Maximum,
    /// NaN-propagating, like PyTorch's `minimum`.
    Minimum,
    /// 1.0 where the comparison holds, else 0.0.
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

/// `op` over the NumPy broadcast of the two operands; returns (out, out_shape).
pub fn binary(
    op: BinaryOp,
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
) -> KResult<(Vec<f32>, crate::layout::Dims)> {
    const K: &str = "binary";
    check::view(K, "a", a.len(), la)?;
    check::view(K, "b", b.len(), lb)?;
    let Some(shape) = broadcast_shape(&la.shape, &lb.shape) else {
        return Err(KernelError::Shapes {
            kernel: K,
            detail: format!(
                "{:?} and {:?} do not broadcast together",
                &la.shape[..],
                &lb.shape[..]
            ),
        });
    };
    check::elements(K, &shape)?;
    let la = la.broadcast_to(&shape);
    let lb = lb.broadcast_to(&shape);
    let out = match op {
        BinaryOp::Add => zip_strided(a, &la, b, &lb, scalar::add),
        BinaryOp::Sub => zip_strided(a, &la, b, &lb, scalar::sub),
        BinaryOp::Mul => zip_strided(a, &la, b, &lb, scalar::mul),
        BinaryOp::Div => zip_strided(a, &la, b, &lb, scalar::div),
        BinaryOp::ReluGrad => zip_strided(a, &la, b, &lb, scalar::relu_grad),
        BinaryOp::GeluGrad => zip_strided(a, &la, b, &lb, scalar::gelu_grad),
        BinaryOp::GeluTanhGrad => zip_strided(a, &la, b, &lb, scalar::gelu_tanh_grad),
        BinaryOp::Maximum => zip_strided(a, &la, b, &lb, scalar::maximum),
        BinaryOp::Minimum => zip_strided(a, &la, b, &lb, scalar::minimum),
        BinaryOp::Gt => zip_strided(a, &la, b, &lb, scalar::gt),
        BinaryOp::Ge => zip_strided(a, &la, b, &lb, scalar::ge),
        BinaryOp::Lt => zip_strided(a, &la, b, &lb, scalar::lt),
        BinaryOp::Le => zip_strided(a, &la, b, &lb, scalar::le),
        BinaryOp::Eq => zip_strided(a, &la, b, &lb, scalar::eq),
        BinaryOp::Ne => zip_strided(a, &la, b, &lb, scalar::ne),
    };
    Ok((out, shape))
}

/// `f(a, b)` over two layouts of the same shape. The stride-1 and stride-0 (broadcast scalar)
/// cases get their own loops because they are the common ones and vectorize.
fn zip_strided<F: Fn(f32, f32) -> f32 + Sync>(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    f: F,
) -> Vec<f32> {
    let walk = Walk::new(&la.shape, [la, lb]);
    let mut out = crate::pool::take(numel(&la.shape));
    for_each_chunk(&mut out, |start, piece| {
        walk.runs(start, piece.len(), |at, len, [pa, pb], strides| {
            let dst = &mut piece[at..at + len];
            match strides {
                [1, 1] => {
                    for ((d, &x), &y) in dst.iter_mut().zip(&a[pa..pa + len]).zip(&b[pb..pb + len])
                    {
                        *d = f(x, y);
                    }
                }
                [1, 0] => {
                    let y = b[pb];
                    for (d, &x) in dst.iter_mut().zip(&a[pa..pa + len]) {
                        *d = f(x, y);
                    }
                }
                [0, 1] => {
                    let x = a[pa];
                    for (d, &y) in dst.iter_mut().zip(&b[pb..pb + len]) {
                        *d = f(x, y);
                    }
                }
                [sa, sb] => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = f(a[pa + i * sa], b[pb + i * sb]);
                    }
                }
            }
        });
    });
    out
}

/// NumPy broadcast of two shapes (right-aligned; sizes must match or one must be 1).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<crate::layout::Dims> {
    let rank = a.len().max(b.len());
    let size_at = |shape: &[usize], axis: usize| {
        let missing = rank - shape.len();
        if axis < missing {
            1
        } else {
            shape[axis - missing]
        }
    };
    (0..rank)
        .map(|axis| match (size_at(a, axis), size_at(b, axis)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}
