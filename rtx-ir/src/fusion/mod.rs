//! The fusion planner: turns a graph function's nodes into a schedule of kernels.
//!
//! The plan is target-independent: a `Step::Fused` lists pointwise instructions over the
//! group's inputs (each a `Pointwise` from the table below), which the macro turns into a Rust
//! loop body today and a CUDA or WGSL kernel body later; every other node is one
//! `Step::Kernel`, run by the backend's kernel for its op.
//!
//! Grouping rule: pointwise nodes of one output shape merge into the group of an argument
//! while that group is still *open*, i.e. no node outside it has read any of its values yet.
//! A group runs at the position of its last member, so a value read from outside must not be
//! needed earlier than that; closing a group at its first outside reader guarantees it.
//! Scalar constants are inlined as literals. Random ops (dropout masks) are never fused: they
//! draw from the context's seed stream in node order.
//!
//! Row groups: a reduction over the last axis with `keepdim` (`mean(x, -1)` in layer_norm,
//! the `SumTo [.., N] -> [.., 1]` and `MeanGrad` of its backward) joins the open group it reads
//! from, or starts one. Such a group computes per row of its *wide* shape `[.., N]`: pointwise
//! values of shape `[.., N]` or `[.., 1]` (row scalars) and the row reductions between them,
//! one pass over the row per reduction plus one to write the outputs (`Step::Rows`). So
//! layer_norm, forward and backward, runs as one kernel per row instead of four.

mod epilogue;
mod rows;

pub use rows::{RowInstr, RowReduce};

use crate::graph::{Graph, NodeId};
use crate::op::{Cmp, DType, Op};
use epilogue::fuse_epilogues;
use rows::{RowRole, narrow_of, row_role, rows_step};

/// One pointwise operation of the fused-kernel table: what a backend must emit for it. The
/// CPU meaning of each is a function of the same name in `rtx_backends::cpu::scalar`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pointwise {
    /// `x` (a `StopGradient`: the identity in the forward pass).
    Identity,
    /// `x` rounded to the call's precision (`Op::Autocast`); its scalar function takes the
    /// call's `AutocastMode` as a second argument.
    Autocast,
    /// `g` rounded at the call's precision and loss scale (`Op::AutocastGrad`); likewise.
    AutocastGrad,
    Neg,
    Relu,
    Gelu,
    GeluTanh,
    Tanh,
    Sin,
    Cos,
    Sigmoid,
    Exp,
    Log,
    Sqrt,
    /// `x.powf(exponent)`.
    Pow(f64),
    Add,
    Sub,
    Mul,
    Div,
    /// `(x, g) -> g * (x > 0)`.
    ReluGrad,
    /// `(x, g) -> g * gelu'(x)`.
    GeluGrad,
    GeluTanhGrad,
    Maximum,
    Minimum,
    /// `(a, b) -> 1.0 if the comparison holds else 0.0`.
    Compare(Cmp),
    /// `(cond, a, b) -> a if cond != 0 else b`.
    Select,
}

impl Pointwise {
    /// The table: the ops a fused kernel can evaluate one element at a time.
    pub fn of(op: &Op) -> Option<Pointwise> {
        Some(match op {
            Op::StopGradient => Pointwise::Identity,
            Op::Autocast => Pointwise::Autocast,
            Op::AutocastGrad => Pointwise::AutocastGrad,
            Op::Neg => Pointwise::Neg,
            Op::Relu => Pointwise::Relu,
            Op::Gelu => Pointwise::Gelu,
            Op::GeluTanh => Pointwise::GeluTanh,
            Op::Tanh => Pointwise::Tanh,
            Op::Sin => Pointwise::Sin,
            Op::Cos => Pointwise::Cos,
            Op::Sigmoid => Pointwise::Sigmoid,
            Op::Exp => Pointwise::Exp,
            Op::Log => Pointwise::Log,
            Op::Sqrt => Pointwise::Sqrt,
            Op::PowScalar { exponent } => Pointwise::Pow(*exponent),
            Op::Add => Pointwise::Add,
            Op::Sub => Pointwise::Sub,
            Op::Mul => Pointwise::Mul,
            Op::Div => Pointwise::Div,
            Op::ReluGrad => Pointwise::ReluGrad,
            Op::GeluGrad => Pointwise::GeluGrad,
            Op::GeluTanhGrad => Pointwise::GeluTanhGrad,
            Op::Maximum => Pointwise::Maximum,
            Op::Minimum => Pointwise::Minimum,
            Op::Compare { cmp } => Pointwise::Compare(*cmp),
            Op::Select => Pointwise::Select,
            _ => return None,
        })
    }

