//! Algebraic rewrites of a graph function with egg, forward and backward nodes together.
//!
//! The graph becomes an e-graph over `CoreLang`: arithmetic core ops are e-nodes the rules can
//! see (`add`, `sub`, `mul`, `div`, `neg`, transposes); every other op is an opaque e-node
//! named after its descriptor, so identical ops over identical arguments share one e-class
//! (common-subexpression elimination), except random ops and leaves, which get a name of
//! their own and are never merged. Scalar constants fold (`ConstFold`). After the rules run
//! under the limits of `Limits`, each result is extracted at the smallest size and the graph
//! is rebuilt, every node through its shape rule again.
//!
//! Every rule keeps shapes: rules that would replace a broadcast value by a scalar
//! (`x * 0 => 0`, `x - x => 0`) are left out.

use crate::graph::{GradOf, Graph, GraphFn, NodeId};
use crate::infer::Unifier;
use crate::op::Op;
use egg::{
    Analysis, AstSize, DidMerge, EGraph, Extractor, Id, Rewrite, Runner, Symbol, define_language,
    rewrite,
};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A scalar constant as an e-node payload: compared by bits, so it can be hashed and ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scalar(u64);

impl Scalar {
    pub fn new(v: f64) -> Scalar {
        // One zero: `x + -0.0` and `x + 0.0` are the same rewrite target.
        Scalar(if v == 0.0 { 0 } else { v.to_bits() })
    }
    pub fn value(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl FromStr for Scalar {
    type Err = std::num::ParseFloatError;
    fn from_str(s: &str) -> Result<Scalar, Self::Err> {
        s.parse::<f64>().map(Scalar::new)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value())
    }
}

define_language! {
    /// The core ops the rules reason about; everything else is `Other`.
    pub enum CoreLang {
        "add" = Add([Id; 2]),
        "sub" = Sub([Id; 2]),
        "mul" = Mul([Id; 2]),
        "div" = Div([Id; 2]),
        "neg" = Neg(Id),
        "transpose" = Transpose(Id),
        "matmul" = MatMul([Id; 2]),
        Num(Scalar),
        Other(Symbol, Vec<Id>),
    }
}

/// Constant folding: an e-class whose value is a known scalar gets that scalar as a member.
#[derive(Default)]
pub struct ConstFold;

impl Analysis<CoreLang> for ConstFold {
    type Data = Option<f64>;

    fn make(egraph: &mut EGraph<CoreLang, Self>, enode: &CoreLang, _: Id) -> Option<f64> {
        let c = |id: &Id| egraph[*id].data;
        match enode {
            CoreLang::Num(s) => Some(s.value()),
            CoreLang::Add([a, b]) => Some(c(a)? + c(b)?),
            CoreLang::Sub([a, b]) => Some(c(a)? - c(b)?),
            CoreLang::Mul([a, b]) => Some(c(a)? * c(b)?),
            CoreLang::Div([a, b]) => Some(c(a)? / c(b)?).filter(|v| v.is_finite()),
            CoreLang::Neg(a) => Some(-c(a)?),
            _ => None,
        }
    }

    fn merge(&mut self, a: &mut Option<f64>, b: Option<f64>) -> DidMerge {
        egg::merge_option(a, b, |_, _| DidMerge(false, false))
    }

