//! Every op that `rtx_core::ops::run_op` executes, checked against its float64 reference
//! (`rtx_ir::reference::eval`) on the same random values.
//!
//! Each test builds fresh random f32 inputs (i64 for labels and ids), runs the op through the
//! runtime's single dispatch, evaluates the reference on the same values widened to f64, and
//! compares shape and every element. Elementwise ops, reductions and the nn ops allow
//! `1e-5 + 1e-4 * |want|`; contractions (matmul, conv) allow `1e-4 * sqrt(K)` absolute, K the
//! contracted length. Several tests feed views instead of fresh buffers: permuted (strided),
//! broadcast (stride 0) and narrowed (offset) inputs, since kernels must read any layout.

mod common;

use common::{Rng, assert_close, to_array};
use rtx_core::ops::run_op;
use rtx_core::{Ctx, Tensor};
use rtx_ir::reference::{self, RefCtx};
use rtx_ir::{Cmp, Dim, Op};
use std::collections::HashMap;

const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-4;

/// The device the ops run on: the CPU, or with `RTX_TEST_DEVICE=wgpu` (and the `wgpu`
/// feature) the wgpu adapter, or with `RTX_TEST_DEVICE=cuda` (and the `cuda` feature) the
/// first CUDA GPU (`cuda-on-cpu`: the CUDA backend with its kernels run on the CPU), or with
/// `RTX_TEST_DEVICE=hip` (and the `hip` feature) the first AMD GPU, so that
/// this whole file is also each GPU backend's op test.
fn test_device() -> rtx_core::Device {
    let wanted = std::env::var("RTX_TEST_DEVICE").unwrap_or_default();
    #[cfg(feature = "wgpu")]
    if wanted == "wgpu" {
        return rtx_core::Device::wgpu().unwrap_or_else(|e| panic!("RTX_TEST_DEVICE=wgpu: {e}"));
    }
    #[cfg(feature = "cuda")]
    if wanted == "cuda" {
        return rtx_core::Device::cuda(0).unwrap_or_else(|e| panic!("RTX_TEST_DEVICE=cuda: {e}"));
    }
    #[cfg(feature = "hip")]
    if wanted == "hip" {
        return rtx_core::Device::hip(0).unwrap_or_else(|e| panic!("RTX_TEST_DEVICE=hip: {e}"));
    }
    #[cfg(feature = "cuda")]
    if wanted == "cuda-on-cpu" {
        return rtx_core::Device::cuda_on_cpu()
            .unwrap_or_else(|e| panic!("RTX_TEST_DEVICE=cuda-on-cpu: {e}"));
    }
    assert!(
        wanted.is_empty() || wanted == "cpu",
        "RTX_TEST_DEVICE={wanted}: this build has no such device (enable its cargo feature)"
    );
    rtx_core::Device::Cpu
}

/// Runs `op` through the runtime (on [`test_device`]) and the reference on the same values
/// and compares them.
fn check_with(op: &Op, args: &[&Tensor], atol: f64, rtol: f64) {
    let device = test_device();
    let on_device: Vec<Tensor> = args.iter().map(|t| t.to(&device).unwrap()).collect();
    let moved: Vec<&Tensor> = on_device.iter().collect();
    // The CPU runs of this op's name (a global count: other tests run other ops meanwhile).
    let debug = format!("{op:?}");
    let name = debug
        .split([' ', '{', '('])
        .next()
        .unwrap_or("")
        .to_string();
    let fallbacks = || {
        rtx_core::gpu::cpu_fallbacks()
            .iter()
            .find(|(op, _)| *op == name)
            .map_or(0, |(_, n)| *n)
    };
    let before = fallbacks();
    let got = run_op(op, &moved, &mut Ctx::eval())
        .and_then(|t| {
            // An op of no operands (a constant) is made on the CPU.
            let expected = if args.is_empty() {
                rtx_core::Device::Cpu
            } else {
                device.clone()
            };
            assert_eq!(t.device(), expected, "{op:?}: result device");
            t.to(&rtx_core::Device::Cpu)
        })
        .unwrap_or_else(|e| panic!("run_op({op:?}) on {device} failed: {e}"));
    // Every core op has a device kernel: none may run on the CPU behind the device's back.
    assert_eq!(
        fallbacks(),
        before,
        "{op:?} ran on the cpu instead of on {device}"
    );
    let arrays: Vec<_> = args.iter().map(|t| to_array(t)).collect();
    let refs: Vec<_> = arrays.iter().collect();
    let env = HashMap::new();
    let want = reference::eval(
        op,
        &refs,
        &RefCtx {
            env: &env,
            train: false,
            autocast: rtx_ir::AutocastMode::OFF,
            seed: 0,
        },
    )
    .unwrap_or_else(|e| panic!("reference eval of {op:?} failed: {e}"));
    assert_eq!(got.shape(), want.shape.as_slice(), "{op:?}: output shape");
    assert_close(
        &to_array(&got).data,
        &want.data,
        atol,
        rtol,
        &format!("{op:?}"),
    );
}

fn check(op: &Op, args: &[&Tensor]) {
    check_with(op, args, ATOL, RTOL);
}

/// Tolerance of a contraction over `k` products.
fn check_contraction(op: &Op, args: &[&Tensor], k: usize) {
    check_with(op, args, 1e-4 * (k as f64).sqrt(), 0.0);
}

fn view(op: Op, t: &Tensor) -> Tensor {
    run_op(&op, &[t], &mut Ctx::eval()).unwrap()
}

/// `t` with its axes reordered: a strided, non-contiguous view of the same buffer.
fn permuted(t: &Tensor, perm: &[usize]) -> Tensor {
    let v = view(
        Op::Permute {
            perm: perm.to_vec(),
        },
        t,
    );
    assert!(
        !v.layout().is_contiguous(),
        "test setup: the permuted view should be strided"
    );
    v
}

