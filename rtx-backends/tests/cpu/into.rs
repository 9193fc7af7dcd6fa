//! The kernels that write into a buffer the caller gives (a compiled call's arena region):
//! the same bits as their allocating versions whatever the buffer held before, and a clear
//! refusal of a buffer of the wrong length.

use rtx_backends::cpu::{
    attention, attention_grad, attention_grad_into, attention_into, matmul, matmul_into,
    to_contiguous, to_contiguous_into,
};

use crate::common::*;

/// A buffer of `len` NaNs: a kernel that reads its output before writing it shows NaN.
fn stale(len: usize) -> Vec<f32> {
    vec![f32::NAN; len]
}

#[test]
fn matmul_into_overwrites_a_stale_buffer_with_the_same_bits_as_matmul() {
    let mut rng = Rng::new(90);
    let (a, la) = random_view(&mut rng, &[3, 17, 33], View::Reversed);
    let (b, lb) = random_contiguous(&mut rng, &[33, 20]);

    let (want, want_shape) = matmul(&a, &la, &b, &lb).unwrap();
    let (got, shape) = matmul_into(&a, &la, &b, &lb, stale).unwrap();

    assert_eq!(shape, want_shape);
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn matmul_into_refuses_a_buffer_of_the_wrong_length() {
    let mut rng = Rng::new(91);
    let (a, la) = random_contiguous(&mut rng, &[4, 5]);
    let (b, lb) = random_contiguous(&mut rng, &[5, 6]);

    let err = matmul_into(&a, &la, &b, &lb, |len| stale(len - 1)).unwrap_err();

    let text = err.to_string();
    assert!(text.contains("24") && text.contains("23"), "{text}");
}

#[test]
fn attention_into_and_its_gradient_match_the_allocating_kernels() {
    let mut rng = Rng::new(92);
    let shape = [2, 37, 24];
    let operands: Vec<_> = (0..4)
        .map(|_| random_contiguous(&mut rng, &shape))
        .collect();
    let [q, k, v, g] = [0, 1, 2, 3].map(|i| (&operands[i].0[..], &operands[i].1));

    let (out, _) = attention(q, k, v, true).unwrap();
    let (out_into, _) = attention_into(q, k, v, true, stale).unwrap();
    let (grads, _) = attention_grad(q, k, v, g, true).unwrap();
    let (grads_into, _) = attention_grad_into(q, k, v, g, true, stale).unwrap();

    assert_eq!(bits(&out_into), bits(&out));
    assert_eq!(bits(&grads_into), bits(&grads));
}

#[test]
fn attention_into_refuses_a_buffer_of_the_wrong_length() {
    let mut rng = Rng::new(93);
    let shape = [1, 8, 4];
    let operands: Vec<_> = (0..4)
        .map(|_| random_contiguous(&mut rng, &shape))
        .collect();
    let [q, k, v, g] = [0, 1, 2, 3].map(|i| (&operands[i].0[..], &operands[i].1));

    let forward = attention_into(q, k, v, false, |len| stale(len + 1));
    let backward = attention_grad_into(q, k, v, g, false, |len| stale(len + 1));

    assert!(forward.is_err() && backward.is_err());
}

#[test]
fn to_contiguous_into_copies_a_strided_view_in_row_major_order() {
    let mut rng = Rng::new(94);
    for view in [
        View::Reversed,
        View::Narrowed,
        View::Broadcast,
        View::Contiguous,
    ] {
        let (data, l) = random_view(&mut rng, &[5, 7, 9], view);
        let want = to_contiguous(&data, &l).unwrap();
        let mut got = stale(want.len());

        to_contiguous_into(&data, &l, &mut got).unwrap();

        assert_eq!(bits(&got), bits(&want), "{view:?}");
        assert!(to_contiguous_into(&data, &l, &mut stale(want.len() + 1)).is_err());
    }
}
