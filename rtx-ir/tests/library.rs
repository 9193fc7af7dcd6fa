//! Every library op (`rtx_ir::library`): its float64 value against the textbook formula, and
//! its gradient (derived from the lowering) against central finite differences.

mod common;

use common::*;
use rtx_ir::library::{Arg, Args, Emit, LIBRARY, lookup};
use rtx_ir::reference::Array;
use rtx_ir::{NodeId, Op};

fn call(c: &mut Case, name: &str, tensors: &[NodeId], numbers: &[f64]) -> NodeId {
    library_call(c, name, tensors, numbers)
}

/// The op applied elementwise to fixed inputs, against `expected(x)` in float64.
fn check_values(name: &str, numbers: &[f64], expected: impl Fn(f64) -> f64) {
    let xs = [-3.0, -1.5, -0.25, 0.0, 0.3, 1.0, 2.5, 30.0];
    let mut c = Case::new(1);
    let x = c.input(Array::new(vec![xs.len()], xs.to_vec()));
    let out = call(&mut c, name, &[x], numbers);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    for (got, x) in values[out].data.iter().zip(xs) {
        let want = expected(x);
        assert!(
            (got - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{name}({x}) = {got}, expected {want}"
        );
    }
}

#[test]
fn silu_is_x_times_sigmoid() {
    check_values("silu", &[], |x| x / (1.0 + (-x).exp()));
    check_grads(|c| {
        let x = c.random(&[3, 4]);
        call(c, "silu", &[x], &[])
    });
}

#[test]
fn abs_is_the_magnitude() {
    check_values("abs", &[], f64::abs);
    check_grads(|c| {
        let x = c.random(&[6]);
        call(c, "abs", &[x], &[])
    });
}

#[test]
fn clamp_limits_to_the_bounds() {
    check_values("clamp", &[-1.0, 2.0], |x| x.clamp(-1.0, 2.0));
    check_grads(|c| {
        let x = c.random(&[4, 3]);
        call(c, "clamp", &[x], &[-0.5, 0.5])
    });
}

#[test]
fn where_picks_by_condition() {
    let mut c = Case::new(2);
    let cond = c.input(Array::new(vec![4], vec![1.0, 0.0, 2.0, 0.0]));
    let a = c.input(Array::new(vec![4], vec![10.0, 20.0, 30.0, 40.0]));
    let b = c.input(Array::new(vec![1], vec![-1.0]));
    let out = call(&mut c, "where", &[cond, a, b], &[]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].data, vec![10.0, -1.0, 30.0, -1.0]);
    check_grads(|c| {
        let cond = c.random(&[2, 3]);
        let zero = Emit::constant(c, 0.0);
        let positive = Case::op(
            c,
            Op::Compare {
                cmp: rtx_ir::Cmp::Gt,
            },
            &[cond, zero],
        );
        let (a, b) = (c.random(&[2, 3]), c.random(&[3]));
        call(c, "where", &[positive, a, b], &[])
    });
}

#[test]
fn softplus_matches_log_one_plus_exp_without_overflow() {
    check_values("softplus", &[1.0], |x| (1.0 + x.exp()).ln());
    check_values("softplus", &[2.0], |x| (1.0 + (2.0 * x).exp()).ln() / 2.0);
    let mut c = Case::new(3);
    let x = c.input(Array::new(vec![2], vec![800.0, -800.0]));
    let out = call(&mut c, "softplus", &[x], &[1.0]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].data, vec![800.0, 0.0]);
    check_grads(|c| {
        let x = c.random(&[5]);
        call(c, "softplus", &[x], &[1.5])
    });
}

#[test]
fn leaky_relu_scales_negatives() {
    check_values("leaky_relu", &[0.1], |x| if x > 0.0 { x } else { 0.1 * x });
    check_grads(|c| {
        let x = c.random(&[3, 3]);
        call(c, "leaky_relu", &[x], &[0.2])
    });
}

