//! Each rewrite rule fires on the graph it is written for, and the rewritten graph computes the
//! same values as the original on random inputs (float64 reference). Plus: CSE merges twins
//! but never two random ops, and gradients survive.

mod common;

use common::*;
use rtx_ir::rewrite::{Limits, simplify};
use rtx_ir::{GraphFn, NodeId, Op, differentiate, float_leaves};

fn function(c: &Case, output: NodeId) -> GraphFn {
    GraphFn {
        name: "f".into(),
        symbols: Vec::new(),
        graph: c.graph.clone(),
        output,
        forward_len: c.graph.len(),
        grads: Vec::new(),
    }
}

fn konst(c: &mut Case, v: f64) -> NodeId {
    c.op(Op::Const { value: v }, &[])
}

/// Builds the graph, rewrites it, and checks that it shrank to `at_most` nodes and that the
/// output is unchanged.
fn check_rule(at_most: usize, build: impl FnOnce(&mut Case) -> NodeId) {
    let mut c = Case::new(31);
    let out = build(&mut c);
    let mut f = function(&c, out);
    let before = c.run(&f.graph, &c.inputs, &c.params, false)[f.output].clone();

    let report = simplify(&mut f, Limits::default()).unwrap();

    let after = c.run(&f.graph, &c.inputs, &c.params, false)[f.output].clone();
    assert!(
        f.graph.len() <= at_most,
        "expected at most {at_most} nodes, got {}: {:#?} ({report:?})",
        f.graph.len(),
        f.graph.nodes
    );
    assert_eq!(before.shape, after.shape);
    for (a, b) in before.data.iter().zip(&after.data) {
        assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn transpose_of_matmul_is_the_product_of_the_transposes() {
    // (x^T g)^T, a Linear weight's gradient, becomes g^T x: two nodes fewer, no transpose of
    // the product.
    check_rule(4, |c| {
        let x = c.random(&[5, 3]);
        let g = c.random(&[5, 4]);
        let xt = c.op(Op::Permute { perm: vec![1, 0] }, &[x]);
        let product = c.op(Op::MatMul, &[xt, g]);
        c.op(Op::Permute { perm: vec![1, 0] }, &[product])
    });
}

#[test]
fn add_zero_and_zero_add() {
    check_rule(1, |c| {
        let x = c.random(&[3, 4]);
        let z = konst(c, 0.0);
        let y = c.op(Op::Add, &[x, z]);
        c.op(Op::Add, &[z, y])
    });
}

#[test]
fn sub_zero() {
    check_rule(1, |c| {
        let x = c.random(&[3]);
        let z = konst(c, 0.0);
        c.op(Op::Sub, &[x, z])
    });
}

#[test]
fn mul_one_one_mul_and_div_one() {
    check_rule(1, |c| {
        let x = c.random(&[2, 5]);
        let one = konst(c, 1.0);
        let a = c.op(Op::Mul, &[x, one]);
        let b = c.op(Op::Mul, &[one, a]);
        c.op(Op::Div, &[b, one])
    });
}

#[test]
fn double_negation() {
    check_rule(1, |c| {
        let x = c.random(&[4]);
        let n = c.op(Op::Neg, &[x]);
        c.op(Op::Neg, &[n])
    });
}

#[test]
fn subtracting_a_negation_is_adding() {
    check_rule(3, |c| {
        let (a, b) = (c.random(&[3, 2]), c.random(&[2]));
        let n = c.op(Op::Neg, &[b]);
        c.op(Op::Sub, &[a, n])
    });
}

#[test]
fn adding_a_negation_is_subtracting() {
    check_rule(3, |c| {
        let (a, b) = (c.random(&[3, 2]), c.random(&[3, 2]));
        let n = c.op(Op::Neg, &[b]);
        c.op(Op::Add, &[a, n])
    });
}

#[test]
fn negated_difference_swaps() {
    check_rule(3, |c| {
        let (a, b) = (c.random(&[5]), c.random(&[5]));
        let d = c.op(Op::Sub, &[a, b]);
        c.op(Op::Neg, &[d])
    });
}

#[test]
fn multiplying_by_minus_one_negates() {
    check_rule(2, |c| {
        let x = c.random(&[4]);
        let m = konst(c, -1.0);
        c.op(Op::Mul, &[x, m])
    });
}

#[test]
fn two_scalings_fold_into_one() {
    check_rule(3, |c| {
        let x = c.random(&[2, 3]);
        let (k1, k2) = (konst(c, 0.5), konst(c, 3.0));
        let a = c.op(Op::Mul, &[x, k1]);
        c.op(Op::Mul, &[a, k2])
    });
}

#[test]
fn transposing_twice_is_the_identity() {
    check_rule(1, |c| {
        let x = c.random(&[3, 4]);
        let t = c.op(Op::Permute { perm: vec![1, 0] }, &[x]);
        c.op(Op::Permute { perm: vec![1, 0] }, &[t])
    });
}

#[test]
fn constants_fold() {
    // (2 * 3 - 1) + x: the constant part becomes one node.
    check_rule(3, |c| {
        let x = c.random(&[3]);
        let (two, three, one) = (konst(c, 2.0), konst(c, 3.0), konst(c, 1.0));
        let six = c.op(Op::Mul, &[two, three]);
        let five = c.op(Op::Sub, &[six, one]);
        c.op(Op::Add, &[five, x])
    });
}

#[test]
fn identical_subexpressions_merge() {
    check_rule(4, |c| {
        let x = c.random(&[3, 3]);
        let a = c.op(Op::Exp, &[x]);
        let b = c.op(Op::Exp, &[x]);
        let ma = c.op(Op::MatMul, &[a, x]);
        let mb = c.op(Op::MatMul, &[b, x]);
        c.op(Op::Add, &[ma, mb])
    });
}

#[test]
fn random_ops_never_merge() {
    let mut c = Case::new(5);
    let x = c.random(&[64]);
    let m1 = c.op(Op::DropoutMask { p: 0.5 }, &[x]);
    let m2 = c.op(Op::DropoutMask { p: 0.5 }, &[x]);
    let out = c.op(Op::Sub, &[m1, m2]);
    let mut f = function(&c, out);

    simplify(&mut f, Limits::default()).unwrap();

    let masks = f
        .graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::DropoutMask { .. }))
        .count();
    assert_eq!(masks, 2);
}

