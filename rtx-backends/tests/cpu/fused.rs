use rtx_backends::Layout;
use rtx_backends::cpu::{KernelError, map_fused, map_rows};

use crate::common::*;

/// The body the tests run: two inputs, two outputs, a few ops.
fn body([a, b]: [f32; 2]) -> [f32; 2] {
    let s = a * 2.0 + b;
    [s.max(0.0), s * b - 0.25]
}

fn check(a: &[f32], la: &Layout, b: &[f32], lb: &Layout, shape: &[usize]) {
    let [y0, y1] = map_fused([(a, la), (b, lb)], shape, body).unwrap();
    let (ra, rb) = (read(a, la), read(b, lb));
    assert_eq!(y0.len(), ra.len());
    for i in 0..ra.len() {
        let want = body([ra[i] as f32, rb[i] as f32]);
        assert_eq!([y0[i], y1[i]], want, "element {i} of {shape:?}");
    }
}

#[test]
fn fused_map_matches_the_body_on_odd_lengths() {
    // Lengths around the 8-lane blocks and the parallel threshold.
    let mut rng = Rng::new(40);
    for n in [1, 7, 8, 9, 255, 257, 40_000, 70_001] {
        let (a, b) = (rng.vec(n), rng.vec(n));
        let l = Layout::contiguous(&[n]);
        check(&a, &l, &b, &l, &[n]);
    }
}

#[test]
fn fused_map_reads_broadcast_and_strided_inputs() {
    let mut rng = Rng::new(41);
    let (a, b) = (rng.vec(6 * 5), rng.vec(5));
    let transposed = Layout {
        shape: vec![5, 6].into(),
        strides: vec![1, 5].into(),
        offset: 0,
    };
    let row = Layout::contiguous(&[5]).broadcast_to(&[6, 5]);
    let col = Layout {
        shape: vec![5, 6].into(),
        strides: vec![1, 0].into(),
        offset: 0,
    };
    check(&a, &Layout::contiguous(&[6, 5]), &b, &row, &[6, 5]);
    check(&a, &transposed, &b, &col, &[5, 6]);
}

#[test]
fn fused_map_of_a_buffer_beyond_the_caches_matches_the_body() {
    // 9M elements x 2 outputs: past the size where stores bypass the caches.
    let mut rng = Rng::new(42);
    let n = 9 * 1024 * 1024 + 3;
    let (a, b) = (rng.vec(n), rng.vec(n));
    let l = Layout::contiguous(&[n]);
    let [y0, y1] = map_fused([(&a[..], &l), (&b[..], &l)], &[n], body).unwrap();
    for i in (0..n).step_by(997).chain(n - 20..n) {
        assert_eq!([y0[i], y1[i]], body([a[i], b[i]]), "element {i}");
    }
}

#[test]
fn map_fused_refuses_an_input_of_another_shape() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 6]);
    let err = map_fused(
        [
            (&a[..], &Layout::contiguous(&[2, 3])),
            (&b[..], &Layout::contiguous(&[3, 2])),
        ],
        &[2, 3],
        body,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "map_fused",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn map_fused_refuses_an_input_that_reads_past_its_buffer() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 5]);
    let l = Layout::contiguous(&[2, 3]);
    let err = map_fused([(&a[..], &l), (&b[..], &l)], &[2, 3], body).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::View {
                arg: "inputs[1]",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn map_rows_refuses_an_input_of_another_shape() {
    let x = [0.0f32; 6];
    let err = map_rows(
        [(&x[..], &Layout::contiguous(&[3, 2]))],
        &[2, 3],
        [false],
        |_, _, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "map_rows",
                ..
            }
        ),
        "{err}"
    );
}