/// A random tensor of `shape` that is stored transposed: the permuted view of a contiguous
/// tensor whose last two axes are swapped.
fn transposed_random(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let r = shape.len();
    let mut stored = shape.to_vec();
    stored.swap(r - 2, r - 1);
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    permuted(&rng.tensor(&stored), &perm)
}

/// `t` broadcast to `shape`: a view with stride 0 on the broadcast axes.
fn broadcast(t: &Tensor, shape: &[usize]) -> Tensor {
    let like = Tensor::full(shape, 1.0);
    let v = run_op(&Op::BroadcastTo, &[t, &like], &mut Ctx::eval()).unwrap();
    assert!(
        v.layout().strides.contains(&0),
        "test setup: the broadcast view should have a zero stride"
    );
    v
}

/// Elements `start..start + len` of `t` along `axis`: a view at a nonzero offset.
fn narrowed(t: &Tensor, axis: usize, start: usize, len: usize) -> Tensor {
    let v = view(Op::Narrow { axis, start, len }, t);
    assert!(
        v.layout().offset > 0,
        "test setup: the narrowed view should start at an offset"
    );
    v
}

/// Compile-time guard: adding an op to `rtx_ir::Op` breaks this match until a test below
/// covers it. Returns the test that checks the op.
#[allow(dead_code)]
fn test_of(op: &Op) -> Option<&'static str> {
    Some(match op {
        Op::Input { .. } | Op::Param { .. } => return None,
        Op::Const { .. } => "const_matches_reference",
        Op::Autocast | Op::AutocastGrad => "autocast_ops_match_reference_at_every_precision",
        Op::StopGradient
        | Op::Neg
        | Op::Relu
        | Op::Gelu
        | Op::GeluTanh
        | Op::Tanh
        | Op::Sin
        | Op::Cos
        | Op::Sigmoid
        | Op::Exp => "unary_ops_match_reference",
        Op::Log | Op::Sqrt => "log_and_sqrt_match_reference_on_positive_inputs",
        Op::PowScalar { .. } => "pow_scalar_matches_reference",
        Op::Add | Op::Sub | Op::Mul | Op::Div => "binary_ops_match_reference",
        Op::Maximum | Op::Minimum => "maximum_and_minimum_match_reference",
        Op::Compare { .. } => "comparisons_match_reference",
        Op::Select => "select_matches_reference",
        Op::Sum { .. } | Op::Mean { .. } | Op::Max { .. } => "reductions_match_reference",
        Op::MatMul => "matmul_matches_reference",
        Op::Attention { .. } => "attention_matches_reference",
        Op::AttentionGrad { .. } => "attention_grad_matches_reference",
        Op::Conv2d { .. } => "conv2d_matches_reference",
        Op::MaxPool2d { .. } => "max_pool2d_matches_reference",
        Op::AvgPool2d { .. } => "avg_pool2d_matches_reference",
        Op::Embedding => "embedding_matches_reference",
        Op::Pick => "pick_matches_reference",
        Op::DropoutMask { .. } => "eval_mode_dropout_mask_is_ones_like_reference",
        Op::Iota { .. } => "iota_matches_reference",
        Op::ArgMax { .. } => "argmax_matches_reference",
        Op::TopK { .. } | Op::TopKIndices { .. } | Op::TopKGrad { .. } => "top_k_matches_reference",
        Op::Positions { .. } => "positions_match_reference",
        Op::Reshape { .. } => "reshape_matches_reference",
        Op::Permute { .. } => "permute_matches_reference",
        Op::Concat { .. } => "concat_matches_reference",
        Op::Narrow { .. } => "narrow_matches_reference",
        Op::BroadcastTo => "broadcast_to_matches_reference",
        Op::SumTo => "sum_to_matches_reference",
        Op::ReluGrad | Op::GeluGrad | Op::GeluTanhGrad => "relu_grad_and_gelu_grad_match_reference",
        Op::MeanGrad { .. } => "mean_grad_matches_reference",
        Op::MaxGrad { .. } => "max_grad_matches_reference",
        Op::PickGrad => "pick_grad_matches_reference",
        Op::Conv2dGradInput { .. } => "conv2d_grad_input_matches_reference",
        Op::Conv2dGradWeight { .. } => "conv2d_grad_weight_matches_reference",
        Op::MaxPool2dGrad { .. } => "max_pool2d_grad_matches_reference",
        Op::AvgPool2dGrad { .. } => "avg_pool2d_grad_matches_reference",
        Op::PadNarrow { .. } => "pad_narrow_matches_reference",
        Op::EmbeddingGrad => "embedding_grad_matches_reference",
        Op::ConcatGrad { .. } => "concat_grad_matches_reference",
    })
}

// --- leaves and elementwise -----------------------------------------------------------------