    fn modify(egraph: &mut EGraph<CoreLang, Self>, id: Id) {
        if let Some(v) = egraph[id].data {
            let folded = egraph.add(CoreLang::Num(Scalar::new(v)));
            egraph.union(id, folded);
        }
    }
}

/// The rule table. Each rule has a test in `tests/rewrite.rs` that shows it fires and that
/// values stay equal on random inputs.
pub fn rules() -> Vec<Rewrite<CoreLang, ConstFold>> {
    vec![
        rewrite!("add-zero"; "(add ?a 0)" => "?a"),
        rewrite!("zero-add"; "(add 0 ?a)" => "?a"),
        rewrite!("sub-zero"; "(sub ?a 0)" => "?a"),
        rewrite!("mul-one"; "(mul ?a 1)" => "?a"),
        rewrite!("one-mul"; "(mul 1 ?a)" => "?a"),
        rewrite!("div-one"; "(div ?a 1)" => "?a"),
        rewrite!("neg-neg"; "(neg (neg ?a))" => "?a"),
        rewrite!("sub-neg"; "(sub ?a (neg ?b))" => "(add ?a ?b)"),
        rewrite!("add-neg"; "(add ?a (neg ?b))" => "(sub ?a ?b)"),
        rewrite!("neg-of-sub"; "(neg (sub ?a ?b))" => "(sub ?b ?a)"),
        rewrite!("mul-minus-one"; "(mul ?a -1)" => "(neg ?a)"),
        rewrite!("scale-twice"; "(mul (mul ?a ?c) ?d)" => "(mul ?a (mul ?c ?d))"
            if is_const("?c") if is_const("?d")),
        rewrite!("transpose-twice"; "(transpose (transpose ?a))" => "?a"),
        // (A B)^T = B^T A^T: a Linear's weight gradient, (x^T dY)^T, becomes dY^T x, which the
        // GEMM writes in the weight's own layout (it reads transposed operands while packing)
        // instead of a transposed view that must be copied with strided reads. `transpose` is
        // 2-D only, so the product and both operands are matrices.
        rewrite!("transpose-of-matmul"; "(transpose (matmul ?a ?b))" => "(matmul (transpose ?b) (transpose ?a))"),
    ]
}

/// Condition of a rule: `var` is bound to a constant. Only called from `rules()` with literal
/// variable names, so the parse cannot fail on anything a user writes.
fn is_const(var: &str) -> impl Fn(&mut EGraph<CoreLang, ConstFold>, Id, &egg::Subst) -> bool {
    let var: egg::Var = var.parse().expect("a pattern variable");
    move |egraph, _, subst| egraph[subst[var]].data.is_some()
}

/// Bounds on equality saturation, so compile time stays bounded on any model.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub nodes: usize,
    pub iterations: usize,
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            nodes: 20_000,
            iterations: 12,
            time: Duration::from_millis(50),
        }
    }
}

/// What `simplify` did, for tests and for the expansion report.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub iterations: usize,
    pub stop_reason: String,
}

