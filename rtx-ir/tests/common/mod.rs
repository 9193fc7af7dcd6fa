//! The finite-difference harness shared by `gradcheck.rs` (core ops) and `library.rs`
//! (user-facing compositions): build a graph with random leaves, differentiate, and compare
//! every derived gradient with central differences of the float64 reference.

#![allow(dead_code)]

use rtx_ir::reference::{self, Array, RefCtx};
use rtx_ir::{DType, Dim, Graph, NodeId, Op, Unifier, differentiate, float_leaves};
use std::collections::HashMap;

/// Finite-difference step: small enough that the truncation error (eps^2 * f''') is ~1e-12,
/// large enough that the rounding error (|loss| * 1e-16 / eps) stays ~1e-9.
pub const EPS: f64 = 1e-6;
/// Allowed |analytic - numeric|, relative to max(1, |analytic|, |numeric|).
pub const TOL: f64 = 1e-6;

/// splitmix64: a tiny deterministic generator, so failures reproduce exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub fn known(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&d| Dim::known(d)).collect()
}

/// A graph under construction, with the values of its leaves.
pub struct Case {
    pub graph: Graph,
    pub u: Unifier,
    pub inputs: Vec<Array>,
    pub params: Vec<(String, Array)>,
    pub rng: Rng,
}

impl Case {
    pub fn new(seed: u64) -> Case {
        Case {
            graph: Graph::default(),
            u: Unifier::default(),
            inputs: Vec::new(),
            params: Vec::new(),
            rng: Rng(seed),
        }
    }

    pub fn op(&mut self, op: Op, args: &[NodeId]) -> NodeId {
        let name = op.name();
        self.graph
            .push(op, args, &mut self.u)
            .unwrap_or_else(|e| panic!("the shape rule rejected {name}: {e}"))
    }

    /// An input declared with `shape` (possibly symbolic) holding `value`.
    pub fn input_declared(&mut self, shape: Vec<Dim>, value: Array, dtype: DType) -> NodeId {
        let index = self.inputs.len();
        self.inputs.push(value);
        self.op(
            Op::Input {
                index,
                name: format!("x{index}"),
                shape,
                dtype,
            },
            &[],
        )
    }

    pub fn input(&mut self, value: Array) -> NodeId {
        let shape = known(&value.shape);
        self.input_declared(shape, value, DType::F32)
    }

    pub fn param(&mut self, name: &str, value: Array) -> NodeId {
        let shape = known(&value.shape);
        self.params.push((name.to_string(), value));
        self.op(
            Op::Param {
                name: name.to_string(),
                shape,
            },
            &[],
        )
    }

    pub fn random_values(&mut self, shape: &[usize]) -> Array {
        let n = shape.iter().product();
        // Magnitudes in [0.1, 1.1] with a random sign: never zero, never near relu's kink.
        let data = (0..n)
            .map(|_| {
                let m = 0.1 + self.rng.uniform();
                if self.rng.uniform() < 0.5 { -m } else { m }
            })
            .collect();
        Array::new(shape.to_vec(), data)
    }

    /// Random values in [0.1, 1.1] in magnitude, either sign.
    pub fn random(&mut self, shape: &[usize]) -> NodeId {
        let a = self.random_values(shape);
        self.input(a)
    }

    /// Random values in [0.5, 2], for log, sqrt and fractional powers.
    pub fn positive(&mut self, shape: &[usize]) -> NodeId {
        let n = shape.iter().product();
        let data = (0..n).map(|_| 0.5 + 1.5 * self.rng.uniform()).collect();
        self.input(Array::new(shape.to_vec(), data))
    }

    /// Values 0.05 apart in shuffled order (none is 0): every max and max-pool window has a
    /// unique winner with a margin far above EPS, so the max stays put under perturbation.
    pub fn distinct(&mut self, shape: &[usize]) -> NodeId {
        let n: usize = shape.iter().product();
        let mut data: Vec<f64> = (0..n)
            .map(|i| (i as f64 - n as f64 / 2.0 + 0.5) * 0.05)
            .collect();
        for i in (1..n).rev() {
            let j = self.rng.below(i + 1);
            data.swap(i, j);
        }
        self.input(Array::new(shape.to_vec(), data))
    }

    /// An integer input (labels, ids).
    pub fn ints(&mut self, shape: &[usize], values: &[usize]) -> NodeId {
        let a = Array::new(shape.to_vec(), values.iter().map(|&v| v as f64).collect());
        self.input_declared(known(shape), a, DType::I64)
    }

    pub fn run(
        &self,
        graph: &Graph,
        inputs: &[Array],
        params: &[(String, Array)],
        train: bool,
    ) -> Vec<Array> {
        let env = HashMap::new();
        let ctx = RefCtx {
            env: &env,
            train,
            autocast: rtx_ir::AutocastMode::OFF,
            seed: 42,
        };
        let lookup = |name: &str| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| a.clone())
        };
        reference::run(graph, inputs, &lookup, &ctx)
            .unwrap_or_else(|e| panic!("reference run failed: {e}\n{graph:#?}"))
    }
}

/// Which leaf value a finite difference perturbs.
#[derive(Clone, Copy, Debug)]
enum Leaf {
    Input(usize),
    Param(usize),
}

