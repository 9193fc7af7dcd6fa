//! Forward values of the float64 reference against hand-computed numbers, and its errors on
//! bad input (which must be `Err`, never a panic).

use rtx_ir::reference::{self, Array, RefCtx, dropout_uniform};
use rtx_ir::{DType, Dim, Graph, Op, Unifier};
use std::collections::HashMap;

fn arr(shape: &[usize], data: &[f64]) -> Array {
    Array::new(shape.to_vec(), data.to_vec())
}

fn eval_in(
    op: Op,
    args: &[&Array],
    env: &HashMap<String, i64>,
    train: bool,
    seed: u64,
) -> Result<Array, String> {
    reference::eval(
        &op,
        args,
        &RefCtx {
            env,
            train,
            autocast: rtx_ir::AutocastMode::OFF,
            seed,
        },
    )
}

fn eval(op: Op, args: &[&Array]) -> Result<Array, String> {
    eval_in(op, args, &HashMap::new(), false, 0)
}

fn ok(op: Op, args: &[&Array]) -> Array {
    let name = op.name();
    eval(op, args).unwrap_or_else(|e| panic!("{name} failed: {e}"))
}

fn assert_close(got: &Array, shape: &[usize], want: &[f64]) {
    assert_eq!(got.shape, shape, "shape");
    assert_eq!(got.data.len(), want.len(), "element count");
    for (i, (g, w)) in got.data.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "element {i}: got {g}, want {w} (all: {:?})",
            got.data
        );
    }
}

fn err_contains(r: Result<Array, String>, needle: &str) {
    match r {
        Ok(a) => panic!("expected an error mentioning `{needle}`, got {a:?}"),
        Err(e) => assert!(
            e.contains(needle),
            "error `{e}` does not mention `{needle}`"
        ),
    }
}

// --- elementwise --------------------------------------------------------------------------

#[test]
fn add_broadcasts_like_numpy() {
    let a = arr(&[2, 1], &[10.0, 20.0]);
    let b = arr(&[3], &[1.0, 2.0, 3.0]);
    assert_close(
        &ok(Op::Add, &[&a, &b]),
        &[2, 3],
        &[11.0, 12.0, 13.0, 21.0, 22.0, 23.0],
    );
    assert_close(
        &ok(Op::Sub, &[&b, &a]),
        &[2, 3],
        &[-9.0, -8.0, -7.0, -19.0, -18.0, -17.0],
    );
}