    /// Name of the scalar function that implements it on every target.
    pub fn name(self) -> &'static str {
        match self {
            Pointwise::Identity => "identity",
            Pointwise::Autocast => "autocast",
            Pointwise::AutocastGrad => "autocast_grad",
            Pointwise::Neg => "neg",
            Pointwise::Relu => "relu",
            Pointwise::Gelu => "gelu",
            Pointwise::GeluTanh => "gelu_tanh",
            Pointwise::Tanh => "tanh",
            Pointwise::Sin => "sin",
            Pointwise::Cos => "cos",
            Pointwise::Sigmoid => "sigmoid",
            Pointwise::Exp => "exp",
            Pointwise::Log => "log",
            Pointwise::Sqrt => "sqrt",
            Pointwise::Pow(_) => "pow",
            Pointwise::Add => "add",
            Pointwise::Sub => "sub",
            Pointwise::Mul => "mul",
            Pointwise::Div => "div",
            Pointwise::ReluGrad => "relu_grad",
            Pointwise::GeluGrad => "gelu_grad",
            Pointwise::GeluTanhGrad => "gelu_tanh_grad",
            Pointwise::Maximum => "maximum",
            Pointwise::Minimum => "minimum",
            Pointwise::Compare(Cmp::Gt) => "gt",
            Pointwise::Compare(Cmp::Ge) => "ge",
            Pointwise::Compare(Cmp::Lt) => "lt",
            Pointwise::Compare(Cmp::Le) => "le",
            Pointwise::Compare(Cmp::Eq) => "eq",
            Pointwise::Compare(Cmp::Ne) => "ne",
            Pointwise::Select => "select",
        }
    }
}

/// An operand of a fused instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    /// The `i`-th input of the group, broadcast to the group's shape.
    Input(usize),
    /// The result of an earlier instruction of the group, by its node.
    Node(NodeId),
    /// A scalar constant, inlined.
    Const(f64),
    /// The length of the row (the last axis of the wide shape), in a `Step::Rows` group.
    RowLen,
}

/// One instruction of a fused group: `node = op(args)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    pub node: NodeId,
    pub op: Pointwise,
    pub args: Vec<Operand>,
}

/// A group that only rounds one value to the call's precision (`Autocast` of a weight or of
/// a value with other readers, `AutocastGrad` of a gradient): at f32 its output is its input,
/// and the compiled code passes the tensor on instead of copying it.
pub fn rounding_only(body: &[Instr], inputs: &[NodeId], outputs: &[NodeId]) -> bool {
    inputs.len() == 1
        && outputs.len() == 1
        && body
            .iter()
            .all(|i| matches!(i.op, Pointwise::Autocast | Pointwise::AutocastGrad))
}

