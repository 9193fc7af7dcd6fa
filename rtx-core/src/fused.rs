//! Running the fused pointwise kernels that `graph!` generates, and the switch that turns
//! fusion off (`RTX_FUSION=0`) so a model can be checked against its one-op-per-node schedule.

use crate::error::{Result, RtxError};
use crate::tensor::{Buffer, Tensor, fmt_dims};
use rtx_backends::arena::Region;
use rtx_backends::cpu;
use std::sync::OnceLock;

pub use rtx_backends::cpu::scalar;
pub use rtx_backends::cpu::{RowIn, row_max, row_sum};

/// The body a compiled step runs, chosen once per call by the call's precision.
///
/// A body that rounds to the call's precision (`Autocast`, `AutocastGrad`) comes in two
/// versions: `Plain` with the roundings removed, for calls at f32 where they change nothing,
/// and `Rounding` with them. The rounding is branch-free arithmetic (about a dozen vector
/// instructions per value), so at f32 it cost more than the ops around it: 15% of the MLP
/// training step. A body with no rounding is always `Plain`, and its `Rounding` type is a
/// function pointer that is never called (one driver instantiation per arity, not per body).
#[derive(Clone, Copy)]
pub enum Kernel<F, G> {
    /// The body without roundings: at f32, or for a body that never rounds.
    Plain(F),
    /// The body with its roundings, for calls at bf16 or f16.
    Rounding(G),
}

/// Whether compiled models run their fused schedule: true unless the environment variable
/// `RTX_FUSION` is `0`, `off` or `false` when the first model runs.
pub fn fusion_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        !matches!(
            std::env::var("RTX_FUSION").as_deref(),
            Ok("0") | Ok("off") | Ok("false")
        )
    })
}

/// Runs a generated pointwise body over `shape`: input `k` is `inputs[k]` broadcast to `shape`,
/// and the body's `M` results become `M` contiguous tensors.
#[doc(hidden)]
pub fn fused<const N: usize, const M: usize, F>(
    inputs: [&Tensor; N],
    shape: &[usize],
    regions: [Option<Region>; M],
    body: F,
) -> Result<[Tensor; M]>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    let mut data: [&[f32]; N] = [&[]; N];
    for (slot, t) in data.iter_mut().zip(inputs) {
        *slot = t.f32_parts("fused kernel")?.0;
        need_broadcast(t, shape, "fused kernel")?;
    }
    let layouts: [rtx_backends::Layout; N] =
        std::array::from_fn(|k| inputs[k].layout().broadcast_to(shape));
    let args: [(&[f32], &rtx_backends::Layout); N] =
        std::array::from_fn(|k| (data[k], &layouts[k]));
    let n = shape.iter().product();
    let mut outs = regions.map(|r| Buffer::new(r, n));
    cpu::map_fused_into(
        args,
        shape,
        outs.each_mut().map(Buffer::as_mut_slice),
        None,
        body,
    )?;
    Ok(outs.map(|data| Tensor::from_buffer(data, shape)))
}

/// An input of a generated pointwise kernel: borrowed, or handed over by the compiled code
/// because no later step reads it, so its buffer may take the kernel's first output.
#[doc(hidden)]
pub enum FusedArg<'a> {
    Borrowed(&'a Tensor),
    Donated(Tensor),
}

