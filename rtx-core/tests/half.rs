//! bf16 and f16 tensors: conversions, products accumulated in f32, and errors where an f32
//! kernel meets one.

use half::{bf16, f16};
use rtx_core::ir::Op;
use rtx_core::ops::run_op;
use rtx_core::{Ctx, DType, Rng, RtxError, Tensor};

fn random(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.normal()).collect(), shape).unwrap()
}

/// `[m, k] @ [k, n]` in f64, and for each element the sum of |a| |b| over k (the scale its
/// rounding errors are relative to).
fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut scale) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let (x, y) = (f64::from(a[i * k + p]), f64::from(b[p * n + j]));
                c[i * n + j] += x * y;
                scale[i * n + j] += (x * y).abs();
            }
        }
    }
    (c, scale)
}

/// Checks a half-precision product against f64 twice: against the product of its rounded
/// operands (f32 accumulation: relative error 1e-5 of the scale) and against the product of
/// the f32 operands before rounding (each operand's rounding: `unit` relative, twice).
fn check_half_product(dtype: DType, unit: f64) {
    let mut rng = Rng::new(11);
    let (m, k, n) = (37, 64, 29);
    let (a, b) = (random(&mut rng, &[m, k]), random(&mut rng, &[k, n]));
    let (ah, bh) = (a.to_dtype(dtype).unwrap(), b.to_dtype(dtype).unwrap());
    let c = ah.matmul(&bh).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(c.shape(), &[m, n]);
    let c = c.to_vec_f32().unwrap();

    let (rounded, scale) = reference(
        &ah.to_vec_f32().unwrap(),
        &bh.to_vec_f32().unwrap(),
        m,
        k,
        n,
    );
    for i in 0..m * n {
        let err = (f64::from(c[i]) - rounded[i]).abs();
        assert!(
            err <= 1e-5 * scale[i],
            "{dtype} element {i}: {} vs {}",
            c[i],
            rounded[i]
        );
    }
    let (exact, scale) = reference(&a.to_vec_f32().unwrap(), &b.to_vec_f32().unwrap(), m, k, n);
    for i in 0..m * n {
        let err = (f64::from(c[i]) - exact[i]).abs();
        assert!(
            err <= 2.0 * unit * scale[i] + 1e-5 * scale[i],
            "{dtype} element {i}: {} vs {}",
            c[i],
            exact[i]
        );
    }
}

#[test]
fn bf16_matmul_accumulates_in_f32_within_bf16_rounding() {
    // bf16 keeps 8 significant bits: rounding is at most 2^-8 relative.
    check_half_product(DType::BF16, 2f64.powi(-8));
}

#[test]
fn f16_matmul_accumulates_in_f32_within_f16_rounding() {
    // f16 keeps 11 significant bits: rounding is at most 2^-11 relative (values here are far
    // from f16's range limits).
    check_half_product(DType::F16, 2f64.powi(-11));
}

#[test]
fn half_matmul_broadcasts_batch_dimensions() {
    let mut rng = Rng::new(5);
    let (a, b) = (random(&mut rng, &[2, 5, 8]), random(&mut rng, &[8, 3]));
    let (ah, bh) = (
        a.to_dtype(DType::BF16).unwrap(),
        b.to_dtype(DType::BF16).unwrap(),
    );
    let c = ah.matmul(&bh).unwrap();
    assert_eq!(c.shape(), &[2, 5, 3]);
    let widened = ah
        .to_dtype(DType::F32)
        .unwrap()
        .matmul(&bh.to_dtype(DType::F32).unwrap())
        .unwrap();
    assert!(c.max_abs_diff(&widened).unwrap() <= 1e-5);
}

#[test]
fn narrowing_rounds_to_nearest_and_widening_is_exact() {
    let values = vec![1.0f32, -2.5, 3.3333, 1e-3, 65504.0, 1.0 + 2f32.powi(-9)];
    let t = Tensor::from_vec(values.clone(), &[2, 3]).unwrap();
    let b = t.to_dtype(DType::BF16).unwrap();
    let h = t.to_dtype(DType::F16).unwrap();
    assert_eq!((b.dtype(), h.dtype()), (DType::BF16, DType::F16));
    let expected_b: Vec<f32> = values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    let expected_h: Vec<f32> = values.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_eq!(b.to_vec_f32().unwrap(), expected_b);
    assert_eq!(h.to_vec_f32().unwrap(), expected_h);
    // bf16 -> f32 -> bf16 gives the same bits back.
    let again = b
        .to_dtype(DType::F32)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    assert_eq!(again.to_vec_f32().unwrap(), expected_b);
}

#[test]
fn half_tensors_are_built_from_their_values() {
    let t = Tensor::from_bf16(vec![bf16::from_f32(0.5); 6], &[3, 2]).unwrap();
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(t.to_vec_f32().unwrap(), vec![0.5; 6]);
    assert!(matches!(
        Tensor::from_f16(vec![f16::ONE; 5], &[3, 2]),
        Err(RtxError::ShapeMismatch { .. })
    ));
}

#[test]
fn integer_tensors_do_not_convert_to_half() {
    let ids = Tensor::from_i64(vec![1, 2], &[2]).unwrap();
    match ids.to_dtype(DType::BF16) {
        Err(RtxError::DTypeMismatch { found, .. }) => assert_eq!(found, "i64 to bf16"),
        other => panic!("expected a dtype error, got {other:?}"),
    }
}

#[test]
fn a_half_tensor_reaching_an_f32_kernel_is_an_error_naming_its_dtype() {
    let t = Tensor::from_vec(vec![1.0, 2.0], &[2])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    match run_op(&Op::Exp, &[&t], &mut Ctx::eval()) {
        Err(RtxError::DTypeMismatch {
            expected, found, ..
        }) => {
            assert_eq!((expected.as_str(), found.as_str()), ("f32", "f16"));
        }
        other => panic!("expected a dtype error, got {other:?}"),
    }
}

#[test]
fn matmul_of_two_dtypes_is_an_error() {
    let a = Tensor::from_vec(vec![1.0; 4], &[2, 2]).unwrap();
    let b = a.to_dtype(DType::BF16).unwrap();
    match a.matmul(&b) {
        Err(RtxError::DTypeMismatch { found, .. }) => assert_eq!(found, "f32 and bf16"),
        other => panic!("expected a dtype error, got {other:?}"),
    }
}
