//! Which values are row-major from the start of their buffer when a call runs: what decides
//! whether a reshape hands on its argument's buffer or copies it (`Tensor::reshape` copies a
//! value that is not), and so whether the reshape needs a buffer of its own in the plan.
//!
//! The run-time layouts are simulated with the call's symbol values: a view op moves strides
//! and offsets the way `rtx_backends::Layout` does, every kernel writes a fresh row-major
//! buffer. Inputs and parameters are taken as row-major (a user's strided input only makes a
//! planned reshape share instead of copy, which costs its arena region, never correctness:
//! `Arena::claim` checks every claim).

use crate::fusion::Step;
use crate::graph::{GraphFn, NodeId};
use crate::op::Op;
use std::collections::HashMap;

/// A value's simulated layout: sizes, strides (elements), offset (elements).
#[derive(Clone, Debug)]
struct View {
    shape: Vec<i64>,
    strides: Vec<i64>,
    offset: i64,
}

impl View {
    fn row_major(shape: Vec<i64>) -> View {
        let mut strides = vec![0; shape.len()];
        let mut acc = 1;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i];
        }
        View {
            shape,
            strides,
            offset: 0,
        }
    }

    /// `Layout::is_contiguous` at offset 0: size-1 axes' strides do not matter.
    fn is_row_major(&self) -> bool {
        let mut acc = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i];
        }
        self.offset == 0
    }
}

/// For each node of `steps` (and every leaf), whether its value is row-major from its
/// buffer's start when the call runs with the symbols bound to `env`; `passes` marks the
/// steps that hand their input on (as in `lives_and_owners`). `None` when a shape cannot be
/// evaluated.
pub(crate) fn row_major_values(
    f: &GraphFn,
    steps: &[Step],
    env: &HashMap<String, i64>,
    passes: &[bool],
) -> Option<HashMap<NodeId, bool>> {
    let shape = |v: NodeId| -> Option<Vec<i64>> {
        f.graph.node(v).shape.iter().map(|d| d.eval(env)).collect()
    };
    let mut views: HashMap<NodeId, View> = HashMap::new();
    let view_of = |views: &HashMap<NodeId, View>, v: NodeId| -> Option<View> {
        match views.get(&v) {
            Some(view) => Some(view.clone()),
            None => Some(View::row_major(shape(v)?)),
        }
    };
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Kernel(id) => {
                let node = f.graph.node(*id);
                let arg = |k: usize| node.args.get(k).copied();
                let view = match &node.op {
                    Op::Permute { perm } => {
                        let src = view_of(&views, arg(0)?)?;
                        View {
                            shape: perm
                                .iter()
                                .map(|&p| src.shape.get(p).copied())
                                .collect::<Option<_>>()?,
                            strides: perm
                                .iter()
                                .map(|&p| src.strides.get(p).copied())
                                .collect::<Option<_>>()?,
                            offset: src.offset,
                        }
                    }
                    Op::Narrow { axis, start, len } => {
                        narrow(view_of(&views, arg(0)?)?, *axis, *start as i64, *len as i64)?
                    }
                    Op::ConcatGrad { axis, index } => {
                        let mut start = 0;
                        for k in 1..1 + index {
                            start += *shape(arg(k)?)?.get(*axis)?;
                        }
                        let len = *shape(arg(1 + index)?)?.get(*axis)?;
                        narrow(view_of(&views, arg(0)?)?, *axis, start, len)?
                    }
                    Op::BroadcastTo => {
                        let src = view_of(&views, arg(0)?)?;
                        let to = shape(*id)?;
                        let extra = to.len().checked_sub(src.shape.len())?;
                        let mut strides = vec![0; to.len()];
                        for (k, (&size, &stride)) in src.shape.iter().zip(&src.strides).enumerate()
                        {
                            if !(size == 1 && to[extra + k] != 1) {
                                strides[extra + k] = stride;
                            }
                        }
                        View {
                            shape: to,
                            strides,
                            offset: src.offset,
                        }
                    }
                    // `ops::execute` clones the argument (at f32) or writes it row-major.
                    Op::StopGradient | Op::Autocast | Op::AutocastGrad => view_of(&views, arg(0)?)?,
                    _ => View::row_major(shape(*id)?),
                };
                views.insert(*id, view);
            }
            Step::Fused {
                inputs, outputs, ..
            } if passes.get(i).copied().unwrap_or(false) => {
                if let ([input], [output]) = (&inputs[..], &outputs[..]) {
                    let view = view_of(&views, *input)?;
                    views.insert(*output, view);
                }
            }
            // Every other step's kernels write fresh row-major buffers.
            _ => {}
        }
    }
    Some(
        views
            .into_iter()
            .map(|(v, view)| (v, view.is_row_major()))
            .collect(),
    )
}

fn narrow(mut view: View, axis: usize, start: i64, len: i64) -> Option<View> {
    view.offset += start * view.strides.get(axis)?;
    *view.shape.get_mut(axis)? = len;
    Some(view)
}
