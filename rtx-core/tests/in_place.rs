//! A generated pointwise kernel writes its first output over a donated input when that
//! input's buffer is its own, and leaves a shared buffer alone.

use rtx_core::Tensor;
use rtx_core::fused::{FusedArg, fused_donating};

fn buffer_address(t: &Tensor) -> usize {
    t.f32_parts("test").unwrap().0.as_ptr() as usize
}

#[test]
fn an_unshared_donor_receives_the_output() {
    let a = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[3, 4]).unwrap();
    let b = Tensor::from_vec(vec![10.0, 20.0, 30.0, 40.0], &[4]).unwrap();
    let address = buffer_address(&a);

    let [out] = fused_donating(
        [FusedArg::Donated(a), FusedArg::Borrowed(&b)],
        &[3, 4],
        [None],
        |[x, y]| [x * 2.0 + y],
    )
    .unwrap();

    assert_eq!(buffer_address(&out), address);
    let want: Vec<f32> = (0..12)
        .map(|v| v as f32 * 2.0 + [10.0, 20.0, 30.0, 40.0][v % 4])
        .collect();
    assert_eq!(out.to_vec_f32().unwrap(), want);
}

#[test]
fn a_shared_donor_is_read_not_overwritten() {
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[4]).unwrap();
    let keep = a.clone();

    let [out] = fused_donating([FusedArg::Donated(a)], &[4], [None], |[x]| [-x]).unwrap();

    assert_eq!(keep.to_vec_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(out.to_vec_f32().unwrap(), vec![-1.0, -2.0, -3.0, -4.0]);
    assert_ne!(buffer_address(&out), buffer_address(&keep));
}

#[test]
fn a_broadcast_donor_is_read_through_its_layout() {
    // [4] under a [3, 4] group: the donor is smaller than the output, so it cannot take it.
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[4]).unwrap();
    let b = Tensor::from_vec(vec![1.0; 12], &[3, 4]).unwrap();

    let [out] = fused_donating(
        [FusedArg::Donated(a), FusedArg::Borrowed(&b)],
        &[3, 4],
        [None],
        |[x, y]| [x + y],
    )
    .unwrap();

    assert_eq!(out.to_vec_f32().unwrap(), [2.0, 3.0, 4.0, 5.0].repeat(3));
}

#[test]
fn a_large_donor_is_overwritten_piece_by_piece_in_parallel() {
    // Beyond the kernels' parallel threshold, with a strided second input.
    let n = 300 * 400;
    let a = Tensor::from_vec((0..n).map(|v| v as f32).collect(), &[300, 400]).unwrap();
    let bt = Tensor::from_vec((0..n).map(|v| (v % 7) as f32).collect(), &[400, 300]).unwrap();
    let transpose = rtx_core::ir::Op::Permute { perm: vec![1, 0] };
    let b = rtx_core::ops::run_op(&transpose, &[&bt], &mut rtx_core::Ctx::eval()).unwrap();
    let want: Vec<f32> = {
        let bv = b.to_vec_f32().unwrap();
        (0..n).map(|i| i as f32 - bv[i]).collect()
    };

    let [out] = fused_donating(
        [FusedArg::Donated(a), FusedArg::Borrowed(&b)],
        &[300, 400],
        [None],
        |[x, y]| [x - y],
    )
    .unwrap();

    assert_eq!(out.to_vec_f32().unwrap(), want);
}
