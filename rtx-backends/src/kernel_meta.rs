//! The meta words of the GPU backends' own core-op kernels: one layout per kernel, written
//! here once and read by its WGSL text (`wgpu/kernels.rs`) and its CUDA C text
//! (`cuda/kernels.rs`) alike, so the two targets share one ABI and differ only in spelling.
//! Each layout is documented next to the kernels that read it.

use crate::gpu_error::{GpuError, Result};

/// What a reduction computes per output element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    /// The largest value; NaN when any value is NaN (as on the CPU).
    Max,
    /// The position of the first largest value (NaN first, as on the CPU), written as a u32
    /// word: the output buffer holds indices.
    ArgMax,
}

/// `v` as a meta word, or an error naming `what` when it does not fit 32 bits.
pub fn word(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::Call(format!("{what} {v} exceeds 2^32")))
}

/// Each of `vs` as a meta word.
pub fn words(vs: &[usize], what: &str) -> Result<Vec<u32>> {
    vs.iter().map(|&v| word(v, what)).collect()
}

/// A reduction of the strided `shape`/`strides` view from `offset` over the axes marked in
/// `reduced`: `[outputs, reduced count, kept rank, reduced rank, mode, offset, kept sizes..,
/// kept strides.., reduced sizes.., reduced strides..]`, with the output count. Modes: 0 sum,
/// 1 mean, 2 max, 3 the position of the first maximum.
pub fn reduce(
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    reduced: &[bool],
    mode: Reduce,
) -> Result<(Vec<u32>, usize)> {
    let (mut ks, mut kst, mut rs, mut rst) = (vec![], vec![], vec![], vec![]);
    for (axis, (&size, &stride)) in shape.iter().zip(strides).enumerate() {
        if reduced.get(axis).copied().unwrap_or(false) {
            rs.push(size);
            rst.push(stride);
        } else {
            ks.push(size);
            kst.push(stride);
        }
    }
    let outputs: usize = ks.iter().product();
    let count: usize = rs.iter().product();
    let mode_word = match mode {
        Reduce::Sum => 0,
        Reduce::Mean => 1,
        Reduce::Max => 2,
        Reduce::ArgMax => 3,
    };
    let mut meta = words(&[outputs, count, ks.len(), rs.len()], "reduction size")?;
    meta.push(mode_word);
    meta.push(word(offset, "reduction offset")?);
    for part in [&ks, &kst, &rs, &rst] {
        meta.extend(words(part, "reduction size")?);
    }
    Ok((meta, outputs))
}

/// A copy between two strided views of one `shape`: `[n, rank, shape.., x_offset,
/// x_strides.., out_offset, out_strides..]`.
pub fn strided_copy(
    shape: &[usize],
    x: (usize, &[usize]),
    out: (usize, &[usize]),
) -> Result<Vec<u32>> {
    let n: usize = shape.iter().product();
    let mut meta = words(&[n, shape.len()], "copy size")?;
    meta.extend(words(shape, "copy size")?);
    for (offset, strides) in [x, out] {
        meta.push(word(offset, "copy offset")?);
        meta.extend(words(strides, "copy stride")?);
    }
    Ok(meta)
}

/// A gather of `rows` rows of `cols` values from a 2-D table at `offset` with the given row
/// and column strides: `[rows, cols, offset, row_stride, col_stride]`.
pub fn gather_rows(
    rows: usize,
    cols: usize,
    offset: usize,
    row_stride: usize,
    col_stride: usize,
) -> Result<Vec<u32>> {
    words(&[rows, cols, offset, row_stride, col_stride], "gather size")
}

/// The gradient of a max over the axes marked in `reduced` of a contiguous `shape`: `[n,
/// rank, shape.., reduced flags..]`.
pub fn scatter_first(shape: &[usize], reduced: &[bool]) -> Result<Vec<u32>> {
    let n: usize = shape.iter().product();
    let mut meta = words(&[n, shape.len()], "max gradient size")?;
    meta.extend(words(shape, "max gradient size")?);
    meta.extend(reduced.iter().map(|&r| u32::from(r)));
    Ok(meta)
}

/// The update rule of the optimizer-step kernels (`wgpu::WgpuDevice::optimizer_step`, `cuda::CudaDevice::optimizer_step`), with its hyperparameters.
#[derive(Clone, Copy, Debug)]
pub enum UpdateRule {
    Adam {
        lr: f32,
        betas: (f32, f32),
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
        /// `1 - beta^step` for each beta.
        corrections: (f32, f32),
    },
    Sgd {
        lr: f32,
        momentum: f32,
        dampening: f32,
        nesterov: bool,
        weight_decay: f32,
        first_step: bool,
    },
}

