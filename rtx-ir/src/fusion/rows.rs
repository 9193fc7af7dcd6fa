//! Row groups: reductions over the last axis fused with the pointwise code around them (see
//! the planner's docs in `mod.rs`). This file says which nodes can join a row group and
//! builds a group's `Step::Rows`.

use super::{Instr, Operand, Operands, Pointwise, Step, group_outputs};
use crate::dim::Dim;
use crate::graph::{Graph, NodeId};
use crate::op::{DType, Op};

/// A reduction over the last axis of a row group, kept as a row scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowReduce {
    Sum,
    Mean,
    Max,
}

/// One instruction of a row group.
#[derive(Clone, Debug, PartialEq)]
pub enum RowInstr {
    /// A pointwise instruction; `wide` tells whether its value has the wide shape `[.., N]`
    /// (computed in every pass over the row) or is a row scalar `[.., 1]` (computed once).
    Map { instr: Instr, wide: bool },
    /// `node = reduce(arg)` over the row, where `arg` is wide.
    Reduce {
        node: NodeId,
        op: RowReduce,
        arg: Operand,
    },
}

/// How a node takes part in a row group, if it can.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum RowRole {
    /// A reduction over the last axis keeping it as size 1: the node's argument is wide.
    Reduce(RowReduce),
    /// `MeanGrad` over the last axis: the row-scalar gradient spread over the row, divided by
    /// the row length. The node is wide.
    Spread,
}

fn is_last_axis(axes: &[usize], rank: usize) -> bool {
    rank >= 1 && axes == [rank - 1]
}

pub(super) fn row_role(graph: &Graph, id: NodeId) -> Option<RowRole> {
    let node = graph.node(id);
    if node.dtype != DType::F32 {
        return None;
    }
    let rank = node.shape.len();
    match &node.op {
        Op::Sum {
            axes,
            keepdim: true,
        } if is_last_axis(axes, rank) => Some(RowRole::Reduce(RowReduce::Sum)),
        Op::Mean {
            axes,
            keepdim: true,
        } if is_last_axis(axes, rank) => Some(RowRole::Reduce(RowReduce::Mean)),
        Op::Max {
            axes,
            keepdim: true,
        } if is_last_axis(axes, rank) => Some(RowRole::Reduce(RowReduce::Max)),
        Op::SumTo => {
            // [.., N] -> [.., 1] with the same leading axes: a sum over the row.
            let from = &graph.node(*node.args.first()?).shape;
            let to = &node.shape;
            (rank >= 1
                && from.len() == rank
                && from[..rank - 1] == to[..rank - 1]
                && to[rank - 1].is_one()
                && !from[rank - 1].is_one())
            .then_some(RowRole::Reduce(RowReduce::Sum))
        }
        Op::MeanGrad {
            axes,
            keepdim: true,
        } if is_last_axis(axes, rank) => Some(RowRole::Spread),
        _ => None,
    }
}

/// `shape` with its last axis 1: the row-scalar shape of a wide shape.
pub(super) fn narrow_of(shape: &[Dim]) -> Vec<Dim> {
    let mut narrow = shape.to_vec();
    if let Some(last) = narrow.last_mut() {
        *last = Dim::known(1);
    }
    narrow
}

/// The `Step::Rows` of a row group.
pub(super) fn rows_step(
    graph: &Graph,
    members: &[NodeId],
    wide_shape: &[Dim],
    group: &[Option<usize>],
    read_outside: &[bool],
) -> Step {
    let mut operands = Operands::new(graph, group, members[0]);
    let mut body = Vec::with_capacity(members.len());
    // Any node of the wide shape gives the step its shape: a wide member, or the argument of a
    // reduction (an input when the group is a lone reduction).
    let mut shape_of = None;
    for &m in members {
        let node = graph.node(m);
        let is_wide = node.shape == wide_shape;
        if is_wide {
            shape_of.get_or_insert(m);
        }
        match (Pointwise::of(&node.op), row_role(graph, m)) {
            (Some(op), _) => body.push(RowInstr::Map {
                instr: Instr {
                    node: m,
                    op,
                    args: node.args.iter().map(|&a| operands.of(a)).collect(),
                },
                wide: is_wide,
            }),
            (None, Some(RowRole::Reduce(op))) => {
                shape_of.get_or_insert(node.args[0]);
                body.push(RowInstr::Reduce {
                    node: m,
                    op,
                    arg: operands.of(node.args[0]),
                });
            }
            // MeanGrad(like, g): g / row length, spread over the row (`like` gives only the
            // shape, so it is not read).
            (None, Some(RowRole::Spread)) => body.push(RowInstr::Map {
                instr: Instr {
                    node: m,
                    op: Pointwise::Div,
                    args: vec![operands.of(node.args[1]), Operand::RowLen],
                },
                wide: true,
            }),
            (None, None) => {}
        }
    }
    Step::Rows {
        shape_of: shape_of.unwrap_or(*members.last().unwrap_or(&members[0])),
        inputs: operands.inputs,
        body,
        outputs: group_outputs(members, read_outside),
    }
}