#[test]
fn scalar_operand_broadcasts_to_every_element() {
    let x = arr(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert_close(
        &ok(Op::Div, &[&x, &Array::scalar(2.0)]),
        &[2, 2],
        &[0.5, 1.0, 1.5, 2.0],
    );
}

#[test]
fn gelu_is_the_exact_erf_form() {
    let x = arr(&[3], &[-1.0, 0.0, 1.0]);
    // x * Phi(x) with Phi(1) = 0.8413447460685429.
    assert_close(
        &ok(Op::Gelu, &[&x]),
        &[3],
        &[-0.15865525393145707, 0.0, 0.8413447460685429],
    );
}

#[test]
fn gelu_grad_is_cdf_plus_x_times_density() {
    let x = arr(&[2], &[0.0, 1.0]);
    let g = arr(&[2], &[2.0, 1.0]);
    // Phi(0) = 0.5; Phi(1) + phi(1) = 0.8413447460685429 + 0.24197072451914337.
    assert_close(
        &ok(Op::GeluGrad, &[&x, &g]),
        &[2],
        &[1.0, 1.0833154705876864],
    );
}

#[test]
fn relu_and_its_grad_treat_zero_as_inactive() {
    let x = arr(&[3], &[-2.0, 0.0, 3.0]);
    assert_close(&ok(Op::Relu, &[&x]), &[3], &[0.0, 0.0, 3.0]);
    let g = arr(&[3], &[5.0, 5.0, 5.0]);
    assert_close(&ok(Op::ReluGrad, &[&x, &g]), &[3], &[0.0, 0.0, 5.0]);
}

#[test]
fn sigmoid_tanh_and_pow_match_std() {
    let x = arr(&[2], &[-0.5, 2.0]);
    let s = ok(Op::Sigmoid, &[&x]);
    assert_close(
        &s,
        &[2],
        &[1.0 / (1.0 + 0.5f64.exp()), 1.0 / (1.0 + (-2.0f64).exp())],
    );
    assert_close(
        &ok(Op::Tanh, &[&x]),
        &[2],
        &[(-0.5f64).tanh(), 2.0f64.tanh()],
    );
    assert_close(
        &ok(Op::PowScalar { exponent: 3.0 }, &[&x]),
        &[2],
        &[-0.125, 8.0],
    );
}

// --- reductions ---------------------------------------------------------------------------

#[test]
fn sum_mean_max_reduce_the_given_axes_with_and_without_keepdim() {
    // [[1, 5, 3], [4, 2, 6]]
    let x = arr(&[2, 3], &[1.0, 5.0, 3.0, 4.0, 2.0, 6.0]);
    assert_close(
        &ok(
            Op::Sum {
                axes: vec![1],
                keepdim: false,
            },
            &[&x],
        ),
        &[2],
        &[9.0, 12.0],
    );
    assert_close(
        &ok(
            Op::Sum {
                axes: vec![0],
                keepdim: true,
            },
            &[&x],
        ),
        &[1, 3],
        &[5.0, 7.0, 9.0],
    );
    assert_close(
        &ok(
            Op::Mean {
                axes: vec![0, 1],
                keepdim: false,
            },
            &[&x],
        ),
        &[],
        &[3.5],
    );
    assert_close(
        &ok(
            Op::Mean {
                axes: vec![0, 1],
                keepdim: true,
            },
            &[&x],
        ),
        &[1, 1],
        &[3.5],
    );
    assert_close(
        &ok(
            Op::Max {
                axes: vec![1],
                keepdim: true,
            },
            &[&x],
        ),
        &[2, 1],
        &[5.0, 6.0],
    );
    assert_close(
        &ok(
            Op::Max {
                axes: vec![0],
                keepdim: false,
            },
            &[&x],
        ),
        &[3],
        &[4.0, 5.0, 6.0],
    );
}

#[test]
fn max_grad_routes_to_the_first_of_tied_maxima() {
    let x = arr(&[2, 3], &[1.0, 3.0, 3.0, 7.0, 7.0, 7.0]);
    let g = arr(&[2], &[10.0, 20.0]);
    let got = ok(
        Op::MaxGrad {
            axes: vec![1],
            keepdim: false,
        },
        &[&x, &g],
    );
    assert_close(&got, &[2, 3], &[0.0, 10.0, 0.0, 20.0, 0.0, 0.0]);
}

#[test]
fn max_propagates_nan() {
    let x = arr(&[3], &[1.0, f64::NAN, 5.0]);
    assert!(
        ok(
            Op::Max {
                axes: vec![0],
                keepdim: false
            },
            &[&x]
        )
        .data[0]
            .is_nan()
    );
}

#[test]
fn mean_grad_spreads_the_gradient_evenly() {
    let x_like = Array::zeros(vec![2, 2]);
    let g = arr(&[2, 1], &[4.0, 8.0]);
    let got = ok(
        Op::MeanGrad {
            axes: vec![1],
            keepdim: true,
        },
        &[&x_like, &g],
    );
    assert_close(&got, &[2, 2], &[2.0, 2.0, 4.0, 4.0]);
}

// --- linear algebra, softmax, losses ------------------------------------------------------

#[test]
fn matmul_of_two_matrices() {
    let a = arr(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = arr(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    assert_close(
        &ok(Op::MatMul, &[&a, &b]),
        &[2, 2],
        &[19.0, 22.0, 43.0, 50.0],
    );
}

#[test]
fn matmul_broadcasts_a_matrix_over_the_batch() {
    // Batch of [I, 2I] times B gives [B, 2B].
    let a = arr(&[2, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]);
    let b = arr(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let got = ok(Op::MatMul, &[&a, &b]);
    assert_close(
        &got,
        &[2, 2, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0],
    );
}

#[test]
fn pick_reads_one_element_of_each_last_axis_row() {
    let x = arr(
        &[2, 2, 3],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0],
    );
    let ids = arr(&[2, 2], &[2.0, 0.0, 1.0, 1.0]);
    assert_close(&ok(Op::Pick, &[&x, &ids]), &[2, 2], &[2.0, 3.0, 7.0, 10.0]);
}

#[test]
fn pick_grad_places_the_gradient_at_the_picked_positions() {
    let x = Array::zeros(vec![2, 3]);
    let ids = arr(&[2], &[1.0, 2.0]);
    let g = arr(&[2], &[5.0, -1.0]);
    assert_close(
        &ok(Op::PickGrad, &[&g, &ids, &x]),
        &[2, 3],
        &[0.0, 5.0, 0.0, 0.0, 0.0, -1.0],
    );
}

// --- convolution and pooling --------------------------------------------------------------

fn one_to_nine() -> Array {
    arr(
        &[1, 1, 3, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    )
}

#[test]
fn conv2d_with_a_centred_unit_kernel_and_padding_one_is_the_identity() {
    let mut w = Array::zeros(vec![1, 1, 3, 3]);
    w.data[4] = 1.0;
    let got = ok(
        Op::Conv2d {
            stride: [1, 1],
            padding: [1, 1],
        },
        &[&one_to_nine(), &w],
    );
    assert_close(&got, &[1, 1, 3, 3], &one_to_nine().data);
}

#[test]
fn conv2d_with_a_ones_kernel_sums_each_window() {
    let w = arr(&[1, 1, 2, 2], &[1.0; 4]);
    let got = ok(
        Op::Conv2d {
            stride: [1, 1],
            padding: [0, 0],
        },
        &[&one_to_nine(), &w],
    );
    assert_close(&got, &[1, 1, 2, 2], &[12.0, 16.0, 24.0, 28.0]);
}

#[test]
fn conv2d_with_stride_two_and_padding_skips_and_zero_pads() {
    // Windows centred on the corners of the 3x3 input see only the 2x2 corner blocks.
    let w = arr(&[2, 1, 3, 3], &[[1.0; 9], [-1.0; 9]].concat());
    let got = ok(
        Op::Conv2d {
            stride: [2, 2],
            padding: [1, 1],
        },
        &[&one_to_nine(), &w],
    );
    assert_close(
        &got,
        &[1, 2, 2, 2],
        &[12.0, 16.0, 24.0, 28.0, -12.0, -16.0, -24.0, -28.0],
    );
}

#[test]
fn conv2d_grads_are_the_adjoints_of_conv2d() {
    // <conv(x, w), g> = <x, grad_input(g, w)> = <w, grad_weight(x, g)> for any x, w, g.
    let x = arr(
        &[1, 2, 4, 3],
        &(0..24).map(|i| (i as f64 * 0.37).sin()).collect::<Vec<_>>(),
    );
    let w = arr(
        &[3, 2, 3, 2],
        &(0..36).map(|i| (i as f64 * 0.71).cos()).collect::<Vec<_>>(),
    );
    let (stride, padding) = ([2, 1], [1, 0]);
    let y = ok(Op::Conv2d { stride, padding }, &[&x, &w]);
    let g = Array::new(
        y.shape.clone(),
        (0..y.data.len()).map(|i| 1.0 + i as f64 * 0.1).collect(),
    );
    let dot = |a: &Array, b: &Array| a.data.iter().zip(&b.data).map(|(p, q)| p * q).sum::<f64>();
    let gx = ok(Op::Conv2dGradInput { stride, padding }, &[&g, &w, &x]);
    let gw = ok(Op::Conv2dGradWeight { stride, padding }, &[&x, &g, &w]);
    assert_eq!(
        (gx.shape.clone(), gw.shape.clone()),
        (x.shape.clone(), w.shape.clone())
    );
    assert!((dot(&y, &g) - dot(&x, &gx)).abs() < 1e-10);
    assert!((dot(&y, &g) - dot(&w, &gw)).abs() < 1e-10);
}

#[test]
fn max_pool2d_picks_the_maximum_of_each_window() {
    let x = arr(
        &[1, 1, 4, 4],
        &[
            1.0, 9.0, 2.0, 3.0, 4.0, 0.0, 8.0, 1.0, 5.0, 6.0, 0.0, 0.0, 7.0, 1.0, 2.0, 3.0,
        ],
    );
    let got = ok(
        Op::MaxPool2d {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        },
        &[&x],
    );
    assert_close(&got, &[1, 1, 2, 2], &[9.0, 8.0, 7.0, 3.0]);
}

#[test]
fn max_pool2d_padding_never_wins_over_negative_values() {
    let x = arr(&[1, 1, 2, 2], &[-4.0, -3.0, -2.0, -1.0]);
    let got = ok(
        Op::MaxPool2d {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [1, 1],
        },
        &[&x],
    );
    assert_close(
        &got,
        &[1, 1, 3, 3],
        &[-4.0, -3.0, -3.0, -2.0, -1.0, -1.0, -2.0, -1.0, -1.0],
    );
}

#[test]
fn max_pool2d_grad_accumulates_over_overlapping_windows() {
    // Every 2x2 window with stride 1 over this input has its maximum at the centre.
    let x = arr(
        &[1, 1, 3, 3],
        &[0.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0],
    );
    let g = arr(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let got = ok(
        Op::MaxPool2dGrad {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [0, 0],
        },
        &[&x, &g],
    );
    assert_close(
        &got,
        &[1, 1, 3, 3],
        &[0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0, 0.0],
    );
}

#[test]
fn max_pool2d_grad_routes_ties_to_the_first_in_the_window() {
    let x = arr(&[1, 1, 2, 2], &[5.0, 5.0, 5.0, 5.0]);
    let g = arr(&[1, 1, 1, 1], &[1.0]);
    let got = ok(
        Op::MaxPool2dGrad {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        },
        &[&x, &g],
    );
    assert_close(&got, &[1, 1, 2, 2], &[1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn avg_pool2d_counts_padding_as_zeros() {
    let x = arr(&[1, 1, 2, 2], &[1.0; 4]);
    let got = ok(
        Op::AvgPool2d {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [1, 1],
        },
        &[&x],
    );
    assert_close(
        &got,
        &[1, 1, 3, 3],
        &[0.25, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.5, 0.25],
    );
    let back = ok(
        Op::AvgPool2dGrad {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [1, 1],
        },
        &[&x, &arr(&[1, 1, 3, 3], &[1.0; 9])],
    );
    // Each input sits in 4 windows, each passing back 1/4.
    assert_close(&back, &[1, 1, 2, 2], &[1.0; 4]);
}

// --- embedding, dropout -------------------------------------------------------------------

#[test]
fn embedding_gathers_rows_and_its_grad_scatters_them_back() {
    let table = arr(&[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let ids = arr(&[2, 2], &[2.0, 0.0, 2.0, 1.0]);
    let got = ok(Op::Embedding, &[&table, &ids]);
    assert_close(
        &got,
        &[2, 2, 2],
        &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0],
    );
    let g = arr(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let back = ok(Op::EmbeddingGrad, &[&g, &ids, &table]);
    assert_close(&back, &[3, 2], &[3.0, 4.0, 7.0, 8.0, 6.0, 8.0]);
}

#[test]
fn dropout_uniform_is_the_splitmix64_sequence() {
    // Element i uses the (i+1)-th output of splitmix64 seeded with `seed`; the first output
    // for seed 0 is the published test value 0xE220A8397B1DCDAF.
    assert_eq!(
        dropout_uniform(0, 0),
        (0xE220_A839_7B1D_CDAFu64 >> 40) as f64 / (1u64 << 24) as f64
    );
}

#[test]
fn dropout_mask_is_deterministic_for_a_seed() {
    let x = Array::zeros(vec![64]);
    let env = HashMap::new();
    let a = eval_in(Op::DropoutMask { p: 0.5 }, &[&x], &env, true, 7).unwrap();
    let b = eval_in(Op::DropoutMask { p: 0.5 }, &[&x], &env, true, 7).unwrap();
    let c = eval_in(Op::DropoutMask { p: 0.5 }, &[&x], &env, true, 8).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c, "a different seed should give a different mask");
}

#[test]
fn dropout_mask_drops_about_p_and_scales_the_rest() {
    let p = 0.3;
    let x = Array::zeros(vec![100, 100]);
    let m = eval_in(Op::DropoutMask { p }, &[&x], &HashMap::new(), true, 12345).unwrap();
    let dropped = m.data.iter().filter(|&&v| v == 0.0).count();
    // The standard deviation of the dropped fraction is sqrt(p(1-p)/n) ~ 0.0046.
    assert!(
        (dropped as f64 / 1e4 - p).abs() < 0.025,
        "dropped {dropped} of 10000"
    );
    assert!(m.data.iter().all(|&v| v == 0.0 || v == 1.0 / (1.0 - p)));
}

#[test]
fn dropout_mask_is_all_ones_in_eval_mode() {
    let x = arr(&[2, 3], &[1.0; 6]);
    let m = eval_in(Op::DropoutMask { p: 0.9 }, &[&x], &HashMap::new(), false, 1).unwrap();
    assert_eq!(m, arr(&[2, 3], &[1.0; 6]));
}

// --- layout -------------------------------------------------------------------------------

#[test]
fn reshape_evaluates_symbolic_dims_from_the_env() {
    let x = arr(
        &[2, 6],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0],
    );
    let env = HashMap::from([("B".to_string(), 2), ("C".to_string(), 3)]);
    let shape = vec![Dim::sym("B"), Dim::param("C"), Dim::known(2)];
    let got = eval_in(Op::Reshape { shape }, &[&x], &env, false, 0).unwrap();
    assert_eq!(got.shape, vec![2, 3, 2]);
    assert_eq!(got.data, x.data);
}

#[test]
fn permute_moves_axis_k_of_the_input_to_position_of_k_in_perm() {
    // x[i, j, k] = 100 i + 10 j + k with shape [2, 3, 2]; out[a, b, c] = x[b, c, a].
    let data: Vec<f64> = (0..12)
        .map(|f| (100 * (f / 6) + 10 * ((f / 2) % 3) + f % 2) as f64)
        .collect();
    let x = arr(&[2, 3, 2], &data);
    let got = ok(
        Op::Permute {
            perm: vec![2, 0, 1],
        },
        &[&x],
    );
    assert_eq!(got.shape, vec![2, 2, 3]);
    let want: Vec<f64> = [0, 10, 20, 100, 110, 120, 1, 11, 21, 101, 111, 121]
        .iter()
        .map(|&v| v as f64)
        .collect();
    assert_close(&got, &[2, 2, 3], &want);
}

#[test]
fn concat_narrow_and_pad_narrow_agree() {
    let a = arr(&[2, 1], &[1.0, 2.0]);
    let b = arr(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let cat = ok(Op::Concat { axis: 1 }, &[&a, &b]);
    assert_close(&cat, &[2, 3], &[1.0, 3.0, 4.0, 2.0, 5.0, 6.0]);
    assert_eq!(
        ok(
            Op::Narrow {
                axis: 1,
                start: 1,
                len: 2
            },
            &[&cat]
        ),
        b
    );
    assert_close(
        &ok(Op::PadNarrow { axis: 1, start: 1 }, &[&b, &cat]),
        &[2, 3],
        &[0.0, 3.0, 4.0, 0.0, 5.0, 6.0],
    );
    let rows = ok(Op::Concat { axis: 0 }, &[&b, &b]);
    assert_close(&rows, &[4, 2], &[3.0, 4.0, 5.0, 6.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn sum_to_undoes_broadcast_to_by_summing() {
    let x = arr(&[2, 1], &[1.0, 2.0]);
    let like = Array::zeros(vec![3, 2, 2]);
    let big = ok(Op::BroadcastTo, &[&x, &like]);
    assert_close(
        &big,
        &[3, 2, 2],
        &[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0],
    );
    assert_close(&ok(Op::SumTo, &[&big, &x]), &[2, 1], &[6.0, 12.0]);
}

#[test]
fn const_is_a_scalar() {
    assert_eq!(ok(Op::Const { value: 2.5 }, &[]), Array::scalar(2.5));
}

// --- run ----------------------------------------------------------------------------------

fn input(g: &mut Graph, u: &mut Unifier, index: usize, shape: Vec<Dim>, dtype: DType) -> usize {
    g.push(
        Op::Input {
            index,
            name: format!("x{index}"),
            shape,
            dtype,
        },
        &[],
        u,
    )
    .unwrap()
}

#[test]
fn run_evaluates_every_node_and_binds_symbols_from_inputs() {
    let (mut g, mut u) = (Graph::default(), Unifier::default());
    let x = input(
        &mut g,
        &mut u,
        0,
        vec![Dim::sym("B"), Dim::known(2)],
        DType::F32,
    );
    let w = g
        .push(
            Op::Param {
                name: "w".into(),
                shape: vec![Dim::known(2), Dim::known(1)],
            },
            &[],
            &mut u,
        )
        .unwrap();
    let y = g.push(Op::MatMul, &[x, w], &mut u).unwrap();
    let flat = g
        .push(
            Op::Reshape {
                shape: vec![Dim::sym("B")],
            },
            &[y],
            &mut u,
        )
        .unwrap();
    let env = HashMap::new();
    let params = |name: &str| (name == "w").then(|| arr(&[2, 1], &[1.0, 10.0]));
    let ctx = RefCtx {
        env: &env,
        train: false,
        autocast: rtx_ir::AutocastMode::OFF,
        seed: 0,
    };
    let values = reference::run(
        &g,
        &[arr(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])],
        &params,
        &ctx,
    )
    .unwrap();
    assert_eq!(values.len(), 4);
    assert_close(&values[flat], &[3], &[21.0, 43.0, 65.0]);
}

#[test]
fn run_reports_missing_inputs_and_params() {
    let (mut g, mut u) = (Graph::default(), Unifier::default());
    input(&mut g, &mut u, 0, vec![Dim::known(2)], DType::F32);
    let env = HashMap::new();
    let ctx = RefCtx {
        env: &env,
        train: false,
        autocast: rtx_ir::AutocastMode::OFF,
        seed: 0,
    };
    let e = reference::run(&g, &[], &|_| None, &ctx).unwrap_err();
    assert!(e.contains("input 0"), "{e}");
    g.push(
        Op::Param {
            name: "fc.bias".into(),
            shape: vec![Dim::known(2)],
        },
        &[],
        &mut u,
    )
    .unwrap();
    let e = reference::run(&g, &[arr(&[2], &[1.0, 2.0])], &|_| None, &ctx).unwrap_err();
    assert!(e.contains("fc.bias"), "{e}");
}

#[test]
fn run_rejects_an_input_that_does_not_fit_its_declared_shape() {
    let (mut g, mut u) = (Graph::default(), Unifier::default());
    input(
        &mut g,
        &mut u,
        0,
        vec![Dim::sym("B"), Dim::known(4)],
        DType::F32,
    );
    let env = HashMap::new();
    let ctx = RefCtx {
        env: &env,
        train: false,
        autocast: rtx_ir::AutocastMode::OFF,
        seed: 0,
    };
    let e = reference::run(&g, &[arr(&[2, 3], &[0.0; 6])], &|_| None, &ctx).unwrap_err();
    assert!(e.contains("[B, 4]"), "{e}");
}

#[test]
fn run_rejects_a_non_integer_label() {
    let (mut g, mut u) = (Graph::default(), Unifier::default());
    input(&mut g, &mut u, 0, vec![Dim::known(2)], DType::I64);
    let env = HashMap::new();
    let ctx = RefCtx {
        env: &env,
        train: false,
        autocast: rtx_ir::AutocastMode::OFF,
        seed: 0,
    };
    assert!(reference::run(&g, &[arr(&[2], &[1.0, 0.5])], &|_| None, &ctx).is_err());
}

// --- errors, never panics -----------------------------------------------------------------

#[test]
fn pick_index_out_of_range_is_an_error() {
    let x = Array::zeros(vec![2, 3]);
    for bad in [3.0, -1.0, 1.5, f64::NAN] {
        let ids = arr(&[2], &[0.0, bad]);
        err_contains(eval(Op::Pick, &[&x, &ids]), "out of range");
        err_contains(
            eval(Op::PickGrad, &[&arr(&[2], &[1.0, 1.0]), &ids, &x]),
            "out of range",
        );
    }
    err_contains(eval(Op::Pick, &[&x, &arr(&[3], &[0.0; 3])]), "one per row");
}

#[test]
fn embedding_id_out_of_range_is_an_error() {
    let table = Array::zeros(vec![3, 2]);
    err_contains(
        eval(Op::Embedding, &[&table, &arr(&[2], &[0.0, 3.0])]),
        "out of range",
    );
    err_contains(
        eval(
            Op::EmbeddingGrad,
            &[&Array::zeros(vec![2, 2]), &arr(&[2], &[0.0, -1.0]), &table],
        ),
        "out of range",
    );
}

#[test]
fn shape_problems_are_errors() {
    let m23 = Array::zeros(vec![2, 3]);
    let v3 = Array::zeros(vec![3]);
    err_contains(eval(Op::MatMul, &[&m23, &m23]), "inner");
    err_contains(eval(Op::MatMul, &[&v3, &m23]), "rank");
    err_contains(eval(Op::Add, &[&m23, &Array::zeros(vec![2])]), "broadcast");
    err_contains(
        eval(
            Op::Reshape {
                shape: vec![Dim::known(4)],
            },
            &[&m23],
        ),
        "number of elements",
    );
    err_contains(
        eval(
            Op::Reshape {
                shape: vec![Dim::sym("B"), Dim::known(3)],
            },
            &[&m23],
        ),
        "no value",
    );
    err_contains(
        eval(
            Op::Sum {
                axes: vec![2],
                keepdim: false,
            },
            &[&m23],
        ),
        "out of range",
    );
    err_contains(
        eval(Op::Permute { perm: vec![0, 0] }, &[&m23]),
        "permutation",
    );
    err_contains(
        eval(
            Op::Narrow {
                axis: 1,
                start: 2,
                len: 2,
            },
            &[&m23],
        ),
        "out of range",
    );
    err_contains(eval(Op::Concat { axis: 0 }, &[&m23, &v3]), "differs");
    let x = Array::zeros(vec![1, 2, 3, 3]);
    err_contains(
        eval(
            Op::Conv2d {
                stride: [1, 1],
                padding: [0, 0],
            },
            &[&x, &Array::zeros(vec![1, 3, 2, 2])],
        ),
        "channels",
    );
    err_contains(
        eval(
            Op::Conv2d {
                stride: [1, 1],
                padding: [0, 0],
            },
            &[&x, &Array::zeros(vec![1, 2, 4, 4])],
        ),
        "below 1",
    );
    err_contains(
        eval(
            Op::MaxPool2d {
                kernel: [2, 2],
                stride: [0, 0],
                padding: [0, 0],
            },
            &[&x],
        ),
        "stride",
    );
    err_contains(eval(Op::DropoutMask { p: 1.0 }, &[&x]), "probability");
}

#[test]
fn malformed_calls_are_errors() {
    let x = arr(&[2], &[1.0, 2.0]);
    err_contains(eval(Op::Add, &[&x]), "argument");
    err_contains(eval(Op::Concat { axis: 0 }, &[]), "at least one");
    let broken = Array {
        shape: vec![3],
        data: vec![1.0],
    };
    err_contains(eval(Op::Neg, &[&broken]), "does not match");
    err_contains(
        eval(
            Op::Input {
                index: 0,
                name: "x".into(),
                shape: vec![],
                dtype: DType::F32,
            },
            &[],
        ),
        "leaf",
    );
}

/// Every op over every combination of a set of awkward arrays: the result may be Ok or Err,
/// but nothing may panic.
#[test]
fn no_op_panics_on_arbitrary_arguments() {
    let shapes: &[&[usize]] = &[
        &[],
        &[0],
        &[3],
        &[2, 3],
        &[3, 2],
        &[1, 3],
        &[2, 0, 3],
        &[2, 3, 4],
        &[1, 2, 4, 4],
        &[2, 2, 3, 3],
        &[usize::MAX, 0],
    ];
    let arrays: Vec<Array> = shapes
        .iter()
        .enumerate()
        .map(|(s, sh)| {
            let n: usize = sh.iter().product();
            // Small integers (valid labels/ids sometimes), negatives, fractions.
            Array {
                shape: sh.to_vec(),
                data: (0..n)
                    .map(|i| ((i * 7 + s) % 5) as f64 - (i % 3) as f64 * 0.5)
                    .collect(),
            }
        })
        .chain([
            Array {
                shape: vec![2, 2],
                data: vec![1.0],
            },
            Array::scalar(f64::NAN),
        ])
        .collect();
    let w2 = [2, 2];
    let ops = vec![
        Op::Const { value: 1.0 },
        Op::Neg,
        Op::Relu,
        Op::Gelu,
        Op::GeluTanh,
        Op::Tanh,
        Op::Sigmoid,
        Op::Exp,
        Op::Log,
        Op::Sqrt,
        Op::PowScalar { exponent: 0.5 },
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Sum {
            axes: vec![0, 1],
            keepdim: false,
        },
        Op::Mean {
            axes: vec![1],
            keepdim: true,
        },
        Op::Max {
            axes: vec![0],
            keepdim: false,
        },
        Op::MatMul,
        Op::Pick,
        Op::Conv2d {
            stride: w2,
            padding: [1, 1],
        },
        Op::MaxPool2d {
            kernel: w2,
            stride: w2,
            padding: [1, 1],
        },
        Op::AvgPool2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [0, 0],
        },
        Op::Embedding,
        Op::DropoutMask { p: 0.5 },
        Op::Reshape {
            shape: vec![Dim::known(6)],
        },
        Op::Permute { perm: vec![1, 0] },
        Op::Concat { axis: 1 },
        Op::Narrow {
            axis: 1,
            start: 1,
            len: 2,
        },
        Op::BroadcastTo,
        Op::SumTo,
        Op::ReluGrad,
        Op::GeluGrad,
        Op::GeluTanhGrad,
        Op::MeanGrad {
            axes: vec![1],
            keepdim: false,
        },
        Op::MaxGrad {
            axes: vec![0],
            keepdim: true,
        },
        Op::PickGrad,
        Op::Conv2dGradInput {
            stride: w2,
            padding: [1, 1],
        },
        Op::Conv2dGradWeight {
            stride: [1, 1],
            padding: [0, 0],
        },
        Op::MaxPool2dGrad {
            kernel: w2,
            stride: w2,
            padding: [1, 1],
        },
        Op::AvgPool2dGrad {
            kernel: w2,
            stride: [1, 1],
            padding: [0, 0],
        },
        Op::PadNarrow { axis: 1, start: 1 },
        Op::EmbeddingGrad,
    ];
    let env = HashMap::new();
    for op in &ops {
        let arity = if matches!(op, Op::Concat { .. }) {
            2
        } else {
            op.def().arity
        };
        let k = arrays.len();
        for combo in 0..k.pow(arity as u32) {
            let args: Vec<&Array> = (0..arity)
                .map(|i| &arrays[(combo / k.pow(i as u32)) % k])
                .collect();
            let shapes: Vec<&Vec<usize>> = args.iter().map(|a| &a.shape).collect();
            let result = std::panic::catch_unwind(|| {
                reference::eval(
                    op,
                    &args,
                    &RefCtx {
                        env: &env,
                        train: true,
                        autocast: rtx_ir::AutocastMode::OFF,
                        seed: 3,
                    },
                )
            });
            assert!(
                result.is_ok(),
                "{} panicked on shapes {shapes:?}",
                op.name()
            );
        }
    }
}

#[test]
fn model_ir_with_an_argument_after_its_node_is_rejected_on_load() {
    use rtx_ir::{GraphFn, IR_VERSION, ModelIr};
    let mut g = Graph::default();
    let mut u = Unifier::default();
    let x = g
        .push(
            Op::Input {
                index: 0,
                name: "x".into(),
                shape: vec![Dim::known(2)],
                dtype: DType::F32,
            },
            &[],
            &mut u,
        )
        .unwrap();
    let y = g.push(Op::Relu, &[x], &mut u).unwrap();
    g.nodes[y].args = vec![5];
    let ir = ModelIr {
        version: IR_VERSION,
        model: "M".into(),
        functions: vec![GraphFn {
            name: "f".into(),
            symbols: vec![],
            graph: g,
            output: y,
            forward_len: 2,
            grads: vec![],
        }],
    };
    let err = ModelIr::from_json(&ir.to_json().unwrap()).unwrap_err();
    assert!(err.contains("node %1 uses %5"), "{err}");
}

#[test]
fn argmax_picks_the_first_largest_along_the_axis_and_removes_it() {
    let x = arr(&[2, 3], &[1.0, 5.0, 5.0, 0.0, f64::NAN, 9.0]);
    // Ties go to the first; a NaN counts as the largest.
    assert_close(&ok(Op::ArgMax { axis: 1 }, &[&x]), &[2], &[1.0, 1.0]);
    assert_close(&ok(Op::ArgMax { axis: 0 }, &[&x]), &[3], &[0.0, 1.0, 1.0]);
}

#[test]
fn iota_counts_along_its_axis_with_size_one_elsewhere() {
    let x = arr(&[2, 3], &[0.0; 6]);
    assert_close(&ok(Op::Iota { axis: 1 }, &[&x]), &[1, 3], &[0.0, 1.0, 2.0]);
    assert_close(&ok(Op::Iota { axis: 0 }, &[&x]), &[2, 1], &[0.0, 1.0]);
}

#[test]
fn positions_count_the_places_along_the_axis() {
    let x = arr(&[2, 3], &[0.0; 6]);
    assert_close(
        &ok(Op::Positions { axis: 1 }, &[&x]),
        &[3],
        &[0.0, 1.0, 2.0],
    );
    assert_close(&ok(Op::Positions { axis: 0 }, &[&x]), &[2], &[0.0, 1.0]);
}

fn eval_autocast(op: Op, x: &Array, precision: rtx_ir::Precision, loss_scale: f32) -> Array {
    let env = HashMap::new();
    let ctx = RefCtx {
        env: &env,
        train: true,
        autocast: rtx_ir::AutocastMode {
            precision,
            loss_scale,
        },
        seed: 0,
    };
    reference::eval(&op, &[x], &ctx).expect("autocast evaluates")
}

#[test]
fn autocast_rounds_to_the_nearest_bf16_with_ties_to_even() {
    // bf16 keeps 8 significant bits: the step above 1 is 2^-7.
    let x = arr(
        &[6],
        &[
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            1002.0,
            1003.0,
            -0.1,
        ],
    );
    let got = eval_autocast(Op::Autocast, &x, rtx_ir::Precision::Bf16, 1.0);
    let want = [
        1.0,
        1.0,
        1.0 + 4.0 / 256.0,
        1000.0,
        1004.0,
        -0.100_097_656_25,
    ];
    for (g, w) in got.data.iter().zip(want) {
        assert!((g - w).abs() <= w.abs() * 1e-7, "{g} vs {w}");
    }
}

#[test]
fn autocast_to_f16_overflows_past_65504_and_keeps_subnormals() {
    let x = arr(&[4], &[65504.0, 65520.0, 3.0e-8, 1.0e-8]);
    let got = eval_autocast(Op::Autocast, &x, rtx_ir::Precision::F16, 1.0);
    assert_eq!(got.data[0], 65504.0);
    assert_eq!(got.data[1], f64::INFINITY);
    assert_eq!(got.data[2], 2f64.powi(-24), "the smallest subnormal");
    assert_eq!(got.data[3], 0.0, "below half the smallest subnormal");
}

#[test]
fn autocast_at_f32_leaves_values_unchanged() {
    let x = arr(&[2], &[0.1, 1e-30]);
    let got = eval_autocast(Op::Autocast, &x, rtx_ir::Precision::F32, 1.0);
    assert_eq!(got.data, x.data);
}

#[test]
fn autocast_grad_rounds_the_scaled_gradient_and_unscales_it() {
    // 1e-8 is below f16's smallest subnormal (6e-8): lost unscaled, kept at scale 2^16.
    let g = arr(&[2], &[1e-8, 1.0]);
    let unscaled = eval_autocast(Op::AutocastGrad, &g, rtx_ir::Precision::F16, 1.0);
    assert_eq!(unscaled.data, [0.0, 1.0]);
    let scaled = eval_autocast(Op::AutocastGrad, &g, rtx_ir::Precision::F16, 65536.0);
    assert!(
        (scaled.data[0] - 1e-8).abs() < 1e-8 * 1e-3,
        "{}",
        scaled.data[0]
    );
    // A scaled gradient past 65504 overflows: the loss scaler sees the infinity.
    let big = arr(&[1], &[2.0]);
    let over = eval_autocast(Op::AutocastGrad, &big, rtx_ir::Precision::F16, 65536.0);
    assert_eq!(over.data[0], f64::INFINITY);
}
