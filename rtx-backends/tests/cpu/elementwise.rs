use rtx_backends::Layout;
use rtx_backends::cpu::{
    BinaryOp, KernelError, UnaryOp, binary, broadcast_shape, to_contiguous, unary,
};

use crate::common::*;
use rtx_backends::cpu::scalar::{HalfType, Rounding};

fn erf(x: f64) -> f64 {
    libm::erf(x)
}

fn unary_reference(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        UnaryOp::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::PowScalar(p) => x.powf(p as f64),
        UnaryOp::AddScalar(c) => x + c as f64,
        UnaryOp::MulScalar(c) => x * c as f64,
        UnaryOp::Autocast(r) => round(x, r.to),
        UnaryOp::AutocastGrad(r) => round(x * r.scale as f64, r.to) / r.scale as f64,
    }
}

fn round(x: f64, to: HalfType) -> f64 {
    match to {
        HalfType::None => x,
        HalfType::Bf16 => half::bf16::from_f64(x).to_f64(),
        HalfType::F16 => half::f16::from_f64(x).to_f64(),
    }
}

const UNARY_OPS: [UnaryOp; 17] = [
    UnaryOp::Neg,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Tanh,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Sigmoid,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::PowScalar(2.5),
    UnaryOp::PowScalar(-1.0),
    UnaryOp::AddScalar(0.75),
    UnaryOp::MulScalar(-3.0),
    UnaryOp::Autocast(Rounding::new(HalfType::Bf16, 1.0)),
    UnaryOp::AutocastGrad(Rounding::new(HalfType::F16, 256.0)),
];

#[test]
fn unary_matches_reference_on_every_view() {
    let mut rng = Rng::new(1);
    for op in UNARY_OPS {
        let positive_only = matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::PowScalar(_));
        for view in ALL_VIEWS {
            let (x, l) = make_view(&mut rng, &[4, 3, 5], view, &mut |r| {
                let v = r.uniform() * 4.0;
                if positive_only { v.abs() + 0.1 } else { v }
            });
            let want: Vec<f64> = read(&x, &l)
                .into_iter()
                .map(|v| unary_reference(op, v))
                .collect();
            assert_close(
                &unary(op, &x, &l).unwrap(),
                &want,
                1e-6,
                1e-4,
                &format!("{op:?} {view:?}"),
            );
        }
    }
}

#[test]
fn unary_and_to_contiguous_on_a_large_strided_input() {
    // Past the parallel threshold, so the chunked path runs.
    let mut rng = Rng::new(2);
    let (x, l) = random_view(&mut rng, &[130, 7, 60], View::Reversed);
    let want = read(&x, &l);
    assert_close(
        &to_contiguous(&x, &l).unwrap(),
        &want,
        0.0,
        0.0,
        "to_contiguous",
    );
    let doubled: Vec<f64> = want.iter().map(|v| v * 2.0).collect();
    assert_close(
        &unary(UnaryOp::MulScalar(2.0), &x, &l).unwrap(),
        &doubled,
        0.0,
        0.0,
        "mul large",
    );
}

#[test]
fn to_contiguous_of_every_view_and_a_scalar() {
    let mut rng = Rng::new(3);
    for view in ALL_VIEWS {
        let (x, l) = random_view(&mut rng, &[3, 4, 2], view);
        assert_close(
            &to_contiguous(&x, &l).unwrap(),
            &read(&x, &l),
            0.0,
            0.0,
            &format!("{view:?}"),
        );
    }
    let scalar = Layout {
        shape: vec![].into(),
        strides: vec![].into(),
        offset: 2,
    };
    assert_eq!(to_contiguous(&[1.0, 2.0, 3.0], &scalar).unwrap(), vec![3.0]);
}

fn binary_reference(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::ReluGrad => {
            if a > 0.0 {
                b
            } else {
                0.0
            }
        }
        BinaryOp::GeluGrad => {
            let cdf = 0.5 * (1.0 + erf(a / 2f64.sqrt()));
            let pdf = (-0.5 * a * a).exp() / (2.0 * std::f64::consts::PI).sqrt();
            b * (cdf + a * pdf)
        }
        BinaryOp::GeluTanhGrad => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let t = (k * (a + 0.044715 * a * a * a)).tanh();
            b * (0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * a * a))
        }
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        BinaryOp::Gt => f64::from(u8::from(a > b)),
        BinaryOp::Ge => f64::from(u8::from(a >= b)),
        BinaryOp::Lt => f64::from(u8::from(a < b)),
        BinaryOp::Le => f64::from(u8::from(a <= b)),
        BinaryOp::Eq => f64::from(u8::from(a == b)),
        BinaryOp::Ne => f64::from(u8::from(a != b)),
    }
}

/// Broadcasts both operands to `shape` in the reference, independently of the kernel.
fn binary_naive(
    op: BinaryOp,
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    shape: &[usize],
) -> Vec<f64> {
    let pick = |values: &[f64], s: &[usize], index: &[usize]| {
        let skip = index.len() - s.len();
        let own: Vec<usize> = s
            .iter()
            .enumerate()
            .map(|(i, &n)| if n == 1 { 0 } else { index[skip + i] })
            .collect();
        values[ravel(&own, s)]
    };
    (0..numel(shape))
        .map(|linear| {
            let index = unravel(linear, shape);
            binary_reference(op, pick(a, sa, &index), pick(b, sb, &index))
        })
        .collect()
}

