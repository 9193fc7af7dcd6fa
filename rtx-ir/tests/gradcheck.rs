//! Every differentiable op's backward rule (autodiff.rs) checked against central finite
//! differences of its float64 reference (reference.rs).
//!
//! Each test builds a small graph `loss = sum(op(inputs..) * R)` where `R` is a further input
//! of random weights (so the output gradient reaching the op is not all ones and a transposed
//! or misplaced gradient cannot pass), differentiates it, evaluates the whole graph with the
//! reference and compares every input's derived gradient with
//! `(loss(x + eps) - loss(x - eps)) / 2 eps`, element by element.

mod common;

use common::*;
use rtx_ir::{Cmp, DType, Dim, Op};

fn unary_case(op: Op, positive: bool) {
    check_grads(|c| {
        let x = if positive {
            c.positive(&[3, 4])
        } else {
            c.random(&[3, 4])
        };
        c.op(op, &[x])
    })
}

#[test]
fn neg_gradient_matches_finite_differences() {
    unary_case(Op::Neg, false)
}

#[test]
fn relu_gradient_matches_finite_differences() {
    unary_case(Op::Relu, false)
}

#[test]
fn gelu_gradient_matches_finite_differences() {
    unary_case(Op::Gelu, false)
}

#[test]
fn gelu_tanh_gradient_matches_finite_differences() {
    unary_case(Op::GeluTanh, false)
}

#[test]
fn tanh_gradient_matches_finite_differences() {
    unary_case(Op::Tanh, false)
}

#[test]
fn sin_gradient_matches_finite_differences() {
    unary_case(Op::Sin, false)
}

#[test]
fn cos_gradient_matches_finite_differences() {
    unary_case(Op::Cos, false)
}

#[test]
fn sigmoid_gradient_matches_finite_differences() {
    unary_case(Op::Sigmoid, false)
}

#[test]
fn exp_gradient_matches_finite_differences() {
    unary_case(Op::Exp, false)
}

#[test]
fn log_of_positive_inputs_gradient_matches_finite_differences() {
    unary_case(Op::Log, true)
}

#[test]
fn sqrt_of_positive_inputs_gradient_matches_finite_differences() {
    unary_case(Op::Sqrt, true)
}

#[test]
fn pow_square_gradient_matches_finite_differences() {
    unary_case(Op::PowScalar { exponent: 2.0 }, false)
}

#[test]
fn pow_half_of_positive_inputs_gradient_matches_finite_differences() {
    unary_case(Op::PowScalar { exponent: 0.5 }, true)
}

#[test]
fn pow_cube_gradient_matches_finite_differences() {
    unary_case(Op::PowScalar { exponent: 3.0 }, false)
}

// --- elementwise, two arguments -----------------------------------------------------------

/// `op(a, b)`; with `broadcast` both operands are repeated: a [2, 1, 4] against b [3, 1].
fn binary_case(op: Op, broadcast: bool) {
    check_grads(|c| {
        let (sa, sb): (&[usize], &[usize]) = if broadcast {
            (&[2, 1, 4], &[3, 1])
        } else {
            (&[2, 3], &[2, 3])
        };
        let a = c.random(sa);
        // A divisor in [0.5, 2] keeps a / b smooth.
        let b = if matches!(op, Op::Div) {
            c.positive(sb)
        } else {
            c.random(sb)
        };
        c.op(op, &[a, b])
    })
}

#[test]
fn add_gradient_matches_finite_differences() {
    binary_case(Op::Add, false)
}

#[test]
fn add_broadcast_gradient_matches_finite_differences() {
    binary_case(Op::Add, true)
}

#[test]
fn sub_gradient_matches_finite_differences() {
    binary_case(Op::Sub, false)
}

#[test]
fn sub_broadcast_gradient_matches_finite_differences() {
    binary_case(Op::Sub, true)
}

#[test]
fn mul_gradient_matches_finite_differences() {
    binary_case(Op::Mul, false)
}

#[test]
fn mul_broadcast_gradient_matches_finite_differences() {
    binary_case(Op::Mul, true)
}

#[test]
fn div_gradient_matches_finite_differences() {
    binary_case(Op::Div, false)
}

#[test]
fn div_broadcast_gradient_matches_finite_differences() {
    binary_case(Op::Div, true)
}

#[test]
fn same_input_on_two_paths_accumulates_gradients() {
    // x * x + exp(x): three uses of x, whose gradients must be summed.
    check_grads(|c| {
        let x = c.random(&[2, 3]);
        let sq = c.op(Op::Mul, &[x, x]);
        let e = c.op(Op::Exp, &[x]);
        c.op(Op::Add, &[sq, e])
    })
}