/// One optimizer step over `n` values: `[n, rule]` then f32 bits of `lr, beta1 | momentum,
/// beta2 | dampening, eps, weight_decay, flag (decoupled | nesterov), scalar0 (bias
/// correction 1 | first step), scalar1 (bias correction 2)`; rule 0 Adam, 1 SGD with
/// momentum, 2 plain SGD.
pub fn optimizer(rule: UpdateRule, n: usize) -> Result<Vec<u32>> {
    let f = |v: f32| v.to_bits();
    Ok(match rule {
        UpdateRule::Adam {
            lr,
            betas,
            eps,
            weight_decay,
            decoupled,
            corrections,
        } => vec![
            word(n, "parameter size")?,
            0,
            f(lr),
            f(betas.0),
            f(betas.1),
            f(eps),
            f(weight_decay),
            u32::from(decoupled),
            f(corrections.0),
            f(corrections.1),
        ],
        UpdateRule::Sgd {
            lr,
            momentum,
            dampening,
            nesterov,
            weight_decay,
            first_step,
        } => vec![
            word(n, "parameter size")?,
            if momentum == 0.0 { 2 } else { 1 },
            f(lr),
            f(momentum),
            f(dampening),
            0,
            f(weight_decay),
            u32::from(nesterov),
            f(if first_step { 1.0 } else { 0.0 }),
            0,
        ],
    })
}

/// The longest head a device attention kernel keeps in registers.
pub const ATTENTION_MAX_HEAD: usize = 128;

/// Sizes of an attention call over `S` flattened batch slices.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub slices: usize,
    pub queries: usize,
    pub keys: usize,
    pub head: usize,
    /// The width of v and of the output.
    pub value_head: usize,
    pub causal: bool,
}

impl AttentionShape {
    /// `[S, Tq, Tk, D, causal, scale bits, Dv]`, refused past [`ATTENTION_MAX_HEAD`] or for
    /// a causal mask over `Tq != Tk`.
    pub fn meta(&self) -> Result<Vec<u32>> {
        if self.head.max(self.value_head) > ATTENTION_MAX_HEAD
            || (self.causal && self.queries != self.keys)
        {
            return Err(GpuError::Call(format!(
                "device attention takes heads up to {ATTENTION_MAX_HEAD} (and Tq == Tk when causal), found {self:?}"
            )));
        }
        let mut meta = words(
            &[
                self.slices,
                self.queries,
                self.keys,
                self.head,
                usize::from(self.causal),
            ],
            "attention size",
        )?;
        meta.push((1.0 / (self.head as f32).sqrt()).to_bits());
        meta.push(words(&[self.value_head], "attention size")?[0]);
        Ok(meta)
    }
}

/// Which pass of a convolution the convolution kernels computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvPass {
    /// `y = conv(x, w)`: operands x, w.
    Forward,
    /// The input gradient: operands g, w.
    GradInput,
    /// The weight gradient: operands x, g.
    GradWeight,
}

/// The sizes of a 2-D convolution: x `[N, C, H, W]`, w `[O, C, KH, KW]`, y `[N, O, OH, OW]`.
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    pub x: [usize; 4],
    pub w: [usize; 4],
    pub y: [usize; 4],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// A convolution pass: `[mode, N, C, H, W, O, KH, KW, OH, OW, stride_h, stride_w, pad_h,
/// pad_w]` (mode 0 forward, 1 input gradient, 2 weight gradient), with the output count.
pub fn conv2d(pass: ConvPass, s: ConvShape) -> Result<(Vec<u32>, usize)> {
    let ([n, c, h, w], [o, _, kh, kw], [_, _, oh, ow]) = (s.x, s.w, s.y);
    let outputs = match pass {
        ConvPass::Forward => n * o * oh * ow,
        ConvPass::GradInput => n * c * h * w,
        ConvPass::GradWeight => o * c * kh * kw,
    };
    if s.stride.contains(&0) {
        return Err(GpuError::Call(format!("conv2d of {s:?}: a stride of 0")));
    }
    let mode = match pass {
        ConvPass::Forward => 0,
        ConvPass::GradInput => 1,
        ConvPass::GradWeight => 2,
    };
    let meta = words(
        &[
            mode,
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            oh,
            ow,
            s.stride[0],
            s.stride[1],
            s.padding[0],
            s.padding[1],
        ],
        "conv2d size",
    )?;
    Ok((meta, outputs))
}

/// Which pooling pass the pooling kernels computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolPass {
    Max,
    Avg,
    /// Operands x and g.
    MaxGrad,
    /// Operand g.
    AvgGrad,
}

/// A pooling pass: `[mode, N, C, H, W, KH, KW, OH, OW, stride_h, stride_w, pad_h, pad_w]`
/// (mode 0 max, 1 average, 2 max gradient, 3 average gradient), with the output count.
pub fn pool2d(
    pass: PoolPass,
    x_shape: [usize; 4],
    (kernel, stride, padding): ([usize; 2], [usize; 2], [usize; 2]),
    out_hw: [usize; 2],
) -> Result<(Vec<u32>, usize)> {
    let [n, c, h, w] = x_shape;
    let outputs = match pass {
        PoolPass::Max | PoolPass::Avg => n * c * out_hw[0] * out_hw[1],
        PoolPass::MaxGrad | PoolPass::AvgGrad => n * c * h * w,
    };
    if stride.contains(&0) {
        return Err(GpuError::Call(format!(
            "pool2d of {x_shape:?}: a stride of 0"
        )));
    }
    let mode = match pass {
        PoolPass::Max => 0,
        PoolPass::Avg => 1,
        PoolPass::MaxGrad => 2,
        PoolPass::AvgGrad => 3,
    };
    let meta = words(
        &[
            mode, n, c, h, w, kernel[0], kernel[1], out_hw[0], out_hw[1], stride[0], stride[1],
            padding[0], padding[1],
        ],
        "pool2d size",
    )?;
    Ok((meta, outputs))
}