impl Step {
    /// Whether this is a [`rounding_only`] pointwise group.
    pub fn only_rounds(&self) -> bool {
        match self {
            Step::Fused {
                inputs,
                body,
                outputs,
                ..
            } => rounding_only(body, inputs, outputs),
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// One node run by its own kernel.
    Kernel(NodeId),
    /// Pointwise nodes computed in one pass over the group's shape (the shape of `shape_of`):
    /// reads `inputs` once, writes `outputs` once, keeps everything else in registers.
    Fused {
        shape_of: NodeId,
        inputs: Vec<NodeId>,
        body: Vec<Instr>,
        outputs: Vec<NodeId>,
    },
    /// A matmul whose only reader is a pointwise group of its shape, or a reshape of it that
    /// only such a group reads (`shape_of` then has the group's shape, of the same elements
    /// in the same order): the group's body runs on each tile of the product while it is in
    /// cache (`inputs[0]` is the matmul, read from the accumulator; the other inputs are read
    /// at the same position).
    MatMulEpilogue {
        matmul: NodeId,
        shape_of: NodeId,
        inputs: Vec<NodeId>,
        body: Vec<Instr>,
        outputs: Vec<NodeId>,
    },
    /// A weight gradient `x^T @ y` (`matmul`, whose A is a transpose of the 2-D `x`) and a
    /// bias gradient summing `x` over its first axis (`sums`, a `SumTo` to `[N]` or `[1, N]`)
    /// in one GEMM: the sums are the rows of A, added up as the GEMM packs them.
    MatMulRowSums { matmul: NodeId, sums: NodeId },
    /// A row group (see the module docs): `shape_of` has the wide shape; each output is wide
    /// or a row scalar (its shape tells which).
    Rows {
        shape_of: NodeId,
        inputs: Vec<NodeId>,
        body: Vec<RowInstr>,
        outputs: Vec<NodeId>,
    },
}

/// The schedule of nodes `0..upto` of `graph`, where `roots` (the function's results) must
/// be materialized. Leaves (inputs, parameters, constants) get no step.
pub fn plan(graph: &Graph, upto: usize, roots: &[NodeId]) -> Vec<Step> {
    let upto = upto.min(graph.len());
    // group[n]: the group a fusible node joined; groups[g]: its members in order, and whether
    // something outside has read it already.
    let mut group: Vec<Option<usize>> = vec![None; upto];
    let mut members: Vec<Vec<NodeId>> = Vec::new();
    let mut closed: Vec<bool> = Vec::new();
    // The wide shape of a row group; `None` for a plain pointwise group.
    let mut wide: Vec<Option<Vec<crate::dim::Dim>>> = Vec::new();
    for id in 0..upto {
        let node = graph.node(id);
        let pointwise = Pointwise::of(&node.op).is_some() && node.dtype == DType::F32;
        let role = if pointwise { None } else { row_role(graph, id) };
        // The wide shape this node would give a group it starts or turns into a row group.
        let own_wide = match role {
            Some(RowRole::Reduce(_)) => Some(graph.node(node.args[0]).shape.clone()),
            Some(RowRole::Spread) => Some(node.shape.clone()),
            None => None,
        };
        let open = |a: NodeId| -> Option<usize> {
            let g = group.get(a).copied().flatten()?;
            (!closed[g]).then_some(g)
        };
        let mut joined = None;
        if pointwise {
            joined = node.args.iter().find_map(|&a| {
                let g = open(a)?;
                let fits = match &wide[g] {
                    None => graph.node(a).shape == node.shape,
                    Some(w) => node.shape == *w || node.shape == narrow_of(w),
                };
                fits.then_some(g)
            });
        } else if let (Some(role), Some(w)) = (role, &own_wide) {
            // A reduction joins the group of its wide argument; a spread that of its gradient.
            let a = match role {
                RowRole::Reduce(_) => node.args[0],
                RowRole::Spread => node.args[1],
            };
            joined = open(a).filter(|&g| match &wide[g] {
                None => role != RowRole::Spread && graph.node(a).shape == *w,
                Some(gw) => gw == w,
            });
        }
        // Every group this node reads from, other than its own, now has an outside reader.
        for &a in &node.args {
            if let Some(g) = group.get(a).copied().flatten()
                && Some(g) != joined
            {
                closed[g] = true;
            }
        }
        if pointwise || role.is_some() {
            let g = joined.unwrap_or_else(|| {
                members.push(Vec::new());
                closed.push(false);
                wide.push(None);
                members.len() - 1
            });
            if role.is_some() {
                wide[g] = own_wide;
            }
            group[id] = Some(g);
            members[g].push(id);
        }
    }

    let mut read_outside = vec![false; upto];
    for id in 0..upto {
        for &a in &graph.node(id).args {
            if a < upto && group[a].is_some() && group[a] != group[id] {
                read_outside[a] = true;
            }
        }
    }
    for &r in roots {
        if r < upto {
            read_outside[r] = true;
        }
    }

    let mut steps = Vec::new();
    for id in 0..upto {
        let node = graph.node(id);
        match group[id] {
            None if matches!(
                node.op,
                Op::Input { .. } | Op::Param { .. } | Op::Const { .. }
            ) => {}
            None => steps.push(Step::Kernel(id)),
            Some(g) if members[g].last() == Some(&id) => {
                steps.push(match &wide[g] {
                    None => fused_step(graph, &members[g], &group, &read_outside),
                    Some(w) => rows_step(graph, &members[g], w, &group, &read_outside),
                });
            }
            Some(_) => {}
        }
    }
    let steps = fuse_epilogues(graph, steps, roots);
    epilogue::fuse_row_sums(graph, steps)
}

/// The operands of one group's instructions: the group's own members by node, scalar
/// constants inlined, everything else as an input of the group, numbered in first-use order.
pub(crate) struct Operands<'a> {
    graph: &'a Graph,
    group: &'a [Option<usize>],
    own: Option<usize>,
    pub(crate) inputs: Vec<NodeId>,
}

impl<'a> Operands<'a> {
    pub(crate) fn new(graph: &'a Graph, group: &'a [Option<usize>], first: NodeId) -> Self {
        Operands {
            graph,
            group,
            own: group[first],
            inputs: Vec::new(),
        }
    }

