//! `Slots` as the generated schedules use it.

use super::*;

/// The unused `Rounding` half of a body that never rounds.
type NoRounding<const N: usize, const M: usize> = fn([f32; N]) -> [f32; M];

/// A body with no rounding, as the macro passes one.
fn plain<const N: usize, const M: usize, F>(f: F) -> Kernel<F, NoRounding<N, M>>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    Kernel::Plain(f)
}

/// `exp(x) * 2` over an input `x: [B, 2]`.
fn exp_times_two() -> GraphFn {
    use rtx_ir::{DType, Dim, Graph, Unifier};
    let (mut g, mut u) = (Graph::default(), Unifier::default());
    let input = Op::Input {
        index: 0,
        name: "x".into(),
        shape: vec![Dim::sym("B"), Dim::known(2)],
        dtype: DType::F32,
    };
    let x = g.push(input, &[], &mut u).unwrap();
    let two = g.push(Op::Const { value: 2.0 }, &[], &mut u).unwrap();
    let e = g.push(Op::Exp, &[x], &mut u).unwrap();
    let y = g.push(Op::Mul, &[e, two], &mut u).unwrap();
    GraphFn {
        name: "f".into(),
        symbols: vec!["B".into()],
        forward_len: g.len(),
        graph: g,
        output: y,
        grads: Vec::new(),
    }
}

#[test]
fn the_unfused_schedule_runs_every_node_and_keeps_only_the_roots() {
    let f = exp_times_two();
    let x = Tensor::from_vec(vec![0.0, 1.0, -1.0, 0.5, 2.0, -2.0], &[3, 2]).unwrap();
    let mut slots = Slots::new(f.graph.len());
    slots.leaf(0, &x);

    slots.unfused(
        &f,
        f.graph.len(),
        &[f.output],
        &[("B", 3)],
        &mut Ctx::eval(),
    );

    slots.finish().unwrap();
    let y = slots.take(f.output).unwrap();
    assert_eq!(y.shape(), &[3, 2]);
    let x = x.to_vec_f32().unwrap();
    for (got, x) in y.to_vec_f32().unwrap().iter().zip(x) {
        let want = (x as f64).exp() * 2.0;
        assert!((*got as f64 - want).abs() <= 1e-6 * want, "{got} vs {want}");
    }
    // exp(x), read only by the product, was dropped after it.
    assert!(slots.get(2).is_err());
}

#[test]
fn an_unfused_shape_without_a_value_for_its_symbol_is_an_error_not_a_panic() {
    let f = exp_times_two();
    let x = Tensor::from_vec(vec![0.0; 6], &[3, 2]).unwrap();
    let mut slots = Slots::new(f.graph.len());
    slots.leaf(0, &x);

    slots.unfused(&f, f.graph.len(), &[f.output], &[], &mut Ctx::eval());

    let err = slots.finish().unwrap_err().to_string();
    assert!(err.contains("dimension `B`"), "{err}");
}

#[test]
fn a_value_reads_back_until_it_is_freed() {
    let mut slots = Slots::new(3);
    slots.set(1, Tensor::scalar(2.0)).unwrap();
    assert_eq!(slots.get(1).unwrap().item().unwrap(), 2.0);
    slots.free(&[1]);
    assert!(slots.get(1).is_err());
}

#[test]
fn reading_an_empty_or_missing_slot_is_an_error_not_a_panic() {
    let mut slots = Slots::new(2);
    assert!(slots.get(0).is_err());
    assert!(slots.get(7).is_err());
    assert!(slots.take(0).is_err());
    assert!(slots.set(9, Tensor::scalar(1.0)).is_err());
}

#[test]
fn a_pointwise_group_writes_its_outputs_to_their_slots() {
    let mut slots = Slots::new(4);
    slots
        .set(0, Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap())
        .unwrap();
    slots.set(1, Tensor::scalar(10.0)).unwrap();
    slots.fused(
        [0, 1],
        [2, 3],
        &[2],
        plain(|[a, b]: [f32; 2]| [a + b, a * b]),
    );
    slots.finish().unwrap();
    assert_eq!(
        slots.get(2).unwrap().to_vec_f32().unwrap(),
        vec![11.0, 12.0]
    );
    assert_eq!(
        slots.get(3).unwrap().to_vec_f32().unwrap(),
        vec![10.0, 20.0]
    );
}

#[test]
fn a_donated_input_leaves_its_slot() {
    let mut slots = Slots::new(3);
    slots
        .set(0, Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap())
        .unwrap();
    slots.set(1, Tensor::scalar(3.0)).unwrap();
    slots.fused_donating([0, 1], 0, [2], &[2], plain(|[a, b]: [f32; 2]| [a * b]));
    slots.finish().unwrap();
    assert!(slots.get(0).is_err());
    assert_eq!(slots.get(2).unwrap().to_vec_f32().unwrap(), vec![3.0, 6.0]);
}

#[test]
fn after_a_failed_step_later_steps_do_nothing_and_finish_returns_the_first_error() {
    let mut slots = Slots::new(3);
    slots.pass(0, 1, false);
    slots.constant(2, 1.0);
    let error = slots.finish().unwrap_err().to_string();
    assert!(
        error.contains("node 0 was read before it was computed"),
        "{error}"
    );
    assert!(slots.get(2).is_err());
    assert!(slots.finish().is_ok());
}
