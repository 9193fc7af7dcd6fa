//! The graph IR: a list of nodes in topological order, each an op over earlier nodes.
//!
//! One `GraphFn` holds a graph function's forward nodes and, for functions with a scalar
//! output, the backward nodes the compiler derived, appended after them. A `ModelIr` is what
//! `Model::graph()` returns: every graph function of a model, serialized as versioned JSON.

use crate::infer::{ShapeError, Unifier, fmt_shape, infer};
use crate::op::{DType, Op, Shape};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

pub type NodeId = usize;

/// Bumped whenever the serialized form changes incompatibly.
pub const IR_VERSION: u32 = 3;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub args: Vec<NodeId>,
    pub shape: Shape,
    pub dtype: DType,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub nodes: Vec<Node>,
}

impl Graph {
    /// Appends `op(args)` after checking its shape rule.
    pub fn push(&mut self, op: Op, args: &[NodeId], u: &mut Unifier) -> Result<NodeId, ShapeError> {
        // Rounding twice to one precision is rounding once: an operand that is already the
        // rounded result of a product (q, k, v from their Linear layers) is not rounded again.
        if matches!(op, Op::Autocast | Op::AutocastGrad)
            && let [a] = args
            && self.nodes.get(*a).is_some_and(|n| n.op == op)
        {
            return Ok(*a);
        }
        let arg_info: Vec<(&Shape, DType)> = args
            .iter()
            .map(|&a| (&self.nodes[a].shape, self.nodes[a].dtype))
            .collect();
        let (shape, dtype) = infer(&op, &arg_info, u)?;
        self.nodes.push(Node {
            op,
            args: args.to_vec(),
            shape,
            dtype,
        });
        Ok(self.nodes.len() - 1)
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Finds an identical earlier node (same op, same args) so repeated sub-expressions and
    /// repeated parameter reads share one value. Random ops never match: two `dropout` calls
    /// on one value draw two masks.
    pub fn find(&self, op: &Op, args: &[NodeId]) -> Option<NodeId> {
        if op.is_random() {
            return None;
        }
        self.nodes
            .iter()
            .position(|n| &n.op == op && n.args == args)
    }

    /// Like `push`, but returns an existing identical node instead of adding a copy.
    pub fn push_shared(
        &mut self,
        op: Op,
        args: &[NodeId],
        u: &mut Unifier,
    ) -> Result<NodeId, ShapeError> {
        if let Some(id) = self.find(&op, args) {
            return Ok(id);
        }
        self.push(op, args, u)
    }
}

/// A gradient the backward pass produces: for a parameter (by dotted name) or an input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GradOf {
    pub leaf: NodeId,
    /// None when the output does not depend on the leaf (its gradient is zero).
    pub grad: Option<NodeId>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphFn {
    pub name: String,
    /// Symbolic dimensions bound from the inputs at run time, in declaration order.
    pub symbols: Vec<String>,
    pub graph: Graph,
    pub output: NodeId,
    /// Nodes `0..forward_len` are the forward pass; the rest is the derived backward pass.
    pub forward_len: usize,
    /// Gradients of the (scalar) output with respect to every float leaf, when derived.
    pub grads: Vec<GradOf>,
}

impl GraphFn {
    /// Dead-code elimination: keeps the output, the gradients and what they read, plus every
    /// input and parameter leaf (inputs are bound and checked even when unused); renumbers
    /// the survivors in their order, so the graph stays topologically sorted.
    pub fn remove_dead_nodes(&mut self) {
        let n = self.graph.len();
        let mut live = vec![false; n];
        let mut stack: Vec<NodeId> = vec![self.output];
        stack.extend(self.grads.iter().filter_map(|g| g.grad));
        for (i, node) in self.graph.nodes.iter().enumerate() {
            if matches!(node.op, Op::Input { .. } | Op::Param { .. }) {
                stack.push(i);
            }
        }
        while let Some(id) = stack.pop() {
            if id >= n || live[id] {
                continue;
            }
            live[id] = true;
            stack.extend(&self.graph.nodes[id].args);
        }
        let mut new_id = vec![usize::MAX; n];
        let mut kept = Vec::with_capacity(n);
        for (i, node) in std::mem::take(&mut self.graph.nodes)
            .into_iter()
            .enumerate()
        {
            if live[i] {
                new_id[i] = kept.len();
                let mut node = node;
                for a in &mut node.args {
                    *a = new_id[*a];
                }
                kept.push(node);
            }
        }
        self.forward_len = live[..self.forward_len.min(n)]
            .iter()
            .filter(|&&l| l)
            .count();
        self.output = new_id[self.output];
        for g in &mut self.grads {
            g.leaf = new_id[g.leaf];
            g.grad = g.grad.map(|id| new_id[id]);
        }
        self.graph.nodes = kept;
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelIr {
    pub version: u32,
    pub model: String,
    pub functions: Vec<GraphFn>,
}

impl ModelIr {
    pub fn function(&self, name: &str) -> Option<&GraphFn> {
        self.functions.iter().find(|f| f.name == name)
    }

    pub fn to_json(&self) -> Result<String, String> {
        serde_json::to_string(self).map_err(|e| format!("cannot serialize model IR: {e}"))
    }

    pub fn from_json(s: &str) -> Result<ModelIr, String> {
        let ir: ModelIr = serde_json::from_str(s).map_err(|e| format!("invalid model IR: {e}"))?;
        if ir.version != IR_VERSION {
            return Err(format!(
                "model IR version {} is not supported (this build reads version {IR_VERSION})",
                ir.version
            ));
        }
        ir.validate()?;
        Ok(ir)
    }

    /// Structural checks a hand-edited or corrupt file can fail, so that executing it can only
    /// fail with an error, never index out of bounds: arguments come before their node, arity
    /// matches the op table, and outputs and gradients name existing nodes.
    pub fn validate(&self) -> Result<(), String> {
        for f in &self.functions {
            let n = f.graph.len();
            for (i, node) in f.graph.nodes.iter().enumerate() {
                if let Some(&a) = node.args.iter().find(|&&a| a >= i) {
                    return Err(format!(
                        "function `{}`: node %{i} uses %{a}, which does not come before it",
                        f.name
                    ));
                }
                let arity = node.op.def().arity;
                let arity_ok = if arity == usize::MAX {
                    !node.args.is_empty()
                } else {
                    node.args.len() == arity
                };
                if !arity_ok {
                    return Err(format!(
                        "function `{}`: node %{i} ({}) has {} argument(s)",
                        f.name,
                        node.op.name(),
                        node.args.len()
                    ));
                }
            }
            let in_range = |id: NodeId| id < n;
            let grads_ok = f
                .grads
                .iter()
                .all(|g| in_range(g.leaf) && g.grad.is_none_or(in_range));
            if !in_range(f.output) || f.forward_len > n || !grads_ok {
                return Err(format!(
                    "function `{}`: output, forward length or a gradient names a node outside 0..{n}",
                    f.name
                ));
            }
        }
        Ok(())
    }

    /// A readable listing: one line per node, `%3 = matmul(%1, %2) : [B, 128]`.
    pub fn to_text(&self) -> String {
        let mut s = format!("model {} (IR v{})\n", self.model, self.version);
        for f in &self.functions {
            let _ = writeln!(s, "fn {}<{}>:", f.name, f.symbols.join(", "));
            for (i, n) in f.graph.nodes.iter().enumerate() {
                if i == f.forward_len {
                    let _ = writeln!(s, "  -- backward --");
                }
                let _ = writeln!(s, "  %{i} = {} : {}", describe(n), fmt_shape(&n.shape));
            }
            let _ = writeln!(s, "  return %{}", f.output);
            for g in &f.grads {
                let leaf = describe(f.graph.node(g.leaf));
                match g.grad {
                    Some(id) => {
                        let _ = writeln!(s, "  grad {leaf} = %{id}");
                    }
                    None => {
                        let _ = writeln!(s, "  grad {leaf} = 0");
                    }
                }
            }
        }
        s
    }

    /// Graphviz DOT: one cluster per function, backward nodes shaded.
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph model {\n  node [shape=box, fontname=monospace];\n");
        for (fi, f) in self.functions.iter().enumerate() {
            let _ = writeln!(s, "  subgraph cluster_{fi} {{\n    label=\"{}\";", f.name);
            for (i, n) in f.graph.nodes.iter().enumerate() {
                let style = if i >= f.forward_len {
                    ", style=filled, fillcolor=lightgrey"
                } else {
                    ""
                };
                let label = format!(
                    "{}\\n{}",
                    describe(n).replace('"', "'"),
                    fmt_shape(&n.shape)
                );
                let _ = writeln!(s, "    f{fi}n{i} [label=\"%{i} {label}\"{style}];");
                for a in &n.args {
                    let _ = writeln!(s, "    f{fi}n{a} -> f{fi}n{i};");
                }
            }
            s.push_str("  }\n");
        }
        s.push_str("}\n");
        s
    }
}

fn describe(n: &Node) -> String {
    let args: Vec<String> = n.args.iter().map(|a| format!("%{a}")).collect();
    let attrs = match &n.op {
        Op::Input { name, index, .. } => return format!("input {index} `{name}`"),
        Op::Param { name, .. } => return format!("param `{name}`"),
        Op::Const { value } => return format!("const {value}"),
        Op::PowScalar { exponent } => format!(" ^{exponent}"),
        Op::Sum { axes, keepdim }
        | Op::Mean { axes, keepdim }
        | Op::Max { axes, keepdim }
        | Op::MaxGrad { axes, keepdim }
        | Op::MeanGrad { axes, keepdim } => {
            format!(" axes={axes:?}{}", if *keepdim { " keepdim" } else { "" })
        }
        Op::Concat { axis } => {
            format!(" axis={axis}")
        }
        Op::Conv2d { stride, padding }
        | Op::Conv2dGradInput { stride, padding }
        | Op::Conv2dGradWeight { stride, padding } => {
            format!(" stride={stride:?} padding={padding:?}")
        }
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        }
        | Op::AvgPool2d {
            kernel,
            stride,
            padding,
        }
        | Op::MaxPool2dGrad {
            kernel,
            stride,
            padding,
        }
        | Op::AvgPool2dGrad {
            kernel,
            stride,
            padding,
        } => {
            format!(" kernel={kernel:?} stride={stride:?} padding={padding:?}")
        }
        Op::Reshape { shape } => format!(" to {}", fmt_shape(shape)),
        Op::Permute { perm } => format!(" {perm:?}"),
        Op::Narrow { axis, start, len } => format!(" axis={axis} {start}..{}", start + len),
        Op::PadNarrow { axis, start } => format!(" axis={axis} at {start}"),
        Op::ConcatGrad { axis, index } => format!(" axis={axis} part={index}"),
        Op::DropoutMask { p } => format!(" p={p}"),
        Op::Iota { axis } | Op::ArgMax { axis } | Op::Positions { axis } => {
            format!(" axis={axis}")
        }
        Op::Compare { cmp } => format!(" {}", cmp.symbol()),
        Op::TopK { k } | Op::TopKIndices { k } | Op::TopKGrad { k } => format!(" k={k}"),
        Op::Attention { causal } | Op::AttentionGrad { causal } if *causal => " causal".into(),
        _ => String::new(),
    };
    format!("{}({}){attrs}", n.op.name(), args.join(", "))
}
