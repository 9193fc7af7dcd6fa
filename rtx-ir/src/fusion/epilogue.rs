//! Work done inside a GEMM: a pointwise group that is the only reader of a matmul of its
//! shape runs on each finished block of the product (`Step::MatMulEpilogue`), and a bias
//! gradient sums its rows while the weight gradient's GEMM packs them
//! (`Step::MatMulRowSums`).

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
            Step::MatMulRowSums { .. } => &[],
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
    // A `Linear` on `[B, T, IN]` is a 2-D product reshaped back to `[B, T, OUT]`; a group of
    // that shape reading the reshape (an activation's gradient, say) runs on the product's
    // tiles all the same, since a row-major reshape keeps every element's position, provided
    // each of its other inputs is either of the group's full shape (the kernel reads it
    // reshaped to the product's) or a row broadcast along every axis but the last.
    let through_reshape = |id: NodeId, shape_of: NodeId, inputs: &[NodeId]| {
        let node = graph.node(id);
        let group_shape = &graph.node(shape_of).shape;
        if !matches!(node.op, Op::Reshape { .. }) || readers[id] != 1 || node.shape != *group_shape
        {
            return None;
        }
        let matmul = *node.args.first()?;
        let product = graph.node(matmul);
        let others_fit = inputs.iter().filter(|&&i| i != id).all(|&i| {
            let shape = &graph.node(i).shape;
            let leading_ones =
                shape.len() <= 1 || shape[..shape.len() - 1].iter().all(|d| d.is_one());
            shape == group_shape
                || (leading_ones
                    && shape
                        .last()
                        .is_none_or(|d| d.is_one() || Some(d) == group_shape.last()))
        });
        let fits = matches!(product.op, Op::MatMul)
            && product.dtype == DType::F32
            && readers[matmul] == 1
            && product.shape.len() == 2
            && product.shape.last() == group_shape.last()
            && others_fit;
        fits.then_some(matmul)
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
            } => match inputs.iter().enumerate().find_map(|(k, &i)| {
                if absorbable(i, shape_of) {
                    Some((k, i, None))
                } else {
                    through_reshape(i, shape_of, &inputs).map(|m| (k, m, Some(i)))
                }
            }) {
                Some((k, matmul, reshape)) => {
                    // The matmul becomes input 0 (the accumulator); renumber the others.
                    inputs.remove(k);
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
                    absorbed.extend(reshape);
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

/// Pairs each weight gradient `x^T @ y` (a `MatMul` kernel whose A is `Permute [1, 0]` of a
/// 2-D f32 `x`) with a bias gradient `SumTo(x)` to `[N]` or `[1, N]` (a kernel step): one
/// `Step::MatMulRowSums` where the later of the two was, provided no step between them
/// reads the earlier one's result.
pub(super) fn fuse_row_sums(graph: &Graph, mut steps: Vec<Step>) -> Vec<Step> {
    let transposed_source = |mm: NodeId| -> Option<NodeId> {
        let node = graph.node(mm);
        if !matches!(node.op, Op::MatMul) || node.dtype != DType::F32 {
            return None;
        }
        let a = graph.node(node.args[0]);
        let x = *a.args.first()?;
        let is_transpose = matches!(&a.op, Op::Permute { perm } if perm[..] == [1, 0]);
        (is_transpose && graph.node(x).shape.len() == 2).then_some(x)
    };
    let column_sum_of = |s: NodeId| -> Option<NodeId> {
        let node = graph.node(s);
        if !matches!(node.op, Op::SumTo) || node.dtype != DType::F32 {
            return None;
        }
        let x = node.args[0];
        let columns = graph.node(x).shape.get(1)?;
        let one = crate::dim::Dim::from(1usize);
        let fits = node.shape[..] == [columns.clone()] || node.shape[..] == [one, columns.clone()];
        (graph.node(x).shape.len() == 2 && fits).then_some(x)
    };
    let reads = |step: &Step, v: NodeId| -> bool {
        match step {
            Step::Kernel(id) => graph.node(*id).args.contains(&v),
            Step::Fused { inputs, .. } | Step::Rows { inputs, .. } => inputs.contains(&v),
            Step::MatMulEpilogue { matmul, inputs, .. } => {
                graph.node(*matmul).args.contains(&v) || inputs.contains(&v)
            }
            Step::MatMulRowSums { matmul, sums } => {
                graph.node(*matmul).args.contains(&v) || graph.node(*sums).args.contains(&v)
            }
        }
    };
    let mut i = 0;
    while i < steps.len() {
        let Step::Kernel(mm) = steps[i] else {
            i += 1;
            continue;
        };
        let Some(x) = transposed_source(mm) else {
            i += 1;
            continue;
        };
        let partner = steps
            .iter()
            .position(|s| matches!(s, Step::Kernel(id) if column_sum_of(*id) == Some(x)));
        let Some(j) = partner else {
            i += 1;
            continue;
        };
        let Step::Kernel(sums) = steps[j] else {
            i += 1;
            continue;
        };
        let (first, last) = (i.min(j), i.max(j));
        let earlier = if i < j { mm } else { sums };
        if steps[first + 1..last].iter().any(|s| reads(s, earlier)) {
            i += 1;
            continue;
        }
        steps[last] = Step::MatMulRowSums { matmul: mm, sums };
        steps.remove(first);
        i = first;
    }
    steps
}
