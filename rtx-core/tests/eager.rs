//! Tensor operations outside `graph!`: broadcasting arithmetic, argmax, errors and printing.

use rtx_core::{DType, Tensor};

fn t(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

#[test]
fn arithmetic_broadcasts_like_numpy() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let row = t(&[10.0, 20.0, 30.0], &[3]);
    assert_eq!(
        a.add(&row).unwrap().to_vec_f32().unwrap(),
        vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]
    );
    assert_eq!(
        a.sub(&row).unwrap().to_vec_f32().unwrap(),
        vec![-9.0, -18.0, -27.0, -6.0, -15.0, -24.0]
    );
    let col = t(&[2.0, 0.5], &[2, 1]);
    assert_eq!(
        a.mul(&col).unwrap().to_vec_f32().unwrap(),
        vec![2.0, 4.0, 6.0, 2.0, 2.5, 3.0]
    );
    assert_eq!(a.div(&col).unwrap().shape(), &[2, 3]);
}

#[test]
fn shapes_that_do_not_broadcast_are_an_error_naming_both() {
    let a = t(&[1.0; 6], &[2, 3]);
    let b = t(&[1.0; 2], &[2]);
    let text = match a.add(&b) {
        Err(e) => e.to_string(),
        Ok(t) => panic!("expected a shape error, got {t:?}"),
    };
    assert!(text.contains("[2, 3]") && text.contains("[2]"), "{text}");
}

#[test]
fn argmax_gives_i64_indices_along_the_axis() {
    let a = t(&[0.1, 0.9, 0.3, 0.7, 0.2, 0.1], &[2, 3]);
    let ids = a.argmax(1).unwrap();
    assert_eq!(ids.dtype(), DType::I64);
    assert_eq!(ids.to_vec_i64().unwrap(), vec![1, 0]);
    assert!(a.argmax(2).is_err());
}

#[test]
fn display_reads_like_pytorch_and_elides_long_axes() {
    let small = t(&[1.0, 2.5, -3.0, 4.0], &[2, 2]);
    assert_eq!(
        small.to_string(),
        "tensor([[1.0000, 2.5000], [-3.0000, 4.0000]], shape=[2, 2], dtype=f32)"
    );
    let long = Tensor::from_i64((0..10).collect(), &[10]).unwrap();
    assert_eq!(
        long.to_string(),
        "tensor([0, 1, 2, ..., 7, 8, 9], shape=[10], dtype=i64)"
    );
    assert_eq!(
        Tensor::scalar(0.5).to_string(),
        "tensor(0.5000, shape=[], dtype=f32)"
    );
}