    pub(crate) fn of(&mut self, a: NodeId) -> Operand {
        if self.own.is_some() && self.group.get(a).copied().flatten() == self.own {
            return Operand::Node(a);
        }
        if let Op::Const { value } = self.graph.node(a).op {
            return Operand::Const(value);
        }
        let i = self.inputs.iter().position(|&x| x == a).unwrap_or_else(|| {
            self.inputs.push(a);
            self.inputs.len() - 1
        });
        Operand::Input(i)
    }
}

/// The members of a group that its step must write: those read outside it, and the last.
pub(crate) fn group_outputs(members: &[NodeId], read_outside: &[bool]) -> Vec<NodeId> {
    let last = *members.last().unwrap_or(&members[0]);
    members
        .iter()
        .copied()
        .filter(|&m| read_outside[m] || m == last)
        .collect()
}

fn fused_step(
    graph: &Graph,
    members: &[NodeId],
    group: &[Option<usize>],
    read_outside: &[bool],
) -> Step {
    let mut operands = Operands::new(graph, group, members[0]);
    let mut body = Vec::with_capacity(members.len());
    for &m in members {
        let node = graph.node(m);
        let args = node.args.iter().map(|&a| operands.of(a)).collect();
        body.push(Instr {
            node: m,
            // Members are fusible by construction.
            op: Pointwise::of(&node.op).unwrap_or(Pointwise::Neg),
            args,
        });
    }
    Step::Fused {
        shape_of: *members.last().unwrap_or(&members[0]),
        inputs: operands.inputs,
        body,
        outputs: group_outputs(members, read_outside),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dim::Dim;
    use crate::infer::Unifier;

    fn input(g: &mut Graph, u: &mut Unifier, index: usize, shape: &[usize]) -> NodeId {
        let shape = shape.iter().map(|&d| Dim::known(d)).collect();
        g.push(
            Op::Input {
                index,
                name: format!("x{index}"),
                shape,
                dtype: DType::F32,
            },
            &[],
            u,
        )
        .unwrap()
    }

    #[test]
    fn a_pointwise_chain_is_one_step() {
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[4, 3]);
        let b = input(&mut g, &mut u, 1, &[3]);
        let c = g.push(Op::Const { value: 2.0 }, &[], &mut u).unwrap();
        let s = g.push(Op::Add, &[x, b], &mut u).unwrap();
        let r = g.push(Op::Relu, &[s], &mut u).unwrap();
        let m = g.push(Op::Mul, &[r, c], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[m]);

        assert_eq!(steps.len(), 1, "{steps:?}");
        let Step::Fused {
            inputs,
            body,
            outputs,
            ..
        } = &steps[0]
        else {
            panic!("expected a fused step: {steps:?}");
        };
        assert_eq!(inputs, &[x, b]);
        assert_eq!(body.len(), 3);
        assert_eq!(body[2].args, vec![Operand::Node(r), Operand::Const(2.0)]);
        assert_eq!(outputs, &[m]);
    }

    #[test]
    fn a_value_read_outside_the_group_is_an_output() {
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[2, 2]);
        let e = g.push(Op::Exp, &[x], &mut u).unwrap();
        let n = g.push(Op::Neg, &[e], &mut u).unwrap();
        let mm = g.push(Op::MatMul, &[e, x], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[n, mm]);

        let Step::Fused { outputs, .. } = &steps[0] else {
            panic!("{steps:?}");
        };
        assert_eq!(outputs, &[e, n]);
        assert_eq!(steps[1], Step::Kernel(mm));
    }