#[test]
fn maximum_and_minimum_broadcast() {
    for (name, f) in [
        ("maximum", f64::max as fn(f64, f64) -> f64),
        ("minimum", f64::min),
    ] {
        let mut c = Case::new(4);
        let a = c.input(Array::new(vec![2, 2], vec![1.0, -2.0, 3.0, 0.5]));
        let b = c.input(Array::new(vec![2], vec![0.0, 1.0]));
        let out = call(&mut c, name, &[a, b], &[]);
        let values = c.run(&c.graph, &c.inputs, &c.params, false);
        let want: Vec<f64> = [1.0, -2.0, 3.0, 0.5]
            .iter()
            .zip([0.0, 1.0, 0.0, 1.0])
            .map(|(&x, y)| f(x, y))
            .collect();
        assert_eq!(values[out].data, want, "{name}");
        check_grads(|c| {
            let (a, b) = (c.random(&[2, 3]), c.random(&[3]));
            call(c, name, &[a, b], &[])
        });
    }
}

#[test]
fn min_is_the_smallest_element() {
    let mut c = Case::new(5);
    let x = c.input(Array::new(vec![2, 2], vec![1.0, -2.0, 3.0, 0.5]));
    let out = call(&mut c, "min", &[x], &[]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].data, vec![-2.0]);
    check_grads(|c| {
        let x = c.distinct(&[3, 4]);
        call(c, "min", &[x], &[])
    });
}

