//! Reverse-mode differentiation on the IR, run by the macro at compile time.
//!
//! `differentiate` appends the backward pass to a forward graph: one vector-Jacobian rule per
//! op, in `vjp`, which reads like a table of textbook derivatives. Gradients reaching a node
//! along several paths are summed; gradients of broadcast operands are summed back to the
//! operand's shape (`SumTo`).

use crate::dim::Dim;
use crate::graph::{GradOf, Graph, NodeId};
use crate::infer::{ShapeError, Unifier};
use crate::op::{Cmp, DType, Op};

/// Appends the backward pass of scalar node `output` and returns the gradient of each leaf in
/// `wrt` (parameters, and inputs the user asked for), in the order given.
///
/// The vector-Jacobian rules build the gradient of every argument of every op, including
/// ones nobody reads (the data input, a dropout mask); `remove_dead_nodes` drops them after.
pub fn differentiate(
    graph: &mut Graph,
    output: NodeId,
    wrt: &[NodeId],
) -> Result<Vec<GradOf>, String> {
    if !graph.node(output).shape.is_empty() {
        return Err(format!(
            "only a scalar output can be differentiated, this one has shape {}",
            crate::infer::fmt_shape(&graph.node(output).shape)
        ));
    }
    let forward_len = graph.len();
    // Only nodes on a path from a `wrt` leaf to the output carry a gradient.
    let mut needs = vec![false; forward_len];
    for &leaf in wrt {
        if leaf < forward_len && graph.node(leaf).dtype == DType::F32 {
            needs[leaf] = true;
        }
    }
    for id in 0..forward_len {
        let n = graph.node(id);
        if !n.op.is_random() && n.args.iter().any(|&a| needs[a]) {
            needs[id] = true;
        }
    }
    let mut u = Unifier::default();
    let mut grads: Vec<Option<NodeId>> = vec![None; forward_len];
    grads[output] = Some(
        graph
            .push(Op::Const { value: 1.0 }, &[], &mut u)
            .map_err(|e| e.to_string())?,
    );
    for id in (0..forward_len).rev() {
        let Some(g) = grads[id] else { continue };
        if !needs[id] {
            continue;
        }
        let arg_grads =
            vjp(graph, id, g, &mut u).map_err(|e| format!("while differentiating %{id}: {e}"))?;
        let args = graph.node(id).args.clone();
        for (arg, ag) in args.into_iter().zip(arg_grads) {
            let Some(ag) = ag else { continue };
            if !needs[arg] {
                continue;
            }
            grads[arg] = Some(match grads[arg] {
                None => ag,
                Some(prev) => graph
                    .push(Op::Add, &[prev, ag], &mut u)
                    .map_err(|e| e.to_string())?,
            });
        }
    }
    Ok(wrt
        .iter()
        .map(|&leaf| GradOf {
            leaf,
            grad: grads.get(leaf).copied().flatten(),
        })
        .collect())
}

/// Every float parameter and input of the forward graph: what `differentiate` takes when
/// all gradients are wanted (tests, the IR executor).
pub fn float_leaves(graph: &Graph) -> Vec<NodeId> {
    (0..graph.len())
        .filter(|&i| {
            let n = graph.node(i);
            matches!(n.op, Op::Param { .. } | Op::Input { .. }) && n.dtype == DType::F32
        })
        .collect()
}

/// Builds nodes while differentiating; every node built here passed its shape rule.
struct B<'a> {
    g: &'a mut Graph,
    u: &'a mut Unifier,
}

impl B<'_> {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError> {
        self.g.push(op, args, self.u)
    }
    fn c(&mut self, v: f64) -> Result<NodeId, ShapeError> {
        self.g.push_shared(Op::Const { value: v }, &[], self.u)
    }
    fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, ShapeError> {
        self.op(Op::Mul, &[a, b])
    }
    fn div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, ShapeError> {
        self.op(Op::Div, &[a, b])
    }
    fn neg(&mut self, a: NodeId) -> Result<NodeId, ShapeError> {
        self.op(Op::Neg, &[a])
    }
    /// `g` summed down to the shape of `like`, skipped when the shapes already agree.
    fn sum_to(&mut self, g: NodeId, like: NodeId) -> Result<NodeId, ShapeError> {
        if self.g.node(g).shape == self.g.node(like).shape {
            Ok(g)
        } else {
            self.op(Op::SumTo, &[g, like])
        }
    }
    /// Swaps the last two axes.
    fn transpose_last(&mut self, a: NodeId) -> Result<NodeId, ShapeError> {
        let r = self.g.node(a).shape.len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.op(Op::Permute { perm }, &[a])
    }
}

