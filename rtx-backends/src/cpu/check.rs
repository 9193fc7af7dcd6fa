//! The checks every public kernel runs on its arguments before it touches them.
//!
//! Kernels index buffers through layouts (and the GEMM through raw pointers), so a layout that
//! reaches past its buffer, or operands whose shapes do not combine, must be refused before the
//! arithmetic starts. These checks are about what the kernel can safely read and write, not the
//! IR's shape rules (rtx-core runs those first, once, and the compiled code relies on them):
//! they cost a few comparisons per call and turn a misuse of the public API into a
//! [`KernelError`] instead of a panic or an out-of-bounds access.

use crate::layout::Layout;

/// Why a kernel refused its arguments.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A layout whose shape and strides disagree or whose elements lie outside its buffer.
    #[error("`{kernel}` argument `{arg}`: {detail}")]
    View {
        kernel: &'static str,
        arg: &'static str,
        detail: String,
    },
    /// Operands whose shapes the kernel cannot combine.
    #[error("`{kernel}`: {detail}")]
    Shapes {
        kernel: &'static str,
        detail: String,
    },
    /// A scalar argument outside the values the kernel accepts (a probability, a stride).
    #[error("`{kernel}`: {detail}")]
    Argument {
        kernel: &'static str,
        detail: String,
    },
    /// An index (class label, embedding id) outside `0..limit`.
    #[error("`{kernel}`: index {value} at position {position} is outside 0..{limit}")]
    Index {
        kernel: &'static str,
        position: usize,
        value: i64,
        limit: usize,
    },
}

pub type KResult<T> = Result<T, KernelError>;

/// `layout` describes elements that all lie inside a buffer of `len` values.
pub(crate) fn view(kernel: &'static str, arg: &'static str, len: usize, l: &Layout) -> KResult<()> {
    let fail = |detail: String| KernelError::View {
        kernel,
        arg,
        detail,
    };
    if l.strides.len() != l.shape.len() {
        return Err(fail(format!(
            "{} strides for {} axes",
            l.strides.len(),
            l.shape.len()
        )));
    }
    if l.shape.contains(&0) {
        return Ok(());
    }
    // The last element is the farthest one: every stride is non-negative.
    let mut last = Some(l.offset);
    for (&n, &s) in l.shape.iter().zip(&l.strides) {
        last = last.and_then(|p| (n - 1).checked_mul(s).and_then(|d| p.checked_add(d)));
    }
    match last {
        Some(p) if p < len => Ok(()),
        _ => Err(fail(format!(
            "shape {:?} with strides {:?} from offset {} reads past a buffer of {len} values",
            &l.shape[..],
            &l.strides[..],
            l.offset
        ))),
    }
}

/// Fails with a shape error unless `ok`.
pub(crate) fn shapes(
    kernel: &'static str,
    ok: bool,
    detail: impl FnOnce() -> String,
) -> KResult<()> {
    if ok {
        Ok(())
    } else {
        Err(KernelError::Shapes {
            kernel,
            detail: detail(),
        })
    }
}

/// Fails with an argument error unless `ok`.
pub(crate) fn argument(
    kernel: &'static str,
    ok: bool,
    detail: impl FnOnce() -> String,
) -> KResult<()> {
    if ok {
        Ok(())
    } else {
        Err(KernelError::Argument {
            kernel,
            detail: detail(),
        })
    }
}

/// `l` has exactly the shape `shape` (an input of a kernel that does not broadcast).
pub(crate) fn same_shape(
    kernel: &'static str,
    arg: &'static str,
    l: &Layout,
    shape: &[usize],
) -> KResult<()> {
    shapes(kernel, l.shape[..] == *shape, || {
        format!(
            "`{arg}` has shape {:?} where {shape:?} is needed",
            &l.shape[..]
        )
    })
}

/// `axes` are distinct axes of a tensor of rank `rank`.
pub(crate) fn axes(kernel: &'static str, axes: &[usize], rank: usize) -> KResult<()> {
    for (i, &axis) in axes.iter().enumerate() {
        shapes(kernel, axis < rank, || {
            format!("axis {axis} is out of range for a tensor of rank {rank}")
        })?;
        shapes(kernel, !axes[..i].contains(&axis), || {
            format!("axis {axis} appears twice in {axes:?}")
        })?;
    }
    Ok(())
}

/// The argument name of input `k` of a kernel that takes an array of inputs.
pub(crate) fn input_name(k: usize) -> &'static str {
    const NAMES: [&str; 12] = [
        "inputs[0]",
        "inputs[1]",
        "inputs[2]",
        "inputs[3]",
        "inputs[4]",
        "inputs[5]",
        "inputs[6]",
        "inputs[7]",
        "inputs[8]",
        "inputs[9]",
        "inputs[10]",
        "inputs[11]",
    ];
    NAMES.get(k).copied().unwrap_or("inputs[12..]")
}

/// Every index lies in `0..limit`.
pub(crate) fn indices(kernel: &'static str, ids: &[i64], limit: usize) -> KResult<()> {
    match ids.iter().position(|&v| v < 0 || v as u64 >= limit as u64) {
        Some(position) => Err(KernelError::Index {
            kernel,
            position,
            value: ids[position],
            limit,
        }),
        None => Ok(()),
    }
}

/// The element count of `shape`, refused when it overflows.
pub(crate) fn elements(kernel: &'static str, shape: &[usize]) -> KResult<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| KernelError::Shapes {
            kernel,
            detail: format!("{shape:?} has more elements than memory can hold"),
        })
}