/// [`fused`] whose inputs may be donated: the first donated input whose buffer is unshared,
/// contiguous and of `shape` receives output 0 in place (`cpu::map_fused_in_place`), so the
/// group allocates no buffer for it and writes over memory that is still in cache. Otherwise
/// it runs as [`fused`]; the donated tensors are dropped at the end either way.
#[doc(hidden)]
pub fn fused_donating<const N: usize, const M: usize, F>(
    inputs: [FusedArg<'_>; N],
    shape: &[usize],
    regions: [Option<Region>; M],
    body: F,
) -> Result<[Tensor; M]>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    let mut donor: Option<(usize, Buffer)> = None;
    let mut kept: [Option<Tensor>; N] = std::array::from_fn(|_| None);
    let mut borrowed: [Option<&Tensor>; N] = [None; N];
    for (k, arg) in inputs.into_iter().enumerate() {
        match arg {
            FusedArg::Borrowed(t) => borrowed[k] = Some(t),
            FusedArg::Donated(t) => {
                let fits = donor.is_none() && M > 0 && t.shape() == shape;
                match if fits { t.take_unique_f32() } else { Err(t) } {
                    Ok(buffer) => donor = Some((k, buffer)),
                    Err(t) => kept[k] = Some(t),
                }
            }
        }
    }
    let mut data: [&[f32]; N] = [&[]; N];
    let mut layouts: [rtx_backends::Layout; N] =
        std::array::from_fn(|_| rtx_backends::Layout::contiguous(shape));
    for k in 0..N {
        // Every input is borrowed, kept, or the donor (read from the output buffer).
        let Some(t) = borrowed[k].or(kept[k].as_ref()) else {
            continue;
        };
        data[k] = t.f32_parts("fused kernel")?.0;
        need_broadcast(t, shape, "fused kernel")?;
        layouts[k] = t.layout().broadcast_to(shape);
    }
    let args: [(&[f32], &rtx_backends::Layout); N] =
        std::array::from_fn(|k| (data[k], &layouts[k]));
    let n = shape.iter().product();
    let in_place = donor.as_ref().map(|&(k, _)| k);
    let mut donated = donor.map(|(_, buffer)| buffer);
    let mut regions = regions.into_iter();
    let mut outs: [Buffer; M] = std::array::from_fn(|_| {
        let region = regions.next().flatten();
        donated.take().unwrap_or_else(|| Buffer::new(region, n))
    });
    let slices = outs.each_mut().map(Buffer::as_mut_slice);
    cpu::map_fused_into(args, shape, slices, in_place, body)?;
    Ok(outs.map(|data| Tensor::from_buffer(data, shape)))
}

