//! The driver of compiler-generated row kernels (`rtx_ir::fusion::Step::Rows`): for each row
//! of a wide shape `[.., N]`, the generated body reads its inputs along the row, reduces, and
//! writes wide (`N` values) and row-scalar (one value) outputs. Rows are independent, so they
//! run in parallel with results that do not depend on the thread count.

use rayon::prelude::*;

use super::check::{self, KResult};
use super::strided::{CHUNK, PARALLEL_THRESHOLD, numel, position};
use crate::layout::Layout;

/// One input of a row kernel seen from one row: element `j` of the row is
/// `data[base + j * stride]` (stride 0 for an input broadcast along the row).
#[derive(Clone, Copy)]
pub struct RowIn<'a> {
    data: &'a [f32],
    base: usize,
    stride: usize,
}

impl RowIn<'_> {
    #[inline(always)]
    pub fn at(&self, j: usize) -> f32 {
        self.data[self.base + j * self.stride]
    }
}

/// Output pointers shared by the rows; each row writes its own disjoint ranges.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: rows write disjoint ranges of each buffer (see `map_rows`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `body(inputs, row_len, outputs)` for every row of `wide` (rank >= 1). Input `k` is
/// read through `inputs[k]`, whose layout must already have the shape `wide` (broadcast axes
/// have stride 0; refused otherwise). Output `m` holds `row_len` values per row when
/// `out_wide[m]`, else one.
pub fn map_rows<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    wide: &[usize],
    out_wide: [bool; M],
    body: F,
) -> KResult<[Vec<f32>; M]>
where
    F: Fn(&[RowIn<'_>; N], usize, &mut [&mut [f32]; M]) + Sync,
{
    const K: &str = "map_rows";
    for (k, (data, l)) in inputs.iter().enumerate() {
        check::view(K, check::input_name(k), data.len(), l)?;
        check::same_shape(K, check::input_name(k), l, wide)?;
    }
    check::elements(K, wide)?;
    let rank = wide.len();
    let cols = wide.last().copied().unwrap_or(1);
    let leading = &wide[..rank.saturating_sub(1)];
    let rows = numel(leading);
    let width = |m: usize| if out_wide[m] { cols } else { 1 };
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|m| crate::pool::take(rows * width(m)));
    let ptrs: [OutPtr; M] = std::array::from_fn(|m| OutPtr(outs[m].as_mut_ptr()));
    // Where each input's leading axes collapse into one stride (a 2-D input, a contiguous or
    // broadcast batch), row `r` starts at `offset + r * stride`: no division per row and
    // input, which for short rows (softmax over 10 classes) cost more than the row itself.
    let row_strides: [Option<usize>; N] = std::array::from_fn(|k| {
        let l = inputs[k].1;
        let split = l.rank().saturating_sub(1);
        collapsed_stride(&l.shape[..split], &l.strides[..split])
    });
    let row = |r: usize| {
        let ins: [RowIn<'_>; N] = std::array::from_fn(|k| {
            let (data, l) = inputs[k];
            let split = l.rank().saturating_sub(1);
            let start = match row_strides[k] {
                Some(stride) => r * stride,
                None => position(r, &l.shape[..split], &l.strides[..split]),
            };
            RowIn {
                data,
                base: l.offset + start,
                stride: l.strides.get(split).copied().unwrap_or(0),
            }
        });
        // SAFETY: row `r` owns elements `r * width .. (r + 1) * width` of each output, which
        // holds `rows * width`; no other row touches them.
        let mut dst: [&mut [f32]; M] = std::array::from_fn(|m| unsafe {
            std::slice::from_raw_parts_mut(ptrs[m].get().add(r * width(m)), width(m))
        });
        body(&ins, cols, &mut dst);
    };
    if rows * cols <= PARALLEL_THRESHOLD || rows == 1 {
        (0..rows).for_each(row);
    } else {
        (0..rows)
            .into_par_iter()
            .with_min_len((CHUNK / cols.max(1)).max(1))
            .for_each(row);
    }
    Ok(outs)
}

/// The one stride that steps through every index of `shape` in row-major order under
/// `strides`, if there is one: axes of size 1 never move, and each other axis must step by
/// the stride of the axes inside it times their extent.
fn collapsed_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let mut innermost: Option<usize> = None;
    let mut span = 1usize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 1 {
            continue;
        }
        match innermost {
            None => {
                innermost = Some(s);
                span = n;
            }
            Some(base) => {
                if Some(s) != base.checked_mul(span) {
                    return None;
                }
                span = span.saturating_mul(n);
            }
        }
    }
    Some(innermost.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::collapsed_stride;

    #[test]
    fn leading_axes_collapse_only_when_they_nest() {
        assert_eq!(collapsed_stride(&[256], &[10]), Some(10));
        assert_eq!(collapsed_stride(&[4, 3], &[30, 10]), Some(10));
        assert_eq!(collapsed_stride(&[4, 1, 3], &[30, 99, 10]), Some(10));
        assert_eq!(collapsed_stride(&[4, 3], &[0, 0]), Some(0));
        assert_eq!(collapsed_stride(&[], &[]), Some(0));
        // Broadcast over the outer axis only, or a transposed batch: no single stride.
        assert_eq!(collapsed_stride(&[4, 3], &[0, 10]), None);
        assert_eq!(collapsed_stride(&[4, 3], &[10, 40]), None);
    }
}