const BINARY_OPS: [BinaryOp; 15] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::ReluGrad,
    BinaryOp::GeluGrad,
    BinaryOp::GeluTanhGrad,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::Gt,
    BinaryOp::Ge,
    BinaryOp::Lt,
    BinaryOp::Le,
    BinaryOp::Eq,
    BinaryOp::Ne,
];

#[test]
fn binary_matches_reference_with_broadcasting_and_views() {
    let mut rng = Rng::new(4);
    let shape_pairs: [(&[usize], &[usize]); 5] = [
        (&[3, 4, 5], &[3, 4, 5]),
        (&[3, 1, 5], &[4, 5]),
        (&[5], &[2, 3, 5]),
        (&[2, 3, 1], &[1, 1, 6]),
        (&[4, 5], &[1]),
    ];
    for op in BINARY_OPS {
        for (sa, sb) in shape_pairs {
            for (view_a, view_b) in [
                (View::Contiguous, View::Contiguous),
                (View::Reversed, View::Narrowed),
                (View::Narrowed, View::Broadcast),
                (View::Broadcast, View::Reversed),
            ] {
                let (a, la) = random_view(&mut rng, sa, view_a);
                // Away from zero for Div; a coarse grid so Eq and Maximum see ties.
                let (b, lb) = make_view(&mut rng, sb, view_b, &mut |r| {
                    let v = (r.uniform() * 4.0).round() / 4.0;
                    if v.abs() < 0.25 { 0.5 } else { v }
                });
                let a: Vec<f32> = a.iter().map(|v| (v * 4.0).round() / 4.0).collect();
                let (got, shape) = binary(op, &a, &la, &b, &lb).unwrap();
                let want_shape = broadcast_shape(sa, sb).unwrap();
                assert_eq!(shape.as_slice(), &want_shape[..]);
                let want = binary_naive(op, &read(&a, &la), sa, &read(&b, &lb), sb, &shape);
                assert_close(
                    &got,
                    &want,
                    1e-6,
                    1e-4,
                    &format!("{op:?} {sa:?} {sb:?} {view_a:?} {view_b:?}"),
                );
            }
        }
    }
}

#[test]
fn binary_on_large_inputs_with_scalar_broadcast() {
    let mut rng = Rng::new(5);
    let (a, la) = random_view(&mut rng, &[200, 300], View::Contiguous);
    let (b, lb) = random_view(&mut rng, &[300], View::Contiguous);
    let (got, shape) = binary(BinaryOp::Mul, &a, &la, &b, &lb).unwrap();
    let want = binary_naive(
        BinaryOp::Mul,
        &read(&a, &la),
        &la.shape,
        &read(&b, &lb),
        &lb.shape,
        &shape,
    );
    assert_close(&got, &want, 0.0, 1e-7, "row broadcast");
    let (got, _) = binary(BinaryOp::Sub, &b, &Layout::contiguous(&[1]), &a, &la).unwrap();
    let want = binary_naive(
        BinaryOp::Sub,
        &[b[0] as f64],
        &[1],
        &read(&a, &la),
        &la.shape,
        &shape,
    );
    assert_close(&got, &want, 1e-7, 1e-7, "scalar broadcast");
}

#[test]
fn broadcast_shape_follows_numpy() {
    assert_eq!(
        broadcast_shape(&[3, 1, 5], &[4, 5]),
        Some(vec![3, 4, 5].into())
    );
    assert_eq!(broadcast_shape(&[], &[2, 3]), Some(vec![2, 3].into()));
    assert_eq!(broadcast_shape(&[2, 0], &[1]), Some(vec![2, 0].into()));
    assert_eq!(broadcast_shape(&[3], &[4]), None);
    assert_eq!(broadcast_shape(&[2, 3], &[3, 3]), None);
}

#[test]
fn activations_stay_finite_at_extremes() {
    let x = [-100.0f32, -20.0, 0.0, 20.0, 100.0];
    let l = Layout::contiguous(&[5]);
    let sigmoid = unary(UnaryOp::Sigmoid, &x, &l).unwrap();
    assert!((0.0..1e-30).contains(&sigmoid[0]));
    assert_eq!(sigmoid[4], 1.0);
    assert!(
        unary(UnaryOp::Gelu, &x, &l)
            .unwrap()
            .iter()
            .all(|v| v.is_finite())
    );
}

#[test]
fn binary_refuses_shapes_that_do_not_broadcast() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 4]);
    let err = binary(
        BinaryOp::Add,
        &a,
        &Layout::contiguous(&[2, 3]),
        &b,
        &Layout::contiguous(&[2, 2]),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "binary",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unary_refuses_a_layout_that_reads_past_its_buffer() {
    let x = vec![0.0f32; 5];
    let err = unary(UnaryOp::Relu, &x, &Layout::contiguous(&[2, 3])).unwrap_err();
    assert!(matches!(err, KernelError::View { arg: "x", .. }), "{err}");
}

#[test]
fn to_contiguous_refuses_strides_of_another_rank_than_the_shape() {
    let x = vec![0.0f32; 6];
    let l = Layout {
        shape: vec![2, 3].into(),
        strides: vec![1].into(),
        offset: 0,
    };
    let err = to_contiguous(&x, &l).unwrap_err();
    assert!(matches!(err, KernelError::View { .. }), "{err}");
}

#[test]
fn to_contiguous_of_an_empty_view_whose_offset_is_past_the_buffer_is_empty() {
    // Narrowed to the last columns, then to no rows after the last one.
    let x = vec![0.0f32; 15];
    let l = Layout::contiguous(&[5, 3]).narrow(1, 1, 2).narrow(0, 5, 0);
    assert!(l.offset > x.len());
    assert!(to_contiguous(&x, &l).unwrap().is_empty());
}