/// Runs a generated row body (a `Step::Rows` group) over the rows of `wide`: input `k` is
/// `inputs[k]` broadcast to `wide`, a whole row of it when `varies[k]`, else the row's one
/// value; output `m` has shape `wide` when `out_wide[m]`, else `wide` with its last axis 1.
/// The body's last argument is a scratch row for the values it reduces.
#[doc(hidden)]
pub fn rows<const N: usize, const M: usize, F>(
    inputs: [&Tensor; N],
    wide: &[usize],
    varies: [bool; N],
    out_wide: [bool; M],
    regions: [Option<Region>; M],
    body: F,
) -> Result<[Tensor; M]>
where
    F: Fn(&[RowIn<'_>; N], usize, &mut [&mut [f32]; M], &mut [f32]) + Sync + Copy,
{
    let mut data: [&[f32]; N] = [&[]; N];
    for (slot, t) in data.iter_mut().zip(inputs) {
        *slot = t.f32_parts("row kernel")?.0;
        need_broadcast(t, wide, "row kernel")?;
    }
    let layouts: [rtx_backends::Layout; N] =
        std::array::from_fn(|k| inputs[k].layout().broadcast_to(wide));
    let args: [(&[f32], &rtx_backends::Layout); N] =
        std::array::from_fn(|k| (data[k], &layouts[k]));
    let lens = cpu::row_output_lens(wide, out_wide);
    let mut m = 0;
    let mut outs = regions.map(|r| {
        m += 1;
        Buffer::new(r, lens[m - 1])
    });
    let slices = outs.each_mut().map(Buffer::as_mut_slice);
    cpu::map_rows_into(args, wide, varies, out_wide, slices, body)?;
    let mut narrow = rtx_backends::layout::Dims::from_slice(wide);
    if let Some(last) = narrow.last_mut() {
        *last = 1;
    }
    let mut m = 0;
    Ok(outs.map(|data| {
        let shape: &[usize] = if out_wide[m] { wide } else { &narrow };
        m += 1;
        Tensor::from_buffer(data, shape)
    }))
}

/// Runs `a @ b` with a generated pointwise epilogue (a `Step::MatMulEpilogue`): `body`'s first
/// argument is the product's element, the others are `extras` broadcast to `shape` (the
/// product's shape) at the same position; its `M` results are the `M` outputs. `N` must be
/// `E + 1` (the macro emits it so).
#[doc(hidden)]
pub fn matmul_fused<const N: usize, const E: usize, const M: usize, F>(
    a: &Tensor,
    b: &Tensor,
    extras: [&Tensor; E],
    shape: &[usize],
    regions: [Option<Region>; M],
    body: F,
) -> Result<[Tensor; M]>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    if N != E + 1 {
        return Err(RtxError::Invalid(format!(
            "a matmul epilogue reads the product and {E} more values, not {} more",
            N.saturating_sub(1)
        )));
    }
    let (da, la) = a.f32_parts("matmul epilogue")?;
    let (db, lb) = b.f32_parts("matmul epilogue")?;
    let mut data: [&[f32]; E] = [&[]; E];
    for (slot, t) in data.iter_mut().zip(extras) {
        *slot = t.f32_parts("matmul epilogue")?.0;
        need_broadcast(t, shape, "matmul epilogue")?;
    }
    let layouts: [rtx_backends::Layout; E] =
        std::array::from_fn(|k| extras[k].layout().broadcast_to(shape));
    let args: [(&[f32], &rtx_backends::Layout); E] =
        std::array::from_fn(|k| (data[k], &layouts[k]));
    let n = shape.iter().product();
    let mut outs = regions.map(|r| Buffer::new(r, n));
    let slices = outs.each_mut().map(Buffer::as_mut_slice);
    let product_shape = cpu::matmul_fused_into(da, la, db, lb, &args, slices, body)?;
    if product_shape[..] != *shape {
        return Err(RtxError::ShapeMismatch {
            context: "matmul epilogue".into(),
            expected: fmt_dims(shape),
            found: fmt_dims(&product_shape),
        });
    }
    Ok(outs.map(|data| Tensor::from_buffer(data, shape)))
}

/// Runs `a @ b` (matrices) and sums each row of `a` in the same GEMM (a
/// `Step::MatMulRowSums`: a weight gradient `x^T @ y` and the bias gradient, `x` summed over
/// its first axis): `[product, sums]`, of shapes `product_shape` and `sums_shape` (`[M]` or
/// `[1, M]`).
#[doc(hidden)]
pub fn matmul_row_sums(
    a: &Tensor,
    b: &Tensor,
    product_shape: &[usize],
    sums_shape: &[usize],
) -> Result<[Tensor; 2]> {
    let (da, la) = a.f32_parts("matmul with row sums")?;
    let (db, lb) = b.f32_parts("matmul with row sums")?;
    let (product, sums, shape) = cpu::matmul_row_sums(da, la, db, lb)?;
    if shape[..] != *product_shape || sums.len() != sums_shape.iter().product::<usize>() {
        return Err(RtxError::ShapeMismatch {
            context: "matmul with row sums".into(),
            expected: format!("{} and {}", fmt_dims(product_shape), fmt_dims(sums_shape)),
            found: format!("{} and [{}]", fmt_dims(&shape), sums.len()),
        });
    }
    Ok([
        Tensor::from_kernel(product, product_shape),
        Tensor::from_kernel(sums, sums_shape),
    ])
}

/// Refuses a kernel input whose shape does not broadcast to `shape` (the layout it would be
/// read through could not mean the input's values).
fn need_broadcast(t: &Tensor, shape: &[usize], context: &str) -> Result<()> {
    let from = t.shape();
    let fits = from.len() <= shape.len()
        && from
            .iter()
            .zip(&shape[shape.len() - from.len()..])
            .all(|(&f, &to)| f == to || f == 1);
    if fits {
        Ok(())
    } else {
        Err(RtxError::ShapeMismatch {
            context: context.to_string(),
            expected: format!("a shape that broadcasts to {}", fmt_dims(shape)),
            found: fmt_dims(from),
        })
    }
}