#[test]
fn gradients_survive_rewriting() {
    // loss = sum((x * 1 + 0) * w); the rewritten backward still gives d/dx = w and d/dw = x.
    let mut c = Case::new(6);
    let x = c.random(&[4]);
    let w = c.random(&[4]);
    let (one, zero) = (konst(&mut c, 1.0), konst(&mut c, 0.0));
    let a = c.op(Op::Mul, &[x, one]);
    let b = c.op(Op::Add, &[a, zero]);
    let p = c.op(Op::Mul, &[b, w]);
    let loss = c.op(
        Op::Sum {
            axes: vec![0],
            keepdim: false,
        },
        &[p],
    );
    let wrt = float_leaves(&c.graph);
    let mut f = function(&c, loss);
    f.grads = differentiate(&mut f.graph, loss, &wrt).unwrap();
    f.remove_dead_nodes();
    let before = c.run(&f.graph, &c.inputs, &c.params, false);
    let want: Vec<Vec<f64>> = f
        .grads
        .iter()
        .map(|g| before[g.grad.unwrap()].data.clone())
        .collect();

    let report = simplify(&mut f, Limits::default()).unwrap();

    assert!(report.nodes_after < report.nodes_before, "{report:?}");
    let after = c.run(&f.graph, &c.inputs, &c.params, false);
    for (g, want) in f.grads.iter().zip(want) {
        assert_eq!(after[g.grad.unwrap()].data, want);
    }
}

#[test]
fn the_runner_stops_at_its_limits() {
    let mut c = Case::new(7);
    let mut v = c.random(&[2]);
    for _ in 0..50 {
        let n = c.op(Op::Neg, &[v]);
        let k = konst(&mut c, 1.0);
        v = c.op(Op::Mul, &[n, k]);
    }
    let mut f = function(&c, v);
    let limits = Limits {
        iterations: 1,
        ..Limits::default()
    };

    let report = simplify(&mut f, limits).unwrap();

    assert!(report.iterations <= 1, "{report:?}");
}