#[test]
fn layer_norm_normalizes_the_last_axis() {
    let mut c = Case::new(6);
    let row = [1.0, 2.0, 4.0, 7.0];
    let x = c.input(Array::new(vec![1, 4], row.to_vec()));
    let w = c.input(Array::new(vec![4], vec![1.0, 2.0, 0.5, -1.0]));
    let b = c.input(Array::new(vec![4], vec![0.0, 0.1, 0.2, 0.3]));
    let out = call(&mut c, "layer_norm", &[x, w, b], &[1e-5]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    let mean = row.iter().sum::<f64>() / 4.0;
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
    for (i, got) in values[out].data.iter().enumerate() {
        let want = (row[i] - mean) / (var + 1e-5).sqrt() * [1.0, 2.0, 0.5, -1.0][i]
            + [0.0, 0.1, 0.2, 0.3][i];
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
    check_grads(|c| {
        let x = c.random(&[2, 3, 5]);
        let (w, b) = (c.random(&[5]), c.random(&[5]));
        call(c, "layer_norm", &[x, w, b], &[1e-5])
    });
}

#[test]
fn gelu_tanh_is_the_tanh_approximation() {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    check_values("gelu_tanh", &[], |x| {
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    });
    check_grads(|c| {
        let x = c.random(&[3, 5]);
        call(c, "gelu_tanh", &[x], &[])
    });
}

#[test]
fn rms_norm_scales_by_the_root_mean_square_of_the_last_axis() {
    let mut c = Case::new(8);
    let row = [1.0, -2.0, 4.0, 0.5];
    let gain = [1.0, 2.0, 0.5, -1.0];
    let x = c.input(Array::new(vec![1, 4], row.to_vec()));
    let w = c.input(Array::new(vec![4], gain.to_vec()));
    let out = call(&mut c, "rms_norm", &[x, w], &[1e-6]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    let rms = (row.iter().map(|v| v * v).sum::<f64>() / 4.0 + 1e-6).sqrt();
    for (i, got) in values[out].data.iter().enumerate() {
        let want = row[i] / rms * gain[i];
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
    check_grads(|c| {
        let x = c.random(&[2, 3, 5]);
        let w = c.random(&[5]);
        call(c, "rms_norm", &[x, w], &[1e-6])
    });
}

#[test]
fn rms_norm_rejects_a_weight_of_another_width() {
    let mut c = Case::new(9);
    let (x, w) = (c.random(&[2, 5]), c.random(&[4]));
    let def = lookup("rms_norm").unwrap();

    let err = (def.lower)(&mut c, &Args::new(&[x, w], &[1e-6])).unwrap_err();

    assert!(err.to_string().contains("[5]"), "{err}");
}

#[test]
fn tril_and_triu_keep_one_side_of_the_diagonal() {
    for (name, diagonal) in [
        ("tril", 0.0),
        ("tril", 1.0),
        ("tril", -1.0),
        ("triu", 0.0),
        ("triu", 2.0),
    ] {
        let mut c = Case::new(12);
        let (batch, rows, cols) = (2, 3, 4);
        let data: Vec<f64> = (0..batch * rows * cols).map(|i| i as f64 + 1.0).collect();
        let x = c.input(Array::new(vec![batch, rows, cols], data.clone()));
        let out = call(&mut c, name, &[x], &[diagonal]);
        let values = c.run(&c.graph, &c.inputs, &c.params, false);
        assert_eq!(values[out].shape, vec![batch, rows, cols]);
        for (i, got) in values[out].data.iter().enumerate() {
            let (r, q) = ((i / cols) % rows, i % cols);
            let (r, q) = (r as f64, q as f64);
            let keep = if name == "tril" {
                q <= r + diagonal
            } else {
                q >= r + diagonal
            };
            let want = if keep { data[i] } else { 0.0 };
            assert_eq!(*got, want, "{name}(diagonal {diagonal}) at {i}");
        }
    }
    check_grads(|c| {
        let x = c.random(&[2, 4, 4]);
        let low = call(c, "tril", &[x], &[0.0]);
        let high = call(c, "triu", &[x], &[1.0]);
        let both = c.op(Op::Mul, &[low, high]);
        c.op(Op::Add, &[both, low])
    });
}

#[test]
fn tril_needs_two_axes_and_a_whole_diagonal() {
    let mut c = Case::new(13);
    let (v, m) = (c.random(&[4]), c.random(&[3, 3]));
    let def = lookup("tril").unwrap();
    let err = (def.lower)(&mut c, &Args::new(&[v], &[0.0])).unwrap_err();
    assert!(err.to_string().contains("last two axes"), "{err}");
    let err = (def.lower)(&mut c, &Args::new(&[m], &[0.5])).unwrap_err();
    assert!(err.to_string().contains("whole number"), "{err}");
}

#[test]
fn sin_and_cos_are_the_circular_functions() {
    check_values("sin", &[], f64::sin);
    check_values("cos", &[], f64::cos);
    check_grads(|c| {
        let x = c.random(&[3, 4]);
        let s = call(c, "sin", &[x], &[]);
        let k = call(c, "cos", &[x], &[]);
        c.op(Op::Mul, &[s, k])
    });
}

#[test]
fn rope_turns_each_feature_pair_by_position_times_frequency() {
    let mut c = Case::new(16);
    let (t, d, base) = (3, 4, 100.0f64);
    let data: Vec<f64> = (0..t * d).map(|i| 0.3 * i as f64 - 1.0).collect();
    let x = c.input(Array::new(vec![t, d], data.clone()));
    let out = call(&mut c, "rope", &[x], &[base]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].shape, vec![t, d]);
    let half = d / 2;
    for p in 0..t {
        for i in 0..half {
            let angle = p as f64 * base.powf(-2.0 * i as f64 / d as f64);
            let (x1, x2) = (data[p * d + i], data[p * d + half + i]);
            let first = x1 * angle.cos() - x2 * angle.sin();
            let second = x1 * angle.sin() + x2 * angle.cos();
            assert!((values[out].data[p * d + i] - first).abs() < 1e-12);
            assert!((values[out].data[p * d + half + i] - second).abs() < 1e-12);
        }
    }
    check_grads(|c| {
        let x = c.random(&[2, 3, 6]);
        call(c, "rope", &[x], &[10000.0])
    });
}

#[test]
fn rope_needs_an_even_head_size() {
    let mut c = Case::new(17);
    let x = c.random(&[2, 3, 5]);
    let def = lookup("rope").unwrap();

    let err = (def.lower)(&mut c, &Args::new(&[x], &[10000.0])).unwrap_err();

    assert!(err.to_string().contains("even"), "{err}");
}

fn heads(c: &mut Case, x: NodeId, n: usize) -> NodeId {
    let def = lookup("split_heads").unwrap();
    (def.lower)(c, &Args(vec![Arg::Tensor(x), Arg::Size(Some(n))])).unwrap()
}

#[test]
fn split_heads_moves_each_head_before_time_and_merge_heads_undoes_it() {
    let mut c = Case::new(14);
    let (b, t, width, n) = (2, 3, 8, 2);
    let data: Vec<f64> = (0..b * t * width).map(|i| i as f64).collect();
    let x = c.input(Array::new(vec![b, t, width], data.clone()));
    let split = heads(&mut c, x, n);
    let merged = call(&mut c, "merge_heads", &[split], &[]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    let d = width / n;
    assert_eq!(values[split].shape, vec![b, n, t, d]);
    for bi in 0..b {
        for h in 0..n {
            for ti in 0..t {
                for di in 0..d {
                    let got = values[split].data[((bi * n + h) * t + ti) * d + di];
                    assert_eq!(got, data[(bi * t + ti) * width + h * d + di]);
                }
            }
        }
    }
    assert_eq!(values[merged].shape, vec![b, t, width]);
    assert_eq!(values[merged].data, data);
    check_grads(|c| {
        let x = c.random(&[2, 3, 6]);
        let split = heads(c, x, 3);
        let y = c.op(Op::Mul, &[split, split]);
        call(c, "merge_heads", &[y], &[])
    });
}

#[test]
fn split_heads_rejects_a_head_count_that_does_not_divide_the_width() {
    let mut c = Case::new(15);
    let x = c.random(&[2, 3, 8]);
    let def = lookup("split_heads").unwrap();

    let err = (def.lower)(&mut c, &Args(vec![Arg::Tensor(x), Arg::Size(Some(3))])).unwrap_err();

    assert!(
        err.to_string()
            .contains("3 heads do not divide the width 8"),
        "{err}"
    );
}

#[test]
fn masked_fill_replaces_where_the_mask_is_set() {
    let mut c = Case::new(10);
    let x = c.input(Array::new(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    // A causal-style mask over the last axis, broadcast over the rows.
    let mask = c.input(Array::new(vec![3], vec![0.0, 1.0, 1.0]));
    let out = call(&mut c, "masked_fill", &[x, mask], &[-1e9]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].data, vec![1.0, -1e9, -1e9, 4.0, -1e9, -1e9]);
    check_grads(|c| {
        let x = c.random(&[3, 4]);
        let mask = c.input(Array::new(vec![4], vec![1.0, 0.0, 0.0, 1.0]));
        call(c, "masked_fill", &[x, mask], &[0.5])
    });
}

#[test]
fn masked_fill_rejects_a_mask_that_widens_x() {
    let mut c = Case::new(11);
    let (x, mask) = (c.random(&[4]), c.random(&[3, 4]));
    let def = lookup("masked_fill").unwrap();

    let err = (def.lower)(&mut c, &Args::new(&[x, mask], &[0.0])).unwrap_err();

    assert!(err.to_string().contains("[3, 4]"), "{err}");
}

#[test]
fn layer_norm_rejects_a_weight_that_only_broadcasts() {
    let mut c = Case::new(7);
    let x = c.random(&[2, 5]);
    let (w, b) = (c.random(&[2, 5]), c.random(&[5]));
    let def = lookup("layer_norm").unwrap();

    let err = (def.lower)(&mut c, &Args::new(&[x, w, b], &[1e-5])).unwrap_err();

    assert!(err.to_string().contains("[5]"), "{err}");
}

#[test]
fn mse_is_the_mean_of_squared_differences() {
    let mut c = Case::new(9);
    let a = c.input(Array::new(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]));
    let b = c.input(Array::new(vec![2, 2], vec![1.0, 0.0, 3.0, 1.0]));
    let out = call(&mut c, "mse", &[a, b], &[]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].shape, Vec::<usize>::new());
    assert_eq!(values[out].data, vec![(4.0 + 9.0) / 4.0]);
    check_grads(|c| {
        let (a, b) = (c.random(&[3, 4]), c.random(&[3, 4]));
        call(c, "mse", &[a, b], &[])
    });
}

#[test]
fn mse_rejects_shapes_that_only_broadcast() {
    let mut c = Case::new(10);
    let (a, b) = (c.random(&[4, 1]), c.random(&[4]));
    let def = lookup("mse").unwrap();

    let err = (def.lower)(&mut c, &Args::new(&[a, b], &[])).unwrap_err();

    assert_eq!(err.arg, 1);
    assert!(err.to_string().contains("[4, 1]"), "{err}");
}

#[test]
fn cross_entropy_is_the_mean_negative_log_likelihood_of_the_labels() {
    // Row 0: softmax [1/4, 3/4], label 1 -> -ln(3/4). Row 1: uniform over 2 -> ln 2.
    // Row 2: logits of 1000 and -1000 must not overflow: loss 2000 for the unlikely label.
    let mut c = Case::new(11);
    let logits = c.input(Array::new(
        vec![3, 2],
        vec![0.0, 3f64.ln(), 1.0, 1.0, 1000.0, -1000.0],
    ));
    let labels = c.ints(&[3], &[1, 0, 1]);
    let out = call(&mut c, "cross_entropy", &[logits, labels], &[]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    let want = (-(0.75f64.ln()) + 2f64.ln() + 2000.0) / 3.0;
    assert!(
        (values[out].data[0] - want).abs() < 1e-12,
        "{:?} vs {want}",
        values[out].data
    );
}

#[test]
fn cross_entropy_gradient_is_softmax_minus_onehot_over_n() {
    let mut c = Case::new(12);
    let logits = c.input(Array::new(vec![2, 2], vec![0.0, 3f64.ln(), 1.0, 1.0]));
    let labels = c.ints(&[2], &[1, 0]);
    let loss = call(&mut c, "cross_entropy", &[logits, labels], &[]);
    let grads = rtx_ir::differentiate(&mut c.graph, loss, &[logits]).unwrap();
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    let got = &values[grads[0].grad.expect("logits have a gradient")].data;
    for (g, want) in got.iter().zip([0.125, -0.125, -0.25, 0.25]) {
        assert!((g - want).abs() < 1e-12, "{got:?}");
    }
    check_grads(|c| {
        let logits = c.random(&[4, 5]);
        let labels = c.ints(&[4], &[2, 0, 4, 2]);
        call(c, "cross_entropy", &[logits, labels], &[])
    });
}

#[test]
fn cross_entropy_over_a_sequence_averages_every_position() {
    // [B, T, C] logits with [B, T] labels, as a language model computes its loss.
    check_grads(|c| {
        let logits = c.random(&[2, 3, 4]);
        let labels = c.ints(&[2, 3], &[0, 3, 1, 2, 2, 0]);
        call(c, "cross_entropy", &[logits, labels], &[])
    });
}

#[test]
fn detach_passes_values_and_stops_gradients() {
    let mut c = Case::new(8);
    let x = c.input(Array::new(vec![3], vec![1.0, -2.0, 3.0]));
    let out = call(&mut c, "detach", &[x], &[]);
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[out].data, vec![1.0, -2.0, 3.0]);
    // d/dx sum(x * detach(x)) = detach(x) = x: the detached factor counts as a constant
    // (finite differences cannot check this: they move both factors).
    let product = c.op(Op::Mul, &[x, out]);
    let total = c.op(
        Op::Sum {
            axes: vec![0],
            keepdim: false,
        },
        &[product],
    );
    let grads = rtx_ir::differentiate(&mut c.graph, total, &[x]).unwrap();
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    let dx = grads[0].grad.expect("x has a gradient");
    assert_eq!(values[dx].data, vec![1.0, -2.0, 3.0]);
}

/// Softmax over `axis` of a [2, 3] array, in float64, the textbook way.
fn softmax_rows(x: &[f64], axis: usize) -> Vec<f64> {
    let at = |i: usize, j: usize| x[i * 3 + j];
    let mut out = vec![0.0; 6];
    for i in 0..2 {
        for j in 0..3 {
            let total: f64 = if axis == 1 {
                (0..3).map(|k| at(i, k).exp()).sum()
            } else {
                (0..2).map(|k| at(k, j).exp()).sum()
            };
            out[i * 3 + j] = at(i, j).exp() / total;
        }
    }
    out
}

#[test]
fn softmax_and_log_softmax_match_the_textbook_formula_on_every_axis() {
    let data = vec![0.5, -1.0, 2.0, 700.0, 699.0, 1.0];
    for axis in [0, 1] {
        for log in [false, true] {
            let mut c = Case::new(9);
            let x = c.input(Array::new(vec![2, 3], data.clone()));
            let out = rtx_ir::library::softmax(&mut c, x, axis, log).unwrap();
            let values = c.run(&c.graph, &c.inputs, &c.params, false);
            // The textbook formula overflows at 700: shift each row or column by its max.
            let shifted: Vec<f64> = (0..6)
                .map(|n| {
                    let (i, j) = (n / 3, n % 3);
                    let max = if axis == 1 {
                        (0..3).map(|k| data[i * 3 + k]).fold(f64::MIN, f64::max)
                    } else {
                        (0..2).map(|k| data[k * 3 + j]).fold(f64::MIN, f64::max)
                    };
                    data[n] - max
                })
                .collect();
            let want = softmax_rows(&shifted, axis);
            for (n, (got, want)) in values[out].data.iter().zip(&want).enumerate() {
                let want = if log { want.ln() } else { *want };
                assert!(
                    (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                    "axis {axis} log {log} [{n}]: {got} vs {want}"
                );
            }
        }
    }
    for (axis, log) in [(0, false), (1, false), (1, true), (2, true)] {
        check_grads(|c| {
            let x = c.random(&[2, 3, 4]);
            let y = rtx_ir::library::softmax(c, x, axis, log).unwrap();
            let w = c.random(&[2, 3, 4]);
            c.op(Op::Mul, &[y, w])
        });
    }
}

/// `name` lowered on explicit arguments (axes, flags, sizes, dims).
fn lower(c: &mut Case, name: &str, args: Vec<Arg>) -> NodeId {
    let def = lookup(name).unwrap_or_else(|| panic!("`{name}` is not in the library"));
    (def.lower)(c, &Args(args)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The op at the root of a one-op lowering.
fn root_op(c: &Case, id: NodeId) -> Op {
    c.graph.node(id).op.clone()
}

#[test]
fn reductions_sort_their_axes_and_default_to_all_of_them() {
    let mut c = Case::new(20);
    let x = c.random(&[2, 3, 4]);
    let picked = lower(
        &mut c,
        "sum",
        vec![
            Arg::Tensor(x),
            Arg::Axes(Some(vec![2, 0, 2])),
            Arg::Flag(true),
        ],
    );
    let all = lower(
        &mut c,
        "max",
        vec![Arg::Tensor(x), Arg::Axes(None), Arg::Flag(false)],
    );
    assert_eq!(
        root_op(&c, picked),
        Op::Sum {
            axes: vec![0, 2],
            keepdim: true
        }
    );
    assert_eq!(
        root_op(&c, all),
        Op::Max {
            axes: vec![0, 1, 2],
            keepdim: false
        }
    );
    check_grads(|c| {
        let x = c.random(&[2, 3]);
        lower(
            c,
            "mean",
            vec![Arg::Tensor(x), Arg::Axes(Some(vec![1])), Arg::Flag(false)],
        )
    });
}

#[test]
fn pools_default_the_stride_to_the_kernel_and_the_padding_to_zero() {
    let mut c = Case::new(21);
    let x = c.distinct(&[1, 2, 6, 6]);
    let max = lower(
        &mut c,
        "max_pool2d",
        vec![
            Arg::Tensor(x),
            Arg::Size(Some(2)),
            Arg::Size(None),
            Arg::Size(None),
        ],
    );
    let avg = lower(
        &mut c,
        "avg_pool2d",
        vec![
            Arg::Tensor(x),
            Arg::Size(Some(3)),
            Arg::Size(Some(1)),
            Arg::Size(Some(1)),
        ],
    );
    assert_eq!(
        root_op(&c, max),
        Op::MaxPool2d {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0]
        }
    );
    assert_eq!(
        root_op(&c, avg),
        Op::AvgPool2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1]
        }
    );
}

#[test]
fn layout_ops_lower_to_views_of_the_right_shape() {
    let mut c = Case::new(22);
    let x = c.random(&[2, 3, 4]);
    let flat = lower(&mut c, "flatten", vec![Arg::Tensor(x), Arg::Axes(None)]);
    let swapped = lower(
        &mut c,
        "transpose",
        vec![
            Arg::Tensor(x),
            Arg::Axes(Some(vec![0])),
            Arg::Axes(Some(vec![2])),
        ],
    );
    let permuted = lower(
        &mut c,
        "permute",
        vec![Arg::Tensor(x), Arg::Axes(Some(vec![1, 2, 0]))],
    );
    let narrowed = lower(
        &mut c,
        "narrow",
        vec![
            Arg::Tensor(x),
            Arg::Axes(Some(vec![2])),
            Arg::Size(Some(1)),
            Arg::Size(Some(2)),
        ],
    );
    let reshaped = lower(
        &mut c,
        "reshape",
        vec![Arg::Tensor(x), Arg::Dims(known(&[6, 4]))],
    );
    let joined = lower(
        &mut c,
        "concat",
        vec![Arg::Tensors(vec![x, x]), Arg::Axes(Some(vec![1]))],
    );
    let shape = |c: &Case, v: NodeId| c.graph.node(v).shape.clone();
    assert_eq!(shape(&c, flat), known(&[2, 12]));
    assert_eq!(shape(&c, swapped), known(&[4, 3, 2]));
    assert_eq!(shape(&c, permuted), known(&[3, 4, 2]));
    assert_eq!(shape(&c, narrowed), known(&[2, 3, 2]));
    assert_eq!(shape(&c, reshaped), known(&[6, 4]));
    assert_eq!(shape(&c, joined), known(&[2, 6, 4]));
}

#[test]
fn narrow_refuses_an_empty_range_and_blames_the_length() {
    let mut c = Case::new(23);
    let x = c.random(&[2, 3]);
    let def = lookup("narrow").unwrap();
    let args = Args(vec![
        Arg::Tensor(x),
        Arg::Axes(Some(vec![1])),
        Arg::Size(Some(0)),
        Arg::Size(Some(0)),
    ]);

    let err = (def.lower)(&mut c, &args).unwrap_err();

    assert_eq!(err.arg, 3);
}

#[test]
fn dropout_multiplies_by_a_mask_of_its_own_per_call() {
    let mut c = Case::new(24);
    let x = c.random(&[4, 5]);
    let a = call(&mut c, "dropout", &[x], &[0.5]);
    let b = call(&mut c, "dropout", &[x], &[0.5]);
    let mask_of = |c: &Case, v: NodeId| c.graph.node(v).args[1];
    assert_ne!(
        mask_of(&c, a),
        mask_of(&c, b),
        "two dropouts share one mask"
    );
    // Eval mode: the identity.
    let values = c.run(&c.graph, &c.inputs, &c.params, false);
    assert_eq!(values[a].data, values[x].data);
    // Training: every element is 0 or 2x.
    let values = c.run(&c.graph, &c.inputs, &c.params, true);
    for (y, x) in values[a].data.iter().zip(&values[x].data) {
        assert!(*y == 0.0 || (*y - 2.0 * x).abs() < 1e-12, "{y} from {x}");
    }
}

#[test]
fn signatures_show_defaults_and_lists_as_the_user_writes_them() {
    let sum = lookup("sum").unwrap();
    assert_eq!(sum.signature(), "sum(x, axes = all, keepdim = false)");
    let concat = lookup("concat").unwrap();
    assert_eq!(concat.signature(), "concat([parts, ..], axis)");
}

#[test]
fn every_library_op_has_a_test_here() {
    // Adding a row to LIBRARY without a test above fails this list.
    let tested = [
        // One core op each: their values and gradients are checked in gradcheck.rs and
        // against the CPU kernels in rtx-core's backend_vs_reference.rs.
        "relu",
        "gelu",
        "tanh",
        "sigmoid",
        "exp",
        "log",
        "sqrt",
        "neg",
        "pow",
        "matmul",
        "softmax",
        "log_softmax",
        // Structural ops: their lowering (axes, defaults, shapes) is tested above; their core
        // ops in gradcheck.rs and backend_vs_reference.rs.
        "sum",
        "mean",
        "max",
        "max_pool2d",
        "avg_pool2d",
        "reshape",
        "flatten",
        "transpose",
        "permute",
        "concat",
        "narrow",
        // Compositions, tested above.
        "dropout",
        "mse",
        "cross_entropy",
        "detach",
        "silu",
        "abs",
        "clamp",
        "where",
        "softplus",
        "leaky_relu",
        "maximum",
        "minimum",
        "min",
        "layer_norm",
        "gelu_tanh",
        "rms_norm",
        "masked_fill",
        "tril",
        "triu",
        "split_heads",
        "merge_heads",
        "sin",
        "cos",
        "rope",
        "attention",
        // Core ops Positions and ArgMax: reference_ops.rs, backend_vs_reference.rs, library_ops.rs (models).
        "argmax",
        "positions",
        // Core ops TopK, TopKIndices: backend_vs_reference.rs, gradcheck.rs, library_ops.rs (models).
        "top_k",
        "top_k_indices",
    ];
    for op in LIBRARY {
        assert!(tested.contains(&op.name), "`{}` has no test", op.name);
    }
}

fn attend(c: &mut Case, q: NodeId, k: NodeId, v: NodeId, causal: bool) -> Result<NodeId, String> {
    let def = lookup("attention").unwrap();
    let args = Args(vec![
        Arg::Tensor(q),
        Arg::Tensor(k),
        Arg::Tensor(v),
        Arg::Flag(causal),
    ]);
    (def.lower)(c, &args).map_err(|e| e.to_string())
}

/// softmax(q k^T / sqrt(d) (+ causal mask)) v for one [t, d] slice, in f64.
fn attention_by_hand(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    t: usize,
    d: usize,
    causal: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; t * d];
    for i in 0..t {
        let seen = if causal { i + 1 } else { t };
        let scores: Vec<f64> = (0..seen)
            .map(|j| (0..d).map(|x| q[i * d + x] * k[j * d + x]).sum::<f64>() / (d as f64).sqrt())
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        for (j, s) in scores.iter().enumerate() {
            let w = (s - max).exp() / total;
            for x in 0..d {
                out[i * d + x] += w * v[j * d + x];
            }
        }
    }
    out
}

#[test]
fn attention_is_softmax_of_scaled_scores_times_values() {
    for causal in [false, true] {
        let mut c = Case::new(40);
        let (b, h, t, d) = (2, 2, 5, 4);
        let (q, k, v) = (
            c.random(&[b, h, t, d]),
            c.random(&[b, h, t, d]),
            c.random(&[b, h, t, d]),
        );
        let out = attend(&mut c, q, k, v, causal).unwrap();
        let values = c.run(&c.graph, &c.inputs, &c.params, false);
        assert_eq!(values[out].shape, vec![b, h, t, d]);
        let n = t * d;
        for slice in 0..b * h {
            let part = |id: NodeId| values[id].data[slice * n..(slice + 1) * n].to_vec();
            let want = attention_by_hand(&part(q), &part(k), &part(v), t, d, causal);
            for (i, (got, want)) in part(out).iter().zip(&want).enumerate() {
                assert!(
                    (got - want).abs() < 1e-12,
                    "causal={causal} slice {slice} [{i}]: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn attention_gradients_match_finite_differences() {
    for causal in [false, true] {
        check_grads(|c| {
            let (q, k, v) = (
                c.random(&[2, 4, 3]),
                c.random(&[2, 4, 3]),
                c.random(&[2, 4, 3]),
            );
            attend(c, q, k, v, causal).unwrap()
        });
    }
}

#[test]
fn attention_rejects_queries_and_keys_of_different_widths() {
    let mut c = Case::new(41);
    let (q, k, v) = (
        c.random(&[2, 4, 8]),
        c.random(&[2, 4, 6]),
        c.random(&[2, 4, 6]),
    );

    let err = attend(&mut c, q, k, v, false).unwrap_err();

    assert!(
        err.contains("[2, 4, 8]") && err.contains("[2, 4, 6]"),
        "{err}"
    );
}

#[test]
fn attention_rejects_values_that_do_not_match_the_keys() {
    let mut c = Case::new(42);
    let (q, k, v) = (c.random(&[4, 8]), c.random(&[4, 8]), c.random(&[5, 8]));

    let err = attend(&mut c, q, k, v, false).unwrap_err();

    assert!(err.contains("one row per key"), "{err}");
}

#[test]
fn causal_attention_needs_as_many_queries_as_keys() {
    let mut c = Case::new(43);
    let (q, k, v) = (c.random(&[1, 8]), c.random(&[4, 8]), c.random(&[4, 8]));

    let err = attend(&mut c, q, k, v, true).unwrap_err();

    assert!(err.contains("as many queries as keys"), "{err}");
    assert!(attend(&mut c, q, k, v, false).is_ok());
}

#[test]
fn matmul_rounds_its_operands_and_result_for_mixed_precision_once_each() {
    let mut c = Case::new(3);
    let (a, b, d) = (c.random(&[2, 3]), c.random(&[3, 4]), c.random(&[4, 2]));
    let ab = call(&mut c, "matmul", &[a, b], &[]);
    // The product's rounded result feeds the next product without a second rounding.
    let abd = call(&mut c, "matmul", &[ab, d], &[]);
    let autocasts = |c: &Case| {
        c.graph
            .nodes
            .iter()
            .filter(|n| n.op == Op::Autocast)
            .count()
    };
    assert_eq!(c.graph.node(abd).op, Op::Autocast);
    // a, b, a@b, d and the final product.
    assert_eq!(autocasts(&c), 5, "{}", listing(&c.graph, c.graph.len()));
}

#[test]
fn the_gradient_of_a_rounded_value_is_rounded_at_the_calls_precision() {
    let mut c = Case::new(4);
    let x = c.random(&[3]);
    let y = c.op(Op::Autocast, &[x]);
    let loss = c.op(
        Op::Sum {
            axes: vec![0],
            keepdim: false,
        },
        &[y],
    );
    let grads = rtx_ir::differentiate(&mut c.graph, loss, &[x]).expect("differentiates");
    let g = grads[0].grad.expect("x has a gradient");
    assert_eq!(c.graph.node(g).op, Op::AutocastGrad);
}
