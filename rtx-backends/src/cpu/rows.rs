//! The driver of compiler-generated row kernels (`rtx_ir::fusion::Step::Rows`): for each row
//! of a wide shape `[.., N]`, the generated body reads its inputs along the row, reduces, and
//! writes wide (`N` values) and row-scalar (one value) outputs. Rows are independent, so they
//! run in parallel with results that do not depend on the thread count.
//!
//! Every input that varies along the row reaches the body as a contiguous slice of the row
//! (copied into a scratch row first when its layout steps by anything but 1), and the body
//! gets a scratch row for the values it reduces, so each of its passes is a plain loop over
//! slices that the compiler vectorizes; the rows run inside `simd::widest`, so that loop uses
//! the widest vectors this CPU has.

use super::check::{self, KResult};
use super::strided::{CHUNK, PARALLEL_THRESHOLD, numel, position};
use crate::layout::Layout;

/// One input of a row kernel seen from one row: the row's values (for an input that varies
/// along the row) or its one value (a row scalar, broadcast along the row).
#[derive(Clone, Copy)]
pub struct RowIn<'a> {
    row: &'a [f32],
}

impl<'a> RowIn<'a> {
    /// Element `j` of the row (`0` for a row scalar).
    #[inline(always)]
    pub fn at(&self, j: usize) -> f32 {
        self.row[j]
    }