// --- reductions ---------------------------------------------------------------------------

/// A reduction of x [3, 4, 5] over `axes` (two axes: the non-adjacent 0 and 2).
fn reduction_case(make: fn(Vec<usize>, bool) -> Op, axes: &[usize], keepdim: bool) {
    check_grads(|c| {
        // Distinct values so a max has one winner per group.
        let x = c.distinct(&[3, 4, 5]);
        c.op(make(axes.to_vec(), keepdim), &[x])
    })
}

fn sum_op(axes: Vec<usize>, keepdim: bool) -> Op {
    Op::Sum { axes, keepdim }
}

fn mean_op(axes: Vec<usize>, keepdim: bool) -> Op {
    Op::Mean { axes, keepdim }
}

fn max_op(axes: Vec<usize>, keepdim: bool) -> Op {
    Op::Max { axes, keepdim }
}

#[test]
fn sum_over_one_axis_gradient_matches_finite_differences() {
    reduction_case(sum_op, &[1], false)
}

#[test]
fn sum_over_one_axis_keepdim_gradient_matches_finite_differences() {
    reduction_case(sum_op, &[1], true)
}

#[test]
fn sum_over_two_axes_gradient_matches_finite_differences() {
    reduction_case(sum_op, &[0, 2], false)
}

#[test]
fn sum_over_two_axes_keepdim_gradient_matches_finite_differences() {
    reduction_case(sum_op, &[0, 2], true)
}

#[test]
fn mean_over_one_axis_gradient_matches_finite_differences() {
    reduction_case(mean_op, &[1], false)
}

#[test]
fn mean_over_one_axis_keepdim_gradient_matches_finite_differences() {
    reduction_case(mean_op, &[1], true)
}

#[test]
fn mean_over_two_axes_gradient_matches_finite_differences() {
    reduction_case(mean_op, &[0, 2], false)
}

#[test]
fn mean_over_two_axes_keepdim_gradient_matches_finite_differences() {
    reduction_case(mean_op, &[0, 2], true)
}

#[test]
fn max_over_one_axis_gradient_matches_finite_differences() {
    reduction_case(max_op, &[1], false)
}

#[test]
fn max_over_one_axis_keepdim_gradient_matches_finite_differences() {
    reduction_case(max_op, &[1], true)
}

#[test]
fn max_over_two_axes_gradient_matches_finite_differences() {
    reduction_case(max_op, &[0, 2], false)
}

#[test]
fn max_over_two_axes_keepdim_gradient_matches_finite_differences() {
    reduction_case(max_op, &[0, 2], true)
}

// --- linear algebra, nn -------------------------------------------------------------------

fn matmul_case(sa: &[usize], sb: &[usize]) {
    check_grads(|c| {
        let a = c.random(sa);
        let b = c.random(sb);
        c.op(Op::MatMul, &[a, b])
    })
}

#[test]
fn top_k_gradient_matches_finite_differences() {
    check_grads(|c| {
        let x = c.random(&[3, 6]);
        c.op(Op::TopK { k: 2 }, &[x])
    })
}

fn attention_case(causal: bool) {
    check_grads(|c| {
        let q = c.random(&[2, 5, 3]);
        let k = c.random(&[2, 5, 3]);
        let v = c.random(&[2, 5, 3]);
        c.op(Op::Attention { causal }, &[q, k, v])
    })
}

#[test]
fn attention_gradient_matches_finite_differences() {
    attention_case(false)
}

#[test]
fn causal_attention_gradient_matches_finite_differences() {
    attention_case(true)
}

#[test]
fn matmul_gradient_matches_finite_differences() {
    matmul_case(&[3, 4], &[4, 5])
}

#[test]
fn matmul_batched_gradient_matches_finite_differences() {
    matmul_case(&[2, 3, 4], &[2, 4, 5])
}

#[test]
fn matmul_batched_broadcast_gradient_matches_finite_differences() {
    // Batch dims [2, 1] against [3]: both operands are repeated over the batch.
    matmul_case(&[2, 1, 3, 4], &[3, 4, 2])
}

#[test]
fn matmul_batch_times_shared_matrix_gradient_matches_finite_differences() {
    // A linear layer over a batch: the matrix's gradient is summed over the batch.
    matmul_case(&[2, 3, 4], &[4, 5])
}

#[test]
fn pick_gradient_matches_finite_differences() {
    // Repeated and distinct ids over a [2, 2, 3] value: the gradient lands where each row picked.
    check_grads(|c| {
        let x = c.random(&[2, 2, 3]);
        let ids = c.ints(&[2, 2], &[2, 0, 2, 1]);
        c.op(Op::Pick, &[x, ids])
    })
}

