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
