//! Matmul epilogues: a pointwise group that is the only reader of a matmul of its shape runs
//! inside the GEMM, on each finished block of the product (`Step::MatMulEpilogue`).

use super::{Operand, Step};
use crate::graph::{Graph, NodeId};
use crate::op::{DType, Op};

/// Turns each pointwise group that is the only reader of a matmul of its shape into that
/// matmul's epilogue (`Step::MatMulEpilogue`), removing the matmul's own step.
pub(super) fn fuse_epilogues(graph: &Graph, steps: Vec<Step>, roots: &[NodeId]) -> Vec<Step> {
    let mut readers = vec![0usize; graph.len()];
    for step in &steps {
        let read: &[NodeId] = match step {
            Step::Kernel(id) => &graph.node(*id).args,
            Step::Fused { inputs, .. }
            | Step::Rows { inputs, .. }
            | Step::MatMulEpilogue { inputs, .. } => inputs,
        };
        for &a in read {
            readers[a] += 1;
        }
    }
    for &r in roots {
        readers[r] += 1;
    }
    let absorbable = |id: NodeId, shape_of: NodeId| {
        let node = graph.node(id);
        matches!(node.op, Op::MatMul)
            && node.dtype == DType::F32
            && readers[id] == 1
            && node.shape == graph.node(shape_of).shape
    };
    let mut absorbed = Vec::new();
    let mut out: Vec<Step> = steps
        .into_iter()
        .map(|step| match step {
            Step::Fused {
                shape_of,
                mut inputs,
                mut body,
                outputs,
            } => match inputs.iter().position(|&i| absorbable(i, shape_of)) {
                Some(k) => {
                    // The matmul becomes input 0 (the accumulator); renumber the others.
                    let matmul = inputs.remove(k);
                    inputs.insert(0, matmul);
                    let renumber = |i: usize| match i.cmp(&k) {
                        std::cmp::Ordering::Equal => 0,
                        std::cmp::Ordering::Less => i + 1,
                        std::cmp::Ordering::Greater => i,
                    };
                    for instr in &mut body {
                        for arg in &mut instr.args {
                            if let Operand::Input(i) = arg {
                                *i = renumber(*i);
                            }
                        }
                    }
                    absorbed.push(matmul);
                    Step::MatMulEpilogue {
                        matmul,
                        shape_of,
                        inputs,
                        body,
                        outputs,
                    }
                }
                None => Step::Fused {
                    shape_of,
                    inputs,
                    body,
                    outputs,
                },
            },
            other => other,
        })
        .collect();
    out.retain(|s| !matches!(s, Step::Kernel(id) if absorbed.contains(id)));
    out
}