#[test]
fn positions_match_reference() {
    let mut rng = Rng::new(44);
    let x = rng.tensor(&[2, 6, 3]);
    for axis in 0..3 {
        check(&Op::Positions { axis }, &[&x]);
    }
    let p = run_op(&Op::Positions { axis: 1 }, &[&x], &mut Ctx::eval()).unwrap();
    assert_eq!(p.to_vec_i64().unwrap(), vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn argmax_matches_reference() {
    let mut rng = Rng::new(43);
    let x = rng.tensor(&[3, 7, 4]);
    let strided = permuted(&x, &[2, 0, 1]);
    for axis in 0..3 {
        check(&Op::ArgMax { axis }, &[&x]);
        check(&Op::ArgMax { axis }, &[&strided]);
    }
    // Ties go to the first; a NaN is the largest.
    let t = Tensor::from_vec(vec![1.0, 5.0, 5.0, 0.0, f32::NAN, 9.0], &[2, 3]).unwrap();
    let ids = run_op(&Op::ArgMax { axis: 1 }, &[&t], &mut Ctx::eval()).unwrap();
    assert_eq!(ids.to_vec_i64().unwrap(), vec![1, 1]);
}

#[test]
fn top_k_matches_reference() {
    let mut rng = Rng::new(45);
    let x = rng.tensor(&[3, 5, 9]);
    let strided = permuted(&rng.tensor(&[9, 3, 5]), &[1, 2, 0]);
    for k in [1, 4, 9] {
        for x in [&x, &strided] {
            check(&Op::TopK { k }, &[x]);
            check(&Op::TopKIndices { k }, &[x]);
            let g = rng.tensor(&[3, 5, k]);
            check(&Op::TopKGrad { k }, &[x, &g]);
        }
    }
    // Largest first; a NaN before every number; equal values in position order.
    let t = Tensor::from_vec(vec![1.0, 5.0, 5.0, 0.0, f32::NAN, 9.0, -1.0, 2.0], &[2, 4]).unwrap();
    let ids = run_op(&Op::TopKIndices { k: 3 }, &[&t], &mut Ctx::eval()).unwrap();
    assert_eq!(ids.to_vec_i64().unwrap(), vec![1, 2, 0, 0, 1, 3]);
    let err = run_op(&Op::TopK { k: 5 }, &[&t], &mut Ctx::eval()).unwrap_err();
    assert!(err.to_string().contains('5'), "{err}");
}

#[test]
fn iota_matches_reference() {
    let mut rng = Rng::new(41);
    let x = rng.tensor(&[2, 5, 3]);
    for axis in 0..3 {
        check(&Op::Iota { axis }, &[&x]);
    }
    let y = run_op(&Op::Iota { axis: 1 }, &[&x], &mut Ctx::eval()).unwrap();
    assert_eq!(y.shape(), &[1, 5, 1]);
    assert_eq!(y.to_vec_f32().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn const_matches_reference() {
    check(&Op::Const { value: 0.8125 }, &[]);
    check(&Op::Const { value: -3.0 }, &[]);
}

#[test]
fn unary_ops_match_reference() {
    let mut rng = Rng::new(1);
    let x = rng.tensor_in(&[3, 7], -3.0, 3.0);
    for op in [
        Op::StopGradient,
        Op::Neg,
        Op::Relu,
        Op::Gelu,
        Op::GeluTanh,
        Op::Tanh,
        Op::Sin,
        Op::Cos,
        Op::Sigmoid,
        Op::Exp,
    ] {
        check(&op, &[&x]);
    }
}

#[test]
fn autocast_ops_match_reference_at_every_precision() {
    use rtx_ir::{AutocastMode, Precision};
    let mut rng = Rng::new(11);
    // Values spanning f16's subnormals, normals and overflow once scaled.
    let x = rng.tensor_in(&[4, 9], -3.0, 3.0);
    let tiny = x.mul(&Tensor::scalar(1e-6)).expect("scales");
    for precision in [Precision::F32, Precision::Bf16, Precision::F16] {
        for loss_scale in [1.0f32, 4096.0] {
            let mut ctx = Ctx::eval().with_precision(precision);
            ctx.set_loss_scale(loss_scale).expect("a power of two");
            for op in [Op::Autocast, Op::AutocastGrad] {
                for v in [&x, &tiny] {
                    let got = run_op(&op, &[v], &mut ctx).expect("runs");
                    let env = HashMap::new();
                    let want = reference::eval(
                        &op,
                        &[&to_array(v)],
                        &RefCtx {
                            env: &env,
                            train: false,
                            autocast: AutocastMode {
                                precision,
                                loss_scale,
                            },
                            seed: 0,
                        },
                    )
                    .expect("reference");
                    // The same rounding of the same f32 values: equal to the last bit.
                    assert_eq!(
                        to_array(&got).data,
                        want.data,
                        "{op:?} {precision:?} x{loss_scale}"
                    );
                }
            }
        }
    }
}

#[test]
fn log_and_sqrt_match_reference_on_positive_inputs() {
    let mut rng = Rng::new(2);
    let x = rng.tensor_in(&[4, 5], 0.05, 4.0);
    check(&Op::Log, &[&x]);
    check(&Op::Sqrt, &[&x]);
}

#[test]
fn pow_scalar_matches_reference() {
    let mut rng = Rng::new(3);
    let any = rng.tensor_in(&[2, 3, 4], -2.0, 2.0);
    let positive = rng.tensor_in(&[2, 3, 4], 0.1, 2.0);
    check(&Op::PowScalar { exponent: 2.0 }, &[&any]);
    check(&Op::PowScalar { exponent: 3.0 }, &[&any]);
    check(&Op::PowScalar { exponent: 0.5 }, &[&positive]);
    check(&Op::PowScalar { exponent: -1.5 }, &[&positive]);
}

#[test]
fn binary_ops_match_reference() {
    let mut rng = Rng::new(4);
    let a = rng.tensor(&[3, 5]);
    let b = rng.tensor_away_from_zero(&[3, 5], 0.25, 2.0);
    for op in [Op::Add, Op::Sub, Op::Mul, Op::Div] {
        check(&op, &[&a, &b]);
    }
}

#[test]
fn maximum_and_minimum_match_reference() {
    let mut rng = Rng::new(40);
    let a = rng.tensor(&[3, 5]);
    let b = rng.tensor(&[5]);
    let tied = a.clone();
    let p = permuted(&rng.tensor(&[5, 3]), &[1, 0]);
    for op in [Op::Maximum, Op::Minimum] {
        check(&op, &[&a, &b]);
        check(&op, &[&a, &tied]);
        check(&op, &[&p, &a]);
    }
}

#[test]
fn comparisons_match_reference() {
    let mut rng = Rng::new(41);
    let a = rng.tensor(&[4, 3]);
    let b = rng.tensor(&[3]);
    let half_equal = a.clone();
    for cmp in [Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le, Cmp::Eq, Cmp::Ne] {
        check(&Op::Compare { cmp }, &[&a, &b]);
        check(&Op::Compare { cmp }, &[&a, &half_equal]);
    }
}

#[test]
fn select_matches_reference() {
    let mut rng = Rng::new(42);
    let x = rng.tensor(&[4, 3]);
    let zero = Tensor::scalar(0.0);
    let cond = run_op(
        &Op::Compare { cmp: Cmp::Gt },
        &[&x, &zero],
        &mut Ctx::eval(),
    )
    .unwrap();
    let a = rng.tensor(&[4, 3]);
    let b = rng.tensor(&[3]);
    check(&Op::Select, &[&cond, &a, &b]);
    check(&Op::Select, &[&cond, &zero, &a]);
    let wide_cond = rng.tensor(&[2, 4, 3]);
    check(&Op::Select, &[&wide_cond, &a, &b]);
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let mut rng = Rng::new(5);
    let a = rng.tensor(&[2, 1, 5]);
    let b = rng.tensor_away_from_zero(&[3, 1], 0.25, 2.0);
    let s = Tensor::scalar(rng.uniform(0.5, 1.5));
    for op in [Op::Add, Op::Sub, Op::Mul, Op::Div] {
        check(&op, &[&a, &b]);
        check(&op, &[&b, &a]);
        check(&op, &[&a, &s]);
    }
}

// --- elementwise on views ---------------------------------------------------------------------

#[test]
fn unary_ops_read_permuted_views() {
    let mut rng = Rng::new(6);
    let x = permuted(&rng.tensor_in(&[4, 3, 5], -2.0, 2.0), &[2, 0, 1]);
    for op in [Op::Neg, Op::Relu, Op::Gelu, Op::Tanh, Op::Sigmoid, Op::Exp] {
        check(&op, &[&x]);
    }
}

#[test]
fn unary_ops_read_narrowed_views() {
    let mut rng = Rng::new(7);
    let x = narrowed(&rng.tensor_in(&[3, 9], 0.1, 2.0), 1, 3, 5);
    for op in [Op::Exp, Op::Log, Op::Sqrt, Op::PowScalar { exponent: 2.0 }] {
        check(&op, &[&x]);
    }
}

#[test]
fn binary_ops_read_strided_and_broadcast_operands() {
    let mut rng = Rng::new(8);
    let a = permuted(&rng.tensor(&[5, 4]), &[1, 0]);
    let b = broadcast(&rng.tensor_away_from_zero(&[1, 5], 0.25, 2.0), &[4, 5]);
    let c = narrowed(&rng.tensor_away_from_zero(&[6, 5], 0.25, 2.0), 0, 2, 4);
    for op in [Op::Add, Op::Sub, Op::Mul, Op::Div] {
        check(&op, &[&a, &b]);
        check(&op, &[&b, &a]);
        check(&op, &[&a, &c]);
    }
}

// --- reductions ---------------------------------------------------------------------------------

fn reductions(axes: &[usize], keepdim: bool) -> [Op; 3] {
    [
        Op::Sum {
            axes: axes.to_vec(),
            keepdim,
        },
        Op::Mean {
            axes: axes.to_vec(),
            keepdim,
        },
        Op::Max {
            axes: axes.to_vec(),
            keepdim,
        },
    ]
}

#[test]
fn reductions_match_reference() {
    let mut rng = Rng::new(9);
    let x = rng.tensor(&[2, 3, 4]);
    for axes in [vec![0], vec![1], vec![2], vec![0, 2], vec![0, 1, 2]] {
        for keepdim in [false, true] {
            for op in reductions(&axes, keepdim) {
                check(&op, &[&x]);
            }
        }
    }
}

#[test]
fn reductions_over_a_long_axis_match_reference() {
    let mut rng = Rng::new(10);
    let x = rng.tensor(&[3, 1000]);
    for op in reductions(&[1], false) {
        check(&op, &[&x]);
    }
}

#[test]
fn reductions_read_permuted_broadcast_and_narrowed_views() {
    let mut rng = Rng::new(11);
    let p = permuted(&rng.tensor(&[4, 2, 3]), &[1, 2, 0]);
    let b = broadcast(&rng.tensor(&[3, 1]), &[2, 3, 4]);
    let n = narrowed(&rng.tensor(&[2, 3, 7]), 2, 2, 4);
    for x in [&p, &b, &n] {
        for axes in [vec![0], vec![2], vec![1, 2]] {
            for op in reductions(&axes, false) {
                check(&op, &[x]);
            }
        }
    }
}

// --- matmul -------------------------------------------------------------------------------------

#[test]
fn matmul_matches_reference() {
    let mut rng = Rng::new(12);
    let (a, b) = (rng.tensor(&[3, 4]), rng.tensor(&[4, 5]));
    check_contraction(&Op::MatMul, &[&a, &b], 4);
    let (a, b) = (rng.tensor(&[17, 37]), rng.tensor(&[37, 19]));
    check_contraction(&Op::MatMul, &[&a, &b], 37);
    let (a, b) = (rng.tensor(&[33, 130]), rng.tensor(&[130, 70]));
    check_contraction(&Op::MatMul, &[&a, &b], 130);
}

// --- attention ----------------------------------------------------------------------------------

#[test]
fn attention_matches_reference() {
    let mut rng = Rng::new(81);
    for causal in [false, true] {
        // More keys than one block of the online softmax (32), and a length that is not a
        // multiple of it, so blocks are rescaled and the last one is partial.
        let (q, k, v) = (
            rng.tensor(&[2, 3, 45, 8]),
            rng.tensor(&[2, 3, 45, 8]),
            rng.tensor(&[2, 3, 45, 8]),
        );
        check_contraction(&Op::Attention { causal }, &[&q, &k, &v], 45);
        // Heads as split_heads gives them: a permuted, strided view.
        let qp = permuted(&rng.tensor(&[2, 45, 3, 8]), &[0, 2, 1, 3]);
        check_contraction(&Op::Attention { causal }, &[&qp, &k, &v], 45);
    }
    // Fewer queries than keys, and values of another width.
    let (q, k, v) = (
        rng.tensor(&[4, 1, 6]),
        rng.tensor(&[4, 70, 6]),
        rng.tensor(&[4, 70, 5]),
    );
    check_contraction(&Op::Attention { causal: false }, &[&q, &k, &v], 70);
    // Large scores: the online maximum keeps every exponential finite.
    let q = rng.tensor_in(&[1, 40, 4], 20.0, 30.0);
    let k = rng.tensor_in(&[1, 40, 4], -30.0, 30.0);
    let v = rng.tensor(&[1, 40, 4]);
    check_contraction(&Op::Attention { causal: true }, &[&q, &k, &v], 40);
}

#[test]
fn attention_grad_matches_reference() {
    let mut rng = Rng::new(82);
    for causal in [false, true] {
        let shape = [2, 2, 37, 8];
        let (q, k, v, g) = (
            rng.tensor(&shape),
            rng.tensor(&shape),
            rng.tensor(&shape),
            rng.tensor(&shape),
        );
        check_contraction(&Op::AttentionGrad { causal }, &[&q, &k, &v, &g], 37);
        let kp = permuted(&rng.tensor(&[2, 37, 2, 8]), &[0, 2, 1, 3]);
        check_contraction(&Op::AttentionGrad { causal }, &[&q, &kp, &v, &g], 37);
    }
}

#[test]
fn batched_matmul_broadcasts_batch_dims() {
    let mut rng = Rng::new(13);
    let (a, b) = (rng.tensor(&[2, 3, 4]), rng.tensor(&[2, 4, 5]));
    check_contraction(&Op::MatMul, &[&a, &b], 4);
    let (a, b) = (rng.tensor(&[2, 1, 3, 6]), rng.tensor(&[3, 6, 5]));
    check_contraction(&Op::MatMul, &[&a, &b], 6);
    let (a, b) = (rng.tensor(&[2, 3, 6]), rng.tensor(&[6, 5]));
    check_contraction(&Op::MatMul, &[&a, &b], 6);
}

#[test]
fn matmul_reads_transposed_operands() {
    let mut rng = Rng::new(14);
    let a = transposed_random(&mut rng, &[9, 21]);
    let b = transposed_random(&mut rng, &[21, 11]);
    let plain_b = rng.tensor(&[21, 11]);
    check_contraction(&Op::MatMul, &[&a, &b], 21);
    check_contraction(&Op::MatMul, &[&a, &plain_b], 21);
    let a3 = transposed_random(&mut rng, &[2, 5, 7]);
    let b3 = transposed_random(&mut rng, &[2, 7, 3]);
    check_contraction(&Op::MatMul, &[&a3, &b3], 7);
}

#[test]
fn matmul_reads_broadcast_and_narrowed_operands() {
    let mut rng = Rng::new(15);
    let a = rng.tensor(&[3, 4, 6]);
    let shared_b = broadcast(&rng.tensor(&[6, 5]), &[3, 6, 5]);
    check_contraction(&Op::MatMul, &[&a, &shared_b], 6);
    let rows = broadcast(&rng.tensor(&[1, 6]), &[4, 6]);
    let b = rng.tensor(&[6, 5]);
    check_contraction(&Op::MatMul, &[&rows, &b], 6);
    let window = narrowed(&rng.tensor(&[4, 10]), 1, 3, 6);
    check_contraction(&Op::MatMul, &[&window, &b], 6);
}

// --- convolution and pooling ------------------------------------------------------------------

#[test]
fn conv2d_matches_reference() {
    let mut rng = Rng::new(20);
    let x = rng.tensor(&[2, 3, 7, 6]);
    let w = rng.tensor(&[4, 3, 3, 3]);
    check_contraction(
        &Op::Conv2d {
            stride: [1, 1],
            padding: [0, 0],
        },
        &[&x, &w],
        27,
    );
    check_contraction(
        &Op::Conv2d {
            stride: [1, 1],
            padding: [1, 1],
        },
        &[&x, &w],
        27,
    );
    check_contraction(
        &Op::Conv2d {
            stride: [2, 1],
            padding: [1, 2],
        },
        &[&x, &w],
        27,
    );
    let w2 = rng.tensor(&[5, 3, 2, 4]);
    check_contraction(
        &Op::Conv2d {
            stride: [2, 3],
            padding: [0, 1],
        },
        &[&x, &w2],
        24,
    );
}

#[test]
fn conv2d_reads_a_permuted_input() {
    let mut rng = Rng::new(21);
    // Stored NHWC, viewed as NCHW.
    let x = permuted(&rng.tensor(&[2, 6, 5, 3]), &[0, 3, 1, 2]);
    let w = rng.tensor(&[4, 3, 3, 3]);
    check_contraction(
        &Op::Conv2d {
            stride: [1, 1],
            padding: [1, 1],
        },
        &[&x, &w],
        27,
    );
}

#[test]
fn conv2d_grad_input_matches_reference() {
    let mut rng = Rng::new(22);
    let x = rng.tensor(&[2, 3, 7, 6]);
    let w = rng.tensor(&[4, 3, 3, 3]);
    for (stride, padding, out) in [
        ([1, 1], [0, 0], [5, 4]),
        ([1, 1], [1, 1], [7, 6]),
        ([2, 1], [1, 2], [4, 8]),
    ] {
        let g = rng.tensor(&[2, 4, out[0], out[1]]);
        check_contraction(
            &Op::Conv2dGradInput { stride, padding },
            &[&g, &w, &x],
            4 * 9,
        );
    }
}

#[test]
fn conv2d_grad_weight_matches_reference() {
    let mut rng = Rng::new(23);
    let x = rng.tensor(&[2, 3, 7, 6]);
    let w = rng.tensor(&[4, 3, 3, 3]);
    for (stride, padding, out) in [
        ([1, 1], [0, 0], [5, 4]),
        ([1, 1], [1, 1], [7, 6]),
        ([2, 1], [1, 2], [4, 8]),
    ] {
        let g = rng.tensor(&[2, 4, out[0], out[1]]);
        check_contraction(
            &Op::Conv2dGradWeight { stride, padding },
            &[&x, &g, &w],
            2 * out[0] * out[1],
        );
    }
}

const POOLS: [([usize; 2], [usize; 2], [usize; 2]); 3] = [
    ([2, 2], [2, 2], [0, 0]),
    ([3, 3], [2, 2], [1, 1]),
    ([3, 2], [1, 2], [1, 0]),
];

/// Output height and width of a pooling window over `[h, w]`.
fn pooled(h: usize, w: usize, (k, s, p): ([usize; 2], [usize; 2], [usize; 2])) -> [usize; 2] {
    [
        (h + 2 * p[0] - k[0]) / s[0] + 1,
        (w + 2 * p[1] - k[1]) / s[1] + 1,
    ]
}

#[test]
fn max_pool2d_matches_reference() {
    let mut rng = Rng::new(24);
    let x = rng.tensor(&[2, 3, 7, 6]);
    let p = permuted(&rng.tensor(&[2, 7, 6, 3]), &[0, 3, 1, 2]);
    for (kernel, stride, padding) in POOLS {
        check(
            &Op::MaxPool2d {
                kernel,
                stride,
                padding,
            },
            &[&x],
        );
        check(
            &Op::MaxPool2d {
                kernel,
                stride,
                padding,
            },
            &[&p],
        );
    }
}

#[test]
fn avg_pool2d_matches_reference() {
    let mut rng = Rng::new(25);
    let x = rng.tensor(&[2, 3, 7, 6]);
    let p = permuted(&rng.tensor(&[2, 7, 6, 3]), &[0, 3, 1, 2]);
    for (kernel, stride, padding) in POOLS {
        check(
            &Op::AvgPool2d {
                kernel,
                stride,
                padding,
            },
            &[&x],
        );
        check(
            &Op::AvgPool2d {
                kernel,
                stride,
                padding,
            },
            &[&p],
        );
    }
}

#[test]
fn max_pool2d_grad_matches_reference() {
    let mut rng = Rng::new(26);
    let x = rng.tensor(&[2, 3, 7, 6]);
    for pool in POOLS {
        let [oh, ow] = pooled(7, 6, pool);
        let g = rng.tensor(&[2, 3, oh, ow]);
        let (kernel, stride, padding) = pool;
        check(
            &Op::MaxPool2dGrad {
                kernel,
                stride,
                padding,
            },
            &[&x, &g],
        );
    }
}

#[test]
fn avg_pool2d_grad_matches_reference() {
    let mut rng = Rng::new(27);
    let x = rng.tensor(&[2, 3, 7, 6]);
    for pool in POOLS {
        let [oh, ow] = pooled(7, 6, pool);
        let g = rng.tensor(&[2, 3, oh, ow]);
        let (kernel, stride, padding) = pool;
        check(
            &Op::AvgPool2dGrad {
                kernel,
                stride,
                padding,
            },
            &[&x, &g],
        );
    }
}

// --- embedding and dropout ------------------------------------------------------------------------

#[test]
fn embedding_matches_reference() {
    let mut rng = Rng::new(28);
    let table = rng.tensor(&[7, 4]);
    let ids = rng.ids(&[2, 5], 7);
    check(&Op::Embedding, &[&table, &ids]);
    let transposed = transposed_random(&mut rng, &[7, 4]);
    check(&Op::Embedding, &[&transposed, &ids]);
}

#[test]
fn embedding_grad_matches_reference() {
    let mut rng = Rng::new(29);
    let table = rng.tensor(&[4, 3]);
    // Ten ids over four rows: rows repeat, so their gradients must accumulate.
    let ids = rng.ids(&[2, 5], 4);
    let g = rng.tensor(&[2, 5, 3]);
    check(&Op::EmbeddingGrad, &[&g, &ids, &table]);
}

#[test]
fn pick_matches_reference() {
    let mut rng = Rng::new(18);
    let x = rng.tensor_in(&[2, 3, 5], -3.0, 3.0);
    let ids = rng.ids(&[2, 3], 5);
    check(&Op::Pick, &[&x, &ids]);
    let transposed = transposed_random(&mut rng, &[6, 5]);
    check(&Op::Pick, &[&transposed, &rng.ids(&[6], 5)]);
}

#[test]
fn pick_grad_matches_reference() {
    let mut rng = Rng::new(43);
    let x = rng.tensor(&[2, 3, 5]);
    let ids = rng.ids(&[2, 3], 5);
    let g = rng.tensor(&[2, 3]);
    check(&Op::PickGrad, &[&g, &ids, &x]);
    let transposed = transposed_random(&mut rng, &[2, 3]);
    check(&Op::PickGrad, &[&transposed, &ids, &x]);
}

#[test]
fn eval_mode_dropout_mask_is_ones_like_reference() {
    let mut rng = Rng::new(30);
    let x = rng.tensor(&[3, 4]);
    check(&Op::DropoutMask { p: 0.5 }, &[&x]);
    let mask = run_op(&Op::DropoutMask { p: 0.5 }, &[&x], &mut Ctx::eval()).unwrap();
    assert!(mask.to_vec_f32().unwrap().iter().all(|&v| v == 1.0));
}

fn train_mask(p: f64, n: usize, ctx: &mut Ctx) -> Vec<f32> {
    let x = Tensor::full(&[n], 1.5);
    run_op(&Op::DropoutMask { p }, &[&x], ctx)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

#[test]
fn train_mode_dropout_mask_holds_zero_or_inverse_keep_rate() {
    let p = 0.3;
    let mask = train_mask(p, 10_000, &mut Ctx::train(11));
    let keep = (1.0 / (1.0 - p)) as f32;
    assert!(
        mask.iter().all(|&v| v == 0.0 || v == keep),
        "a mask value is neither 0 nor {keep}"
    );
}

#[test]
fn train_mode_dropout_drops_about_p_of_the_elements() {
    for p in [0.1, 0.3, 0.5] {
        let mask = train_mask(p, 10_000, &mut Ctx::train(12));
        let dropped = mask.iter().filter(|&&v| v == 0.0).count() as f64 / mask.len() as f64;
        // The standard deviation of the fraction is at most 0.005 here.
        assert!((dropped - p).abs() < 0.025, "p = {p}: dropped {dropped}");
    }
}

#[test]
fn train_mode_dropout_with_zero_p_keeps_everything() {
    let mask = train_mask(0.0, 1000, &mut Ctx::train(13));
    assert!(mask.iter().all(|&v| v == 1.0));
}

#[test]
fn same_seed_gives_the_same_dropout_mask() {
    let a = train_mask(0.4, 10_000, &mut Ctx::train(14));
    let b = train_mask(0.4, 10_000, &mut Ctx::train(14));
    assert_eq!(a, b);
}

#[test]
fn different_seeds_and_successive_calls_give_different_masks() {
    let mut ctx = Ctx::train(15);
    let first = train_mask(0.4, 10_000, &mut ctx);
    let second = train_mask(0.4, 10_000, &mut ctx);
    let other_seed = train_mask(0.4, 10_000, &mut Ctx::train(16));
    assert_ne!(
        first, second,
        "two masks drawn from one context must differ"
    );
    assert_ne!(first, other_seed, "masks of different seeds must differ");
}

#[test]
fn train_mode_dropout_mask_has_the_reference_bits() {
    let p = 0.25;
    let mut ctx = Ctx::train(17);
    let seed = ctx.clone().next_seed();
    let x = Tensor::full(&[3, 500], 1.0);
    let got = run_op(&Op::DropoutMask { p }, &[&x], &mut ctx).unwrap();
    let env = HashMap::new();
    let want = reference::eval(
        &Op::DropoutMask { p },
        &[&to_array(&x)],
        &RefCtx {
            env: &env,
            train: true,
            autocast: rtx_ir::AutocastMode::OFF,
            seed,
        },
    )
    .unwrap();
    let got = to_array(&got).data;
    let zeros_differ = got
        .iter()
        .zip(&want.data)
        .filter(|(g, w)| (**g == 0.0) != (**w == 0.0))
        .count();
    assert_eq!(
        zeros_differ, 0,
        "the runtime mask drops other elements than the reference for the same seed"
    );
    assert_close(&got, &want.data, 0.0, 1e-6, "dropout mask");
}

// --- layout ops ---------------------------------------------------------------------------------

#[test]
fn reshape_matches_reference() {
    let mut rng = Rng::new(31);
    let x = rng.tensor(&[3, 4]);
    let to = |s: &[usize]| Op::Reshape {
        shape: s.iter().map(|&d| Dim::known(d)).collect(),
    };
    check(&to(&[2, 6]), &[&x]);
    check(&to(&[12]), &[&x]);
    check(&to(&[2, 1, 3, 2]), &[&x]);
    // A strided input must be read in its logical order, not its buffer order.
    let p = permuted(&rng.tensor(&[4, 3]), &[1, 0]);
    check(&to(&[2, 6]), &[&p]);
    check(&to(&[6, 2]), &[&narrowed(&rng.tensor(&[5, 4]), 0, 1, 3)]);
}

#[test]
fn permute_matches_reference() {
    let mut rng = Rng::new(32);
    let x = rng.tensor(&[2, 3, 4]);
    for perm in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1]] {
        check(
            &Op::Permute {
                perm: perm.to_vec(),
            },
            &[&x],
        );
    }
    let p = permuted(&x, &[2, 0, 1]);
    check(
        &Op::Permute {
            perm: vec![1, 0, 2],
        },
        &[&p],
    );
}

#[test]
fn concat_matches_reference() {
    let mut rng = Rng::new(33);
    let (a, b, c) = (
        rng.tensor(&[2, 3]),
        rng.tensor(&[2, 1]),
        rng.tensor(&[2, 4]),
    );
    check(&Op::Concat { axis: 1 }, &[&a, &b, &c]);
    let (d, e) = (rng.tensor(&[1, 3]), rng.tensor(&[4, 3]));
    check(&Op::Concat { axis: 0 }, &[&a, &d, &e]);
    check(&Op::Concat { axis: 0 }, &[&a]);
}

#[test]
fn concat_reads_strided_broadcast_and_narrowed_parts() {
    let mut rng = Rng::new(34);
    let p = permuted(&rng.tensor(&[3, 2]), &[1, 0]);
    let b = broadcast(&rng.tensor(&[2, 1]), &[2, 4]);
    let n = narrowed(&rng.tensor(&[2, 8]), 1, 5, 3);
    check(&Op::Concat { axis: 1 }, &[&p, &b, &n]);
    check(&Op::Concat { axis: 0 }, &[&p, &n]);
}

#[test]
fn narrow_matches_reference() {
    let mut rng = Rng::new(35);
    let x = rng.tensor(&[3, 5, 4]);
    check(
        &Op::Narrow {
            axis: 0,
            start: 1,
            len: 2,
        },
        &[&x],
    );
    check(
        &Op::Narrow {
            axis: 1,
            start: 2,
            len: 3,
        },
        &[&x],
    );
    check(
        &Op::Narrow {
            axis: 2,
            start: 0,
            len: 1,
        },
        &[&x],
    );
    // Narrowing a narrowed, permuted view composes offsets and strides.
    let v = narrowed(&permuted(&x, &[2, 0, 1]), 2, 1, 4);
    check(
        &Op::Narrow {
            axis: 0,
            start: 1,
            len: 3,
        },
        &[&v],
    );
}

#[test]
fn broadcast_to_matches_reference() {
    let mut rng = Rng::new(36);
    let x = rng.tensor(&[3, 1]);
    check(&Op::BroadcastTo, &[&x, &rng.tensor(&[2, 3, 4])]);
    let s = Tensor::scalar(rng.uniform(-1.0, 1.0));
    check(&Op::BroadcastTo, &[&s, &rng.tensor(&[2, 2])]);
    // A [3, 1] column of a transposed buffer: strided and at an offset.
    let column = narrowed(&permuted(&rng.tensor(&[4, 3]), &[1, 0]), 1, 2, 1);
    check(&Op::BroadcastTo, &[&column, &rng.tensor(&[5, 3, 2])]);
}

#[test]
fn sum_to_matches_reference() {
    let mut rng = Rng::new(37);
    let g = rng.tensor(&[2, 3, 4]);
    check(&Op::SumTo, &[&g, &rng.tensor(&[3, 1])]);
    check(&Op::SumTo, &[&g, &rng.tensor(&[4])]);
    check(&Op::SumTo, &[&g, &rng.tensor(&[1, 3, 4])]);
    check(&Op::SumTo, &[&g, &Tensor::scalar(1.0)]);
    check(&Op::SumTo, &[&g, &g]);
    let p = permuted(&rng.tensor(&[4, 2, 3]), &[1, 2, 0]);
    check(&Op::SumTo, &[&p, &rng.tensor(&[2, 1, 4])]);
}

#[test]
fn concat_grad_matches_reference() {
    let mut rng = Rng::new(39);
    let parts = [
        rng.tensor(&[2, 3]),
        rng.tensor(&[2, 1]),
        rng.tensor(&[2, 4]),
    ];
    let g = rng.tensor(&[2, 8]);
    let args: Vec<&Tensor> = std::iter::once(&g).chain(&parts).collect();
    for index in 0..3 {
        check(&Op::ConcatGrad { axis: 1, index }, &args);
    }
    let gt = permuted(&rng.tensor(&[8, 2]), &[1, 0]);
    check(
        &Op::ConcatGrad { axis: 1, index: 2 },
        &[&gt, &parts[0], &parts[1], &parts[2]],
    );
}

#[test]
fn pad_narrow_matches_reference() {
    let mut rng = Rng::new(38);
    let full = rng.tensor(&[2, 7]);
    check(
        &Op::PadNarrow { axis: 1, start: 2 },
        &[&rng.tensor(&[2, 3]), &full],
    );
    check(
        &Op::PadNarrow { axis: 1, start: 0 },
        &[&rng.tensor(&[2, 7]), &full],
    );
    check(
        &Op::PadNarrow { axis: 0, start: 1 },
        &[&rng.tensor(&[1, 7]), &full],
    );
    let p = permuted(&rng.tensor(&[4, 2]), &[1, 0]);
    check(&Op::PadNarrow { axis: 1, start: 3 }, &[&p, &full]);
}

// --- backward-only ops --------------------------------------------------------------------------

#[test]
fn relu_grad_and_gelu_grad_match_reference() {
    let mut rng = Rng::new(39);
    let x = rng.tensor_in(&[3, 6], -3.0, 3.0);
    let g = rng.tensor(&[3, 6]);
    check(&Op::ReluGrad, &[&x, &g]);
    check(&Op::GeluGrad, &[&x, &g]);
    check(&Op::GeluTanhGrad, &[&x, &g]);
    let gt = permuted(&rng.tensor(&[6, 3]), &[1, 0]);
    check(&Op::ReluGrad, &[&x, &gt]);
    check(&Op::GeluGrad, &[&x, &gt]);
    check(&Op::GeluTanhGrad, &[&x, &gt]);
}

#[test]
fn mean_grad_matches_reference() {
    let mut rng = Rng::new(40);
    let x = rng.tensor(&[2, 3, 4]);
    check(
        &Op::MeanGrad {
            axes: vec![1],
            keepdim: false,
        },
        &[&x, &rng.tensor(&[2, 4])],
    );
    check(
        &Op::MeanGrad {
            axes: vec![1],
            keepdim: true,
        },
        &[&x, &rng.tensor(&[2, 1, 4])],
    );
    check(
        &Op::MeanGrad {
            axes: vec![0, 2],
            keepdim: false,
        },
        &[&x, &rng.tensor(&[3])],
    );
    check(
        &Op::MeanGrad {
            axes: vec![0, 1, 2],
            keepdim: false,
        },
        &[&x, &Tensor::scalar(rng.uniform(-1.0, 1.0))],
    );
}

#[test]
fn max_grad_matches_reference() {
    let mut rng = Rng::new(41);
    let x = rng.tensor(&[2, 3, 4]);
    check(
        &Op::MaxGrad {
            axes: vec![1],
            keepdim: false,
        },
        &[&x, &rng.tensor(&[2, 4])],
    );
    check(
        &Op::MaxGrad {
            axes: vec![2],
            keepdim: true,
        },
        &[&x, &rng.tensor(&[2, 3, 1])],
    );
    check(
        &Op::MaxGrad {
            axes: vec![0, 1, 2],
            keepdim: false,
        },
        &[&x, &Tensor::scalar(rng.uniform(-1.0, 1.0))],
    );
    let p = permuted(&rng.tensor(&[4, 2, 3]), &[1, 2, 0]);
    check(
        &Op::MaxGrad {
            axes: vec![0],
            keepdim: false,
        },
        &[&p, &rng.tensor(&[3, 4])],
    );
}
