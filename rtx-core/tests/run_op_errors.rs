//! `run_op` never panics on arguments that do not fit: each such call is an `Err` naming what
//! was expected and what came. Backward ops are covered too, since the IR executor runs them
//! from graphs loaded as JSON (user data).

mod common;

use common::Rng;
use rtx_core::ops::run_op;
use rtx_core::{Ctx, RtxError, Tensor};
use rtx_ir::Op;

fn run(op: &Op, args: &[&Tensor]) -> rtx_core::Result<Tensor> {
    run_op(op, args, &mut Ctx::eval())
}

/// Asserts a `ShapeMismatch` whose expected and found shapes are the given ones.
fn assert_mismatch(op: &Op, args: &[&Tensor], expected: &str, found: &str) {
    match run(op, args) {
        Err(RtxError::ShapeMismatch {
            expected: e,
            found: f,
            ..
        }) => {
            assert_eq!((e.as_str(), f.as_str()), (expected, found), "{op:?}");
        }
        other => panic!("{op:?}: expected a shape mismatch, got {other:?}"),
    }
}

fn assert_invalid(op: &Op, args: &[&Tensor], words: &str) {
    match run(op, args) {
        Err(e @ RtxError::Invalid(_)) => assert!(e.to_string().contains(words), "{op:?}: {e}"),
        other => panic!("{op:?}: expected an error mentioning {words:?}, got {other:?}"),
    }
}

#[test]
fn elementwise_backward_ops_reject_a_gradient_of_another_shape() {
    let mut rng = Rng::new(1);
    let (x, g) = (rng.tensor(&[3, 4]), rng.tensor(&[2, 2]));
    for op in [Op::ReluGrad, Op::GeluGrad] {
        assert_mismatch(&op, &[&x, &g], "[3, 4]", "[2, 2]");
    }
}

#[test]
fn reduction_backward_ops_reject_a_gradient_of_another_shape() {
    let mut rng = Rng::new(2);
    let (x, g) = (rng.tensor(&[3, 4]), rng.tensor(&[5]));
    assert_mismatch(
        &Op::MeanGrad {
            axes: vec![1],
            keepdim: false,
        },
        &[&x, &g],
        "[3]",
        "[5]",
    );
    assert_mismatch(
        &Op::MaxGrad {
            axes: vec![1],
            keepdim: true,
        },
        &[&x, &g],
        "[3, 1]",
        "[5]",
    );
}

#[test]
fn pick_grad_rejects_indices_of_another_batch_and_a_gradient_of_another_shape() {
    let mut rng = Rng::new(3);
    let x = rng.tensor(&[3, 4]);
    let (short, ids) = (rng.ids(&[2], 4), rng.ids(&[3], 4));
    let g = rng.tensor(&[3]);
    assert_mismatch(&Op::PickGrad, &[&g, &short, &x], "[3]", "[2]");
    assert_mismatch(
        &Op::PickGrad,
        &[&rng.tensor(&[3, 1]), &ids, &x],
        "[3]",
        "[3, 1]",
    );
}

#[test]
fn conv_backward_ops_reject_a_gradient_of_another_shape() {
    let mut rng = Rng::new(4);
    let (x, w, g) = (
        rng.tensor(&[1, 1, 5, 5]),
        rng.tensor(&[2, 1, 2, 2]),
        rng.tensor(&[1, 2, 3, 3]),
    );
    let conv = ([1, 1], [0, 0]);
    assert_mismatch(
        &Op::Conv2dGradInput {
            stride: conv.0,
            padding: conv.1,
        },
        &[&g, &w, &x],
        "[1, 2, 4, 4]",
        "[1, 2, 3, 3]",
    );
    assert_mismatch(
        &Op::Conv2dGradWeight {
            stride: conv.0,
            padding: conv.1,
        },
        &[&x, &g, &w],
        "[1, 2, 4, 4]",
        "[1, 2, 3, 3]",
    );
}

#[test]
fn pool_backward_ops_reject_a_gradient_of_another_shape() {
    let mut rng = Rng::new(5);
    let (x, g) = (rng.tensor(&[1, 1, 4, 4]), rng.tensor(&[1, 1, 3, 3]));
    let (kernel, stride, padding) = ([2, 2], [2, 2], [0, 0]);
    assert_mismatch(
        &Op::MaxPool2dGrad {
            kernel,
            stride,
            padding,
        },
        &[&x, &g],
        "[1, 1, 2, 2]",
        "[1, 1, 3, 3]",
    );
    assert_mismatch(
        &Op::AvgPool2dGrad {
            kernel,
            stride,
            padding,
        },
        &[&x, &g],
        "[1, 1, 2, 2]",
        "[1, 1, 3, 3]",
    );
}

#[test]
fn embedding_grad_rejects_a_gradient_that_does_not_match_the_ids() {
    let mut rng = Rng::new(6);
    let (g, ids, table) = (rng.tensor(&[2, 5]), rng.ids(&[3], 4), rng.tensor(&[4, 5]));
    assert_mismatch(&Op::EmbeddingGrad, &[&g, &ids, &table], "[3, 5]", "[2, 5]");
}

#[test]
fn pad_narrow_rejects_a_window_outside_the_full_shape() {
    let mut rng = Rng::new(7);
    let (g, full) = (rng.tensor(&[2, 3]), rng.tensor(&[2, 7]));
    assert_invalid(
        &Op::PadNarrow { axis: 1, start: 5 },
        &[&g, &full],
        "out of range",
    );
    assert_invalid(&Op::PadNarrow { axis: 2, start: 0 }, &[&g, &full], "axis 2");
    assert_mismatch(
        &Op::PadNarrow { axis: 1, start: 0 },
        &[&rng.tensor(&[3, 3]), &full],
        "[2, 3]",
        "[3, 3]",
    );
}

#[test]
fn sum_to_rejects_a_target_the_gradient_does_not_broadcast_from() {
    let mut rng = Rng::new(8);
    let g = rng.tensor(&[2, 3]);
    assert_invalid(&Op::SumTo, &[&g, &rng.tensor(&[4])], "does not broadcast");
    assert_invalid(
        &Op::SumTo,
        &[&g, &rng.tensor(&[5, 2, 3])],
        "does not broadcast",
    );
}

#[test]
fn pooling_with_a_zero_kernel_is_an_error() {
    let x = Rng::new(9).tensor(&[1, 1, 4, 4]);
    for op in [
        Op::MaxPool2d {
            kernel: [0, 2],
            stride: [1, 1],
            padding: [0, 0],
        },
        Op::AvgPool2d {
            kernel: [2, 0],
            stride: [1, 1],
            padding: [0, 0],
        },
    ] {
        assert_invalid(&op, &[&x], "must be at least 1");
    }
}