/// The gradient of each argument of node `id`, given the gradient `g` of its output.
fn vjp(
    graph: &mut Graph,
    id: NodeId,
    g: NodeId,
    u: &mut Unifier,
) -> Result<Vec<Option<NodeId>>, String> {
    let node = graph.node(id).clone();
    let x = |i: usize| node.args[i];
    let y = id;
    let mut b = B { g: graph, u };
    let e = |e: ShapeError| e.to_string();
    let one = |v: NodeId| Ok::<_, String>(vec![Some(v)]);
    match &node.op {
        // Iota depends on its argument's shape only, ArgMax is piecewise constant (an index):
        // no gradient flows through either.
        Op::Input { .. }
        | Op::Param { .. }
        | Op::Const { .. }
        | Op::DropoutMask { .. }
        | Op::Iota { .. }
        | Op::Positions { .. }
        | Op::ArgMax { .. }
        | Op::TopKIndices { .. } => Ok(vec![None; node.args.len()]),
        Op::TopK { k } => one(b.op(Op::TopKGrad { k: *k }, &[x(0), g]).map_err(e)?),
        // A parameter's gradient is kept in f32, as the GEMM accumulated it (Megatron-LM's
        // fused weight-gradient accumulation does the same): the master weights get every bit,
        // and the weight gradient's GEMM keeps the bias gradient's sums fused in.
        Op::Autocast if matches!(b.g.node(x(0)).op, Op::Param { .. }) => one(g),
        Op::Autocast | Op::AutocastGrad => one(b.op(Op::AutocastGrad, &[g]).map_err(e)?),
        Op::Neg => one(b.neg(g).map_err(e)?),
        // relu(x) > 0 exactly where x > 0: reading the output keeps the pre-activation from
        // being stored for the backward pass (a matmul epilogue then writes one buffer, not two).
        Op::Relu => one(b.op(Op::ReluGrad, &[y, g]).map_err(e)?),
        Op::Gelu => one(b.op(Op::GeluGrad, &[x(0), g]).map_err(e)?),
        Op::GeluTanh => one(b.op(Op::GeluTanhGrad, &[x(0), g]).map_err(e)?),
        // d tanh = 1 - y^2
        Op::Tanh => {
            let (c1, yy) = (b.c(1.0).map_err(e)?, b.mul(y, y).map_err(e)?);
            let d = b.op(Op::Sub, &[c1, yy]).map_err(e)?;
            one(b.mul(g, d).map_err(e)?)
        }
        // d sin = cos x, d cos = -sin x
        Op::Sin => {
            let d = b.op(Op::Cos, &[x(0)]).map_err(e)?;
            one(b.mul(g, d).map_err(e)?)
        }
        Op::Cos => {
            let s = b.op(Op::Sin, &[x(0)]).map_err(e)?;
            let d = b.neg(s).map_err(e)?;
            one(b.mul(g, d).map_err(e)?)
        }
        // d sigmoid = y (1 - y)
        Op::Sigmoid => {
            let c1 = b.c(1.0).map_err(e)?;
            let om = b.op(Op::Sub, &[c1, y]).map_err(e)?;
            let d = b.mul(y, om).map_err(e)?;
            one(b.mul(g, d).map_err(e)?)
        }
        Op::Exp => one(b.mul(g, y).map_err(e)?),
        Op::Log => one(b.div(g, x(0)).map_err(e)?),
        // d sqrt = 1 / (2 y)
        Op::Sqrt => {
            let c2 = b.c(2.0).map_err(e)?;
            let twice = b.mul(c2, y).map_err(e)?;
            one(b.div(g, twice).map_err(e)?)
        }
        // d x^p = p x^(p-1)
        Op::PowScalar { exponent } => {
            let p = b.c(*exponent).map_err(e)?;
            let xp = b
                .op(
                    Op::PowScalar {
                        exponent: exponent - 1.0,
                    },
                    &[x(0)],
                )
                .map_err(e)?;
            let d = b.mul(p, xp).map_err(e)?;
            one(b.mul(g, d).map_err(e)?)
        }
        Op::Add => Ok(vec![
            Some(b.sum_to(g, x(0)).map_err(e)?),
            Some(b.sum_to(g, x(1)).map_err(e)?),
        ]),
        Op::Sub => {
            let ng = b.neg(g).map_err(e)?;
            Ok(vec![
                Some(b.sum_to(g, x(0)).map_err(e)?),
                Some(b.sum_to(ng, x(1)).map_err(e)?),
            ])
        }
        Op::Mul => {
            let ga = b.mul(g, x(1)).map_err(e)?;
            let gb = b.mul(g, x(0)).map_err(e)?;
            Ok(vec![
                Some(b.sum_to(ga, x(0)).map_err(e)?),
                Some(b.sum_to(gb, x(1)).map_err(e)?),
            ])
        }
        // d(a/b)/db = -(a/b)/b = -y/b
        Op::Div => {
            let ga = b.div(g, x(1)).map_err(e)?;
            let gy = b.mul(g, y).map_err(e)?;
            let gyb = b.div(gy, x(1)).map_err(e)?;
            let gb = b.neg(gyb).map_err(e)?;
            Ok(vec![
                Some(b.sum_to(ga, x(0)).map_err(e)?),
                Some(b.sum_to(gb, x(1)).map_err(e)?),
            ])
        }
        // Ties split the gradient in half, as PyTorch does for maximum and minimum.
        Op::Maximum | Op::Minimum => {
            let (a, bb) = (x(0), x(1));
            let wins = if node.op == Op::Maximum {
                Cmp::Gt
            } else {
                Cmp::Lt
            };
            let a_wins = b.op(Op::Compare { cmp: wins }, &[a, bb]).map_err(e)?;
            let tie = b.op(Op::Compare { cmp: Cmp::Eq }, &[a, bb]).map_err(e)?;
            let half = b.c(0.5).map_err(e)?;
            let half_tie = b.mul(half, tie).map_err(e)?;
            let a_share = b.op(Op::Add, &[a_wins, half_tie]).map_err(e)?;
            let one = b.c(1.0).map_err(e)?;
            let b_share = b.op(Op::Sub, &[one, a_share]).map_err(e)?;
            let ga = b.mul(g, a_share).map_err(e)?;
            let gb = b.mul(g, b_share).map_err(e)?;
            Ok(vec![
                Some(b.sum_to(ga, a).map_err(e)?),
                Some(b.sum_to(gb, bb).map_err(e)?),
            ])
        }
        Op::Compare { .. } => Ok(vec![None, None]),
        Op::StopGradient => Ok(vec![None]),
        Op::Select => {
            let zero = b.c(0.0).map_err(e)?;
            let ga = b.op(Op::Select, &[x(0), g, zero]).map_err(e)?;
            let gb = b.op(Op::Select, &[x(0), zero, g]).map_err(e)?;
            Ok(vec![
                None,
                Some(b.sum_to(ga, x(1)).map_err(e)?),
                Some(b.sum_to(gb, x(2)).map_err(e)?),
            ])
        }
        Op::Sum { axes, keepdim } => {
            let gk = keep_dims(&mut b, g, x(0), axes, *keepdim).map_err(e)?;
            one(b.op(Op::BroadcastTo, &[gk, x(0)]).map_err(e)?)
        }
        Op::Mean { axes, keepdim } => one(b
            .op(
                Op::MeanGrad {
                    axes: axes.clone(),
                    keepdim: *keepdim,
                },
                &[x(0), g],
            )
            .map_err(e)?),
        Op::Max { axes, keepdim } => one(b
            .op(
                Op::MaxGrad {
                    axes: axes.clone(),
                    keepdim: *keepdim,
                },
                &[x(0), g],
            )
            .map_err(e)?),
        // One backward kernel gives all three gradients, stacked on a new first axis.
        Op::Attention { causal } => {
            let stacked = b
                .op(
                    Op::AttentionGrad { causal: *causal },
                    &[x(0), x(1), x(2), g],
                )
                .map_err(e)?;
            (0..3)
                .map(|i| {
                    let part = b.op(
                        Op::Narrow {
                            axis: 0,
                            start: i,
                            len: 1,
                        },
                        &[stacked],
                    )?;
                    let shape = b.g.node(x(i)).shape.clone();
                    Ok(Some(b.op(Op::Reshape { shape }, &[part])?))
                })
                .collect::<Result<Vec<_>, ShapeError>>()
                .map_err(e)
        }
        // C = A B:  dA = dC B^T,  dB = A^T dC
        Op::MatMul => {
            let bt = b.transpose_last(x(1)).map_err(e)?;
            let ga = b.op(Op::MatMul, &[g, bt]).map_err(e)?;
            let at = b.transpose_last(x(0)).map_err(e)?;
            let gb = b.op(Op::MatMul, &[at, g]).map_err(e)?;
            Ok(vec![
                Some(b.sum_to(ga, x(0)).map_err(e)?),
                Some(b.sum_to(gb, x(1)).map_err(e)?),
            ])
        }
        Op::Conv2d { stride, padding } => {
            let gx = b
                .op(
                    Op::Conv2dGradInput {
                        stride: *stride,
                        padding: *padding,
                    },
                    &[g, x(1), x(0)],
                )
                .map_err(e)?;
            let gw = b
                .op(
                    Op::Conv2dGradWeight {
                        stride: *stride,
                        padding: *padding,
                    },
                    &[x(0), g, x(1)],
                )
                .map_err(e)?;
            Ok(vec![Some(gx), Some(gw)])
        }
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        } => one(b
            .op(
                Op::MaxPool2dGrad {
                    kernel: *kernel,
                    stride: *stride,
                    padding: *padding,
                },
                &[x(0), g],
            )
            .map_err(e)?),
        Op::AvgPool2d {
            kernel,
            stride,
            padding,
        } => one(b
            .op(
                Op::AvgPool2dGrad {
                    kernel: *kernel,
                    stride: *stride,
                    padding: *padding,
                },
                &[x(0), g],
            )
            .map_err(e)?),
        Op::Pick => Ok(vec![
            Some(b.op(Op::PickGrad, &[g, x(1), x(0)]).map_err(e)?),
            None,
        ]),
        Op::Embedding => Ok(vec![
            Some(b.op(Op::EmbeddingGrad, &[g, x(1), x(0)]).map_err(e)?),
            None,
        ]),
        Op::Reshape { .. } => {
            let shape = b.g.node(x(0)).shape.clone();
            one(b.op(Op::Reshape { shape }, &[g]).map_err(e)?)
        }
        Op::Permute { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            one(b.op(Op::Permute { perm: inv }, &[g]).map_err(e)?)
        }
        // The parts are shape witnesses, so the slice bounds may be symbolic.
        Op::Concat { axis } => {
            let mut with_parts = vec![g];
            with_parts.extend(&node.args);
            (0..node.args.len())
                .map(|index| {
                    b.op(Op::ConcatGrad { axis: *axis, index }, &with_parts)
                        .map(Some)
                        .map_err(e)
                })
                .collect()
        }
        Op::Narrow { axis, start, .. } => one(b
            .op(
                Op::PadNarrow {
                    axis: *axis,
                    start: *start,
                },
                &[g, x(0)],
            )
            .map_err(e)?),
        Op::BroadcastTo => Ok(vec![Some(b.sum_to(g, x(0)).map_err(e)?), None]),
        Op::SumTo
        | Op::ReluGrad
        | Op::GeluGrad
        | Op::GeluTanhGrad
        | Op::MeanGrad { .. }
        | Op::MaxGrad { .. }
        | Op::PickGrad
        | Op::Conv2dGradInput { .. }
        | Op::Conv2dGradWeight { .. }
        | Op::MaxPool2dGrad { .. }
        | Op::AvgPool2dGrad { .. }
        | Op::PadNarrow { .. }
        | Op::ConcatGrad { .. }
        | Op::AttentionGrad { .. }
        | Op::TopKGrad { .. }
        | Op::EmbeddingGrad => Err(format!(
            "`{}` is a backward op; second derivatives are not supported",
            node.op.name()
        )),
    }
}

/// Reinserts reduced axes as size 1 so the gradient broadcasts back over them.
fn keep_dims(
    b: &mut B<'_>,
    g: NodeId,
    x: NodeId,
    axes: &[usize],
    keepdim: bool,
) -> Result<NodeId, ShapeError> {
    if keepdim {
        return Ok(g);
    }
    let shape =
        b.g.node(x)
            .shape
            .iter()
            .enumerate()
            .map(|(i, d)| {
                if axes.contains(&i) {
                    Dim::known(1)
                } else {
                    d.clone()
                }
            })
            .collect();
    b.op(Op::Reshape { shape }, &[g])
}