fn conv_case(x: &[usize], w: &[usize], stride: usize, padding: usize) {
    check_grads(|c| {
        let x = c.random(x);
        let w = c.random(w);
        c.op(
            Op::Conv2d {
                stride: [stride; 2],
                padding: [padding; 2],
            },
            &[x, w],
        )
    })
}

#[test]
fn conv2d_stride1_pad0_gradient_wrt_input_and_weight_matches_finite_differences() {
    conv_case(&[2, 3, 5, 5], &[4, 3, 3, 3], 1, 0)
}

#[test]
fn conv2d_stride2_pad1_gradient_wrt_input_and_weight_matches_finite_differences() {
    // 6x5 input, 3x2 kernel: uneven sizes catch swapped height/width.
    check_grads(|c| {
        let x = c.random(&[2, 2, 6, 5]);
        let w = c.random(&[3, 2, 3, 2]);
        c.op(
            Op::Conv2d {
                stride: [2, 2],
                padding: [1, 1],
            },
            &[x, w],
        )
    })
}

#[test]
fn conv2d_stride2_pad1_square_gradient_matches_finite_differences() {
    conv_case(&[1, 3, 5, 5], &[2, 3, 3, 3], 2, 1)
}

fn pool_case(max: bool, shape: &[usize], k: usize, s: usize, p: usize) {
    check_grads(|c| {
        let x = if max {
            c.distinct(shape)
        } else {
            c.random(shape)
        };
        let (kernel, stride, padding) = ([k; 2], [s; 2], [p; 2]);
        c.op(
            if max {
                Op::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                }
            } else {
                Op::AvgPool2d {
                    kernel,
                    stride,
                    padding,
                }
            },
            &[x],
        )
    })
}

#[test]
fn max_pool2d_k2_s2_gradient_matches_finite_differences() {
    pool_case(true, &[2, 2, 4, 4], 2, 2, 0)
}

#[test]
fn max_pool2d_k3_s2_p1_overlapping_windows_gradient_matches_finite_differences() {
    pool_case(true, &[1, 2, 5, 5], 3, 2, 1)
}

#[test]
fn avg_pool2d_k2_s2_gradient_matches_finite_differences() {
    pool_case(false, &[2, 2, 4, 4], 2, 2, 0)
}

#[test]
fn avg_pool2d_k3_s2_p1_overlapping_windows_gradient_matches_finite_differences() {
    pool_case(false, &[1, 2, 5, 5], 3, 2, 1)
}

#[test]
fn embedding_gradient_wrt_table_accumulates_repeated_ids() {
    check_grads(|c| {
        let table = c.random(&[5, 3]);
        // Ids 1 and 4 repeat, 2 and 3 are never looked up (zero gradient rows).
        let ids = c.ints(&[2, 3], &[1, 4, 1, 0, 4, 4]);
        c.op(Op::Embedding, &[table, ids])
    })
}

#[test]
fn dropout_in_training_gradient_flows_through_kept_elements_only() {
    check_grads_in(true, |c| {
        let x = c.random(&[4, 5]);
        let mask = c.op(Op::DropoutMask { p: 0.4 }, &[x]);
        c.op(Op::Mul, &[x, mask])
    })
}

// --- layout -------------------------------------------------------------------------------

#[test]
fn reshape_gradient_matches_finite_differences() {
    check_grads(|c| {
        let x = c.random(&[2, 3, 4]);
        c.op(
            Op::Reshape {
                shape: known(&[4, 6]),
            },
            &[x],
        )
    })
}

#[test]
fn reshape_with_symbolic_batch_gradient_matches_finite_differences() {
    // B is bound from the input's actual size when the graph runs.
    check_grads(|c| {
        let b = Dim::sym("B");
        let value = c.random_values(&[2, 12]);
        let x = c.input_declared(vec![b.clone(), Dim::known(12)], value, DType::F32);
        c.op(
            Op::Reshape {
                shape: vec![b, Dim::known(3), Dim::known(4)],
            },
            &[x],
        )
    })
}

#[test]
fn permute_gradient_matches_finite_differences() {
    check_grads(|c| {
        let x = c.random(&[2, 3, 4]);
        c.op(
            Op::Permute {
                perm: vec![2, 0, 1],
            },
            &[x],
        )
    })
}

#[test]
fn concat_axis0_gradient_wrt_each_input_matches_finite_differences() {
    check_grads(|c| {
        let a = c.random(&[2, 3]);
        let b = c.random(&[3, 3]);
        c.op(Op::Concat { axis: 0 }, &[a, b])
    })
}