/// Rewrites `f` in place with `rules()` and returns what happened. The output, every gradient
/// and every leaf (inputs, parameters) survive with the same meaning; node ids change.
pub fn simplify(f: &mut GraphFn, limits: Limits) -> Result<Report, String> {
    let n = f.graph.len();
    let mut egraph: EGraph<CoreLang, ConstFold> = EGraph::default();
    // Descriptors of opaque ops, by the name their e-nodes carry.
    let mut opaque: Vec<Op> = Vec::new();
    let mut opaque_name: HashMap<String, usize> = HashMap::new();
    let mut class = Vec::with_capacity(n);
    for (i, node) in f.graph.nodes.iter().enumerate() {
        let c = |a: &NodeId| class[*a];
        let enode = match &node.op {
            Op::Add => CoreLang::Add([c(&node.args[0]), c(&node.args[1])]),
            Op::Sub => CoreLang::Sub([c(&node.args[0]), c(&node.args[1])]),
            Op::Mul => CoreLang::Mul([c(&node.args[0]), c(&node.args[1])]),
            Op::Div => CoreLang::Div([c(&node.args[0]), c(&node.args[1])]),
            Op::Neg => CoreLang::Neg(c(&node.args[0])),
            Op::MatMul => CoreLang::MatMul([c(&node.args[0]), c(&node.args[1])]),
            Op::Permute { perm } if perm.len() == 2 && perm == &[1, 0] => {
                CoreLang::Transpose(c(&node.args[0]))
            }
            Op::Const { value } => CoreLang::Num(Scalar::new(*value)),
            op => {
                // Leaves and random ops are unique; any other op merges with its twins.
                let unique = matches!(op, Op::Input { .. } | Op::Param { .. }) || op.is_random();
                let key = if unique {
                    format!("node{i}")
                } else {
                    serde_json::to_string(op).map_err(|e| e.to_string())?
                };
                let k = *opaque_name.entry(key).or_insert_with(|| {
                    opaque.push(op.clone());
                    opaque.len() - 1
                });
                let name = Symbol::from(format!("op{k}:{}", op.name()));
                CoreLang::Other(name, node.args.iter().map(c).collect())
            }
        };
        class.push(egraph.add(enode));
    }
    let mut roots = vec![f.output];
    roots.extend(f.grads.iter().filter_map(|g| g.grad));
    let runner = Runner::default()
        .with_egraph(egraph)
        .with_node_limit(limits.nodes)
        .with_iter_limit(limits.iterations)
        .with_time_limit(limits.time)
        .run(&rules());
    let report_iterations = runner.iterations.len();
    let stop_reason = format!("{:?}", runner.stop_reason);
    let egraph = runner.egraph;
    let extractor = Extractor::new(&egraph, AstSize);

    let mut rebuild = Rebuild {
        egraph: &egraph,
        extractor: &extractor,
        opaque: &opaque,
        built: HashMap::new(),
        graph: Graph::default(),
        u: Unifier::default(),
    };
    // Leaves first, in their order: bindings and parameter checks find them all.
    let mut leaf_ids = HashMap::new();
    for (i, node) in f.graph.nodes.iter().enumerate() {
        if matches!(node.op, Op::Input { .. } | Op::Param { .. }) {
            leaf_ids.insert(i, rebuild.class(egraph.find(class[i]))?);
        }
    }
    let output = rebuild.class(egraph.find(class[f.output]))?;
    let forward_len = rebuild.graph.len();
    let mut grads = Vec::with_capacity(f.grads.len());
    for g in &f.grads {
        let leaf = *leaf_ids
            .get(&g.leaf)
            .ok_or_else(|| format!("gradient of %{}, which is not a leaf", g.leaf))?;
        let grad = match g.grad {
            Some(id) => Some(rebuild.class(egraph.find(class[id]))?),
            None => None,
        };
        grads.push(GradOf { leaf, grad });
    }
    let _ = roots;
    let nodes_after = rebuild.graph.len();
    f.graph = rebuild.graph;
    f.output = output;
    f.forward_len = forward_len;
    f.grads = grads;
    Ok(Report {
        nodes_before: n,
        nodes_after,
        iterations: report_iterations,
        stop_reason,
    })
}

/// Turns extracted e-classes back into graph nodes, each once.
struct Rebuild<'a> {
    egraph: &'a EGraph<CoreLang, ConstFold>,
    extractor: &'a Extractor<'a, AstSize, CoreLang, ConstFold>,
    opaque: &'a [Op],
    built: HashMap<Id, NodeId>,
    graph: Graph,
    u: Unifier,
}

impl Rebuild<'_> {
    fn class(&mut self, id: Id) -> Result<NodeId, String> {
        let id = self.egraph.find(id);
        if let Some(&n) = self.built.get(&id) {
            return Ok(n);
        }
        let enode = self.extractor.find_best_node(id).clone();
        let mut args = Vec::new();
        for child in egg::Language::children(&enode) {
            args.push(self.class(*child)?);
        }
        let op = match &enode {
            CoreLang::Add(_) => Op::Add,
            CoreLang::Sub(_) => Op::Sub,
            CoreLang::Mul(_) => Op::Mul,
            CoreLang::Div(_) => Op::Div,
            CoreLang::Neg(_) => Op::Neg,
            CoreLang::Transpose(_) => Op::Permute { perm: vec![1, 0] },
            CoreLang::MatMul(_) => Op::MatMul,
            CoreLang::Num(s) => Op::Const { value: s.value() },
            CoreLang::Other(name, _) => {
                let k: usize = name
                    .as_str()
                    .strip_prefix("op")
                    .and_then(|rest| rest.split(':').next())
                    .and_then(|k| k.parse().ok())
                    .ok_or_else(|| format!("unknown e-node `{name}`"))?;
                self.opaque
                    .get(k)
                    .cloned()
                    .ok_or_else(|| format!("unknown e-node `{name}`"))?
            }
        };
        let node = self
            .graph
            .push(op, &args, &mut self.u)
            .map_err(|e| format!("a rewrite broke a shape rule: {e}"))?;
        self.built.insert(id, node);
        Ok(node)
    }
}