    /// The row's values: `N` of them for an input that varies along the row, one for a row
    /// scalar.
    #[inline(always)]
    pub fn row(&self) -> &'a [f32] {
        self.row
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

/// Runs `body(inputs, row_len, outputs, scratch)` for every row of `wide` (rank >= 1). Input
/// `k` is read through `inputs[k]`, whose layout must already have the shape `wide` (broadcast
/// axes have stride 0; refused otherwise); `varies[k]` says whether it varies along the row
/// (its slice holds the row) or is a row scalar (its slice holds the row's one value). Output
/// `m` holds `row_len` values per row when `out_wide[m]`, else one. `scratch` holds `row_len`
/// values the body may overwrite.
pub fn map_rows<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    wide: &[usize],
    varies: [bool; N],
    out_wide: [bool; M],
    body: F,
) -> KResult<[Vec<f32>; M]>
where
    F: Fn(&[RowIn<'_>; N], usize, &mut [&mut [f32]; M], &mut [f32]) + Sync + Copy,
{
    check::elements("map_rows", wide)?;
    let lens = row_output_lens(wide, out_wide);
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|m| crate::pool::take(lens[m]));
    map_rows_into(
        inputs,
        wide,
        varies,
        out_wide,
        outs.each_mut().map(|o| &mut o[..]),
        body,
    )?;
    Ok(outs)
}

/// The element count of each output of [`map_rows`] over `wide`: a row's length per row for
/// a wide output, one value per row otherwise.
pub fn row_output_lens<const M: usize>(wide: &[usize], out_wide: [bool; M]) -> [usize; M] {
    let cols = wide.last().copied().unwrap_or(1);
    let rows = numel(&wide[..wide.len().saturating_sub(1)]);
    std::array::from_fn(|m| if out_wide[m] { rows * cols } else { rows })
}

/// [`map_rows`] writing into `outs`, buffers of [`row_output_lens`] the caller provides.
pub fn map_rows_into<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    wide: &[usize],
    varies: [bool; N],
    out_wide: [bool; M],
    mut outs: [&mut [f32]; M],
    body: F,
) -> KResult<()>
where
    F: Fn(&[RowIn<'_>; N], usize, &mut [&mut [f32]; M], &mut [f32]) + Sync + Copy,
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
    for (m, out) in outs.iter().enumerate() {
        check::shapes(K, out.len() == rows * width(m), || {
            format!(
                "output {m} holds {} values, the rows {}",
                out.len(),
                rows * width(m)
            )
        })?;
    }
    let ptrs: [OutPtr; M] = std::array::from_fn(|m| OutPtr(outs[m].as_mut_ptr()));
    // Where each input's leading axes collapse into one stride (a 2-D input, a contiguous or
    // broadcast batch), row `r` starts at `offset + r * stride`: no division per row and
    // input, which for short rows (softmax over 10 classes) cost more than the row itself.
    let row_strides: [Option<usize>; N] = std::array::from_fn(|k| {
        let l = inputs[k].1;
        let split = l.rank().saturating_sub(1);
        collapsed_stride(&l.shape[..split], &l.strides[..split])
    });
    let col_strides: [usize; N] = std::array::from_fn(|k| {
        let l = inputs[k].1;
        l.strides
            .get(l.rank().saturating_sub(1))
            .copied()
            .unwrap_or(0)
    });
    // Inputs that vary along the row but do not step by 1 along it are copied per row.
    let copied: [Option<usize>; N] = {
        let mut slot = 0;
        std::array::from_fn(|k| {
            (varies[k] && col_strides[k] != 1 && cols > 1).then(|| {
                slot += 1;
                slot - 1
            })
        })
    };
    let copies = copied.iter().flatten().count();
    // Inlined inside `simd::widest` (a call would run the body compiled for the baseline).
    let row = inline_closure(
        #[inline(always)]
        |r: usize, scratch: &mut [f32], body: &F| {
            let (copy_rows, reduce_row) = scratch.split_at_mut(copies * cols);
            let starts: [usize; N] = std::array::from_fn(|k| {
                let (_, l) = inputs[k];
                let split = l.rank().saturating_sub(1);
                l.offset
                    + match row_strides[k] {
                        Some(stride) => r * stride,
                        None => position(r, &l.shape[..split], &l.strides[..split]),
                    }
            });
            for k in 0..N {
                if let Some(slot) = copied[k] {
                    let (data, stride) = (inputs[k].0, col_strides[k]);
                    let dst = &mut copy_rows[slot * cols..(slot + 1) * cols];
                    for (j, d) in dst.iter_mut().enumerate() {
                        *d = data[starts[k] + j * stride];
                    }
                }
            }
            let copy_rows: &[f32] = copy_rows;
            let ins: [RowIn<'_>; N] = std::array::from_fn(|k| {
                let data = inputs[k].0;
                let row = match copied[k] {
                    Some(slot) => &copy_rows[slot * cols..(slot + 1) * cols],
                    None if varies[k] => &data[starts[k]..starts[k] + cols],
                    None => &data[starts[k]..starts[k] + 1],
                };
                RowIn { row }
            });
            // SAFETY: row `r` owns elements `r * width .. (r + 1) * width` of each output, which
            // holds `rows * width`; no other row touches them.
            let mut dst: [&mut [f32]; M] = std::array::from_fn(|m| unsafe {
                std::slice::from_raw_parts_mut(ptrs[m].get().add(r * width(m)), width(m))
            });
            body(&ins, cols, &mut dst, reduce_row);
        },
    );
    let run_rows = |range: std::ops::Range<usize>| {
        let mut scratch = crate::pool::Scratch(crate::pool::take((copies + 1) * cols));
        let scratch: &mut [f32] = &mut scratch.0;
        // The body copied into this frame: read through the caller's reference, the values
        // it captured (the call's rounding) were reloaded every element.
        let body: F = body;
        super::simd::widest(
            #[inline(always)]
            move || {
                let body = body;
                for r in range {
                    row(r, scratch, &body);
                }
            },
        );
    };
    if rows * cols <= PARALLEL_THRESHOLD || rows == 1 {
        run_rows(0..rows);
    } else {
        let per_task = (CHUNK / cols.max(1)).max(1);
        super::strided::for_each_task(rows.div_ceil(per_task), &|t| {
            run_rows(t * per_task..rows.min((t + 1) * per_task))
        });
    }
    Ok(())
}

/// `f` itself: a closure bound with `let` cannot carry `#[inline(always)]`, one passed as an
/// argument can.
#[inline(always)]
fn inline_closure<C>(c: C) -> C {
    c
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