pub fn check_grads(build: impl FnOnce(&mut Case) -> NodeId) {
    check_grads_in(false, build)
}

/// Builds `out = build(case)`, appends `loss = sum(out * R)`, and checks the derived gradient
/// of every float leaf against central differences, evaluating in training mode if `train`.
pub fn check_grads_in(train: bool, build: impl FnOnce(&mut Case) -> NodeId) {
    let mut case = Case::new(0x5EED_0000 + 17);
    let out = build(&mut case);

    // The weights take the output's declared (possibly symbolic) shape and its actual size.
    let out_value = case.run(&case.graph, &case.inputs, &case.params, train)[out].clone();
    let weights = case.random_values(&out_value.shape);
    let declared = case.graph.node(out).shape.clone();
    let r = case.input_declared(declared.clone(), weights, DType::F32);
    let weighted = case.op(Op::Mul, &[out, r]);
    let loss = case.op(
        Op::Sum {
            axes: (0..declared.len()).collect(),
            keepdim: false,
        },
        &[weighted],
    );

    let forward = Graph {
        nodes: case.graph.nodes.clone(),
    };
    let wrt = float_leaves(&case.graph);
    let grads = differentiate(&mut case.graph, loss, &wrt)
        .unwrap_or_else(|e| panic!("differentiate failed: {e}"));
    let values = case.run(&case.graph, &case.inputs, &case.params, train);
    let loss_at = |inputs: &[Array], params: &[(String, Array)]| {
        case.run(&forward, inputs, params, train)[loss].data[0]
    };
    let base = values[loss].data[0];
    assert_eq!(
        loss_at(&case.inputs, &case.params),
        base,
        "the forward part alone must reproduce the loss"
    );

    let float_leaves = forward
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Input { .. } | Op::Param { .. }) && n.dtype == DType::F32)
        .count();
    assert_eq!(
        grads.len(),
        float_leaves,
        "differentiate must report a gradient for every float leaf"
    );

    for gof in &grads {
        let (leaf, value) = match &forward.node(gof.leaf).op {
            Op::Input { index, .. } => (Leaf::Input(*index), &case.inputs[*index]),
            Op::Param { name, .. } => {
                let i = case
                    .params
                    .iter()
                    .position(|(n, _)| n == name)
                    .expect("param value");
                (Leaf::Param(i), &case.params[i].1)
            }
            other => panic!("gradient reported for a non-leaf {other:?}"),
        };
        // No gradient node means the loss does not depend on the leaf: the gradient is zero.
        let analytic = match gof.grad {
            Some(g) => values[g].clone(),
            None => Array::new(value.shape.clone(), vec![0.0; value.data.len()]),
        };
        assert_eq!(
            analytic.shape, value.shape,
            "gradient of {leaf:?} has the wrong shape"
        );
        for j in 0..value.data.len() {
            let at = |delta: f64| {
                let (mut inputs, mut params) = (case.inputs.clone(), case.params.clone());
                match leaf {
                    Leaf::Input(i) => inputs[i].data[j] += delta,
                    Leaf::Param(i) => params[i].1.data[j] += delta,
                }
                loss_at(&inputs, &params)
            };
            let numeric = (at(EPS) - at(-EPS)) / (2.0 * EPS);
            let a = analytic.data[j];
            let scale = 1f64.max(a.abs()).max(numeric.abs());
            assert!(
                (a - numeric).abs() <= TOL * scale,
                "gradient of {leaf:?} element {j} (of shape {:?}): autodiff {a}, finite differences {numeric}\n{}",
                value.shape,
                listing(&case.graph, forward.len()),
            );
        }
    }
}

/// One line per node, to read a failing graph.
pub fn listing(graph: &Graph, forward_len: usize) -> String {
    let mut s = String::new();
    for (i, n) in graph.nodes.iter().enumerate() {
        if i == forward_len {
            s += "  -- backward --\n";
        }
        s += &format!(
            "  %{i} = {}{:?} {:?}\n",
            n.op.name(),
            n.args,
            rtx_ir::fmt_shape(&n.shape)
        );
    }
    s
}

// --- elementwise, one argument ------------------------------------------------------------

/// Library ops lower into a test case like into the macro's graph.
impl rtx_ir::library::Emit for Case {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, rtx_ir::ShapeError> {
        self.graph.push(op, args, &mut self.u)
    }
    fn constant(&mut self, value: f64) -> NodeId {
        Case::op(self, Op::Const { value }, &[])
    }
    fn shape(&self, value: NodeId) -> &rtx_ir::Shape {
        &self.graph.node(value).shape
    }
    fn dtype(&self, value: NodeId) -> rtx_ir::DType {
        self.graph.node(value).dtype
    }
    fn same_shape(&mut self, expected: &rtx_ir::Shape, found: &rtx_ir::Shape) -> bool {
        self.u.same_shape(expected, found)
    }
}

/// `name(tensors.., numbers..)` from the library, lowered into `c`.
pub fn library_call(c: &mut Case, name: &str, tensors: &[NodeId], numbers: &[f64]) -> NodeId {
    let def =
        rtx_ir::library::lookup(name).unwrap_or_else(|| panic!("`{name}` is not in the library"));
    (def.lower)(c, &rtx_ir::library::Args::new(tensors, numbers))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}