    #[test]
    fn a_group_read_from_outside_takes_no_more_members() {
        // t = exp(x); m = t @ x; y = t + m: y must not join t's group, which has to run
        // before the matmul that y reads.
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[2, 2]);
        let t = g.push(Op::Exp, &[x], &mut u).unwrap();
        let m = g.push(Op::MatMul, &[t, x], &mut u).unwrap();
        let y = g.push(Op::Add, &[t, m], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[y]);

        // y's group is the matmul's only reader, so it runs as the matmul's epilogue.
        assert_eq!(steps.len(), 2, "{steps:?}");
        assert!(matches!(&steps[0], Step::Fused { outputs, .. } if outputs == &[t]));
        assert!(matches!(
            &steps[1],
            Step::MatMulEpilogue { matmul, inputs, .. } if *matmul == m && inputs == &[m, t]
        ));
    }

    #[test]
    fn a_group_reading_a_reshaped_product_runs_as_its_epilogue() {
        // m = x @ w : [6, 4]; r = reshape(m) to [2, 3, 4]; y = r * v + b (v of the group's
        // shape, b a row): the reshape moves no element, so y runs on m's tiles.
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[6, 5]);
        let w = input(&mut g, &mut u, 1, &[5, 4]);
        let v = input(&mut g, &mut u, 2, &[2, 3, 4]);
        let b = input(&mut g, &mut u, 3, &[4]);
        let m = g.push(Op::MatMul, &[x, w], &mut u).unwrap();
        let shape = [2, 3, 4].iter().map(|&d| Dim::known(d)).collect();
        let r = g.push(Op::Reshape { shape }, &[m], &mut u).unwrap();
        let p = g.push(Op::Mul, &[r, v], &mut u).unwrap();
        let y = g.push(Op::Add, &[p, b], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[y]);

        assert_eq!(steps.len(), 1, "{steps:?}");
        assert!(matches!(
            &steps[0],
            Step::MatMulEpilogue { matmul, inputs, shape_of, .. }
                if *matmul == m && inputs[0] == m && g.node(*shape_of).shape == g.node(r).shape
        ));
    }

    #[test]
    fn a_reshaped_product_with_an_operand_broadcast_over_leading_axes_keeps_its_kernel() {
        // v : [3, 4] broadcasts over the first axis of [2, 3, 4], which the product's
        // [6, 4] rows cannot express as a stride: the reshape stays a kernel.
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[6, 5]);
        let w = input(&mut g, &mut u, 1, &[5, 4]);
        let v = input(&mut g, &mut u, 2, &[3, 4]);
        let m = g.push(Op::MatMul, &[x, w], &mut u).unwrap();
        let shape = [2, 3, 4].iter().map(|&d| Dim::known(d)).collect();
        let r = g.push(Op::Reshape { shape }, &[m], &mut u).unwrap();
        let y = g.push(Op::Mul, &[r, v], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[y]);

        assert!(steps.contains(&Step::Kernel(m)), "{steps:?}");
        assert!(steps.contains(&Step::Kernel(r)), "{steps:?}");
    }

    #[test]
    fn a_matmul_read_elsewhere_keeps_its_own_kernel() {
        // m = x @ x feeds both a pointwise group and the result: it must be materialized.
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[2, 2]);
        let m = g.push(Op::MatMul, &[x, x], &mut u).unwrap();
        let r = g.push(Op::Relu, &[m], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[r, m]);

        assert_eq!(steps[0], Step::Kernel(m));
        assert!(matches!(&steps[1], Step::Fused { .. }));
    }

    #[test]
    fn random_ops_are_kernels() {
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = input(&mut g, &mut u, 0, &[8]);
        let mask = g.push(Op::DropoutMask { p: 0.5 }, &[x], &mut u).unwrap();
        let y = g.push(Op::Mul, &[x, mask], &mut u).unwrap();

        let steps = plan(&g, g.len(), &[y]);

        assert_eq!(steps[0], Step::Kernel(mask));
        assert!(matches!(&steps[1], Step::Fused { inputs, .. } if inputs == &[x, mask]));
    }
}