#[test]
fn concat_axis1_gradient_wrt_each_input_matches_finite_differences() {
    check_grads(|c| {
        let a = c.random(&[2, 3]);
        let b = c.random(&[2, 1]);
        let d = c.random(&[2, 2]);
        c.op(Op::Concat { axis: 1 }, &[a, b, d])
    })
}

#[test]
fn concat_along_a_symbolic_axis_gradient_matches_finite_differences() {
    // T and S are bound only when the graph runs: the backward slices take their bounds from
    // the parts' run-time shapes.
    check_grads(|c| {
        let a_value = c.random_values(&[2, 3]);
        let a = c.input_declared(vec![Dim::known(2), Dim::sym("T")], a_value, DType::F32);
        let b_value = c.random_values(&[2, 4]);
        let b = c.input_declared(vec![Dim::known(2), Dim::sym("S")], b_value, DType::F32);
        c.op(Op::Concat { axis: 1 }, &[a, b])
    })
}

#[test]
fn narrow_gradient_matches_finite_differences() {
    check_grads(|c| {
        let x = c.random(&[3, 5, 2]);
        c.op(
            Op::Narrow {
                axis: 1,
                start: 1,
                len: 3,
            },
            &[x],
        )
    })
}

#[test]
fn broadcast_to_gradient_matches_finite_differences() {
    // The shape witness `like` gets no gradient; finite differences confirm it is zero.
    check_grads(|c| {
        let x = c.random(&[3, 1]);
        let like = c.random(&[2, 3, 4]);
        c.op(Op::BroadcastTo, &[x, like])
    })
}

// --- a whole model ------------------------------------------------------------------------

#[test]
fn mlp_with_params_and_cross_entropy_gradient_matches_finite_differences() {
    // relu(x @ w1 + b1) @ w2 + b2 -> cross_entropy: parameters, broadcast bias, shared paths.
    check_grads(|c| {
        let x = c.random(&[4, 3]);
        let w1 = c.random_values(&[3, 5]);
        let w1 = c.param("fc1.weight", w1);
        let b1 = c.random_values(&[5]);
        let b1 = c.param("fc1.bias", b1);
        let w2 = c.random_values(&[5, 2]);
        let w2 = c.param("fc2.weight", w2);
        let h = c.op(Op::MatMul, &[x, w1]);
        let h = c.op(Op::Add, &[h, b1]);
        let h = c.op(Op::Relu, &[h]);
        let logits = c.op(Op::MatMul, &[h, w2]);
        let labels = c.ints(&[4], &[1, 0, 0, 1]);
        library_call(c, "cross_entropy", &[logits, labels], &[])
    })
}

#[test]
fn maximum_and_minimum_gradients_match_finite_differences() {
    for op in [Op::Maximum, Op::Minimum] {
        check_grads(|c| {
            let a = c.random(&[3, 4]);
            let b = c.random(&[4]);
            c.op(op.clone(), &[a, b])
        })
    }
}

#[test]
fn maximum_at_a_tie_splits_the_gradient_like_central_differences() {
    // Equal operands: the central difference of max(a, b) in a is exactly 1/2, as PyTorch's
    // rule gives.
    for op in [Op::Maximum, Op::Minimum] {
        check_grads(|c| {
            let v = c.random_values(&[5]);
            let a = c.input(v.clone());
            let b = c.input(v);
            c.op(op.clone(), &[a, b])
        })
    }
}

#[test]
fn select_gradient_matches_finite_differences() {
    check_grads(|c| {
        let x = c.random(&[3, 4]);
        let zero = c.op(Op::Const { value: 0.0 }, &[]);
        let cond = c.op(Op::Compare { cmp: Cmp::Gt }, &[x, zero]);
        let a = c.random(&[3, 4]);
        let b = c.random(&[4]);
        c.op(Op::Select, &[cond, a, b])
    })
}

#[test]
fn compare_has_zero_gradient() {
    for cmp in [Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le, Cmp::Eq, Cmp::Ne] {
        check_grads(|c| {
            let a = c.random(&[3, 2]);
            let b = c.random(&[3, 2]);
            c.op(Op::Compare { cmp }, &[a, b])
        })
    }
}

#[test]
fn autocast_at_f32_is_the_identity_and_its_gradient_matches_finite_differences() {
    // Rounding is piecewise constant, so finite differences see its f32 meaning only; the
    // rounded gradient at half precision is specified in reference_ops.rs.
    unary_case(Op::Autocast, false)
}
