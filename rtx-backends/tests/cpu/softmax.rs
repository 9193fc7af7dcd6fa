use rtx_backends::cpu::{log_softmax, log_softmax_grad, softmax, softmax_grad};

use crate::common::*;

/// Row-major positions of each lane along `axis`.
fn lanes(shape: &[usize], axis: usize) -> Vec<Vec<usize>> {
    let mut by_rest: std::collections::BTreeMap<Vec<usize>, Vec<usize>> = Default::default();
    for linear in 0..numel(shape) {
        let mut index = unravel(linear, shape);
        index[axis] = 0;
        by_rest.entry(index).or_default().push(linear);
    }
    by_rest.into_values().collect()
}

#[test]
fn softmax_family_matches_reference() {
    let mut rng = Rng::new(50);
    let shape = [3, 4, 5];
    for view in ALL_VIEWS {
        for axis in 0..3 {
            let (x, lx) = make_view(&mut rng, &shape, view, &mut |r| r.uniform() * 5.0);
            let (g, lg) = random_view(&mut rng, &shape, View::Reversed);
            let (xv, gv) = (read(&x, &lx), read(&g, &lg));
            let mut want_soft = vec![0.0; xv.len()];
            let mut want_log = vec![0.0; xv.len()];
            let mut want_soft_grad = vec![0.0; xv.len()];
            let mut want_log_grad = vec![0.0; xv.len()];
            for lane in lanes(&shape, axis) {
                let total: f64 = lane.iter().map(|&p| xv[p].exp()).sum();
                for &p in &lane {
                    want_soft[p] = xv[p].exp() / total;
                    want_log[p] = xv[p] - total.ln();
                }
                let dot: f64 = lane.iter().map(|&p| gv[p] * want_soft[p]).sum();
                let g_total: f64 = lane.iter().map(|&p| gv[p]).sum();
                for &p in &lane {
                    want_soft_grad[p] = want_soft[p] * (gv[p] - dot);
                    want_log_grad[p] = gv[p] - want_soft[p] * g_total;
                }
            }
            let what = format!("{view:?} axis {axis}");
            let y = softmax(&x, &lx, axis);
            assert_close(&y, &want_soft, 1e-6, 1e-4, &format!("softmax {what}"));
            let log_y = log_softmax(&x, &lx, axis);
            assert_close(
                &log_y,
                &want_log,
                1e-6,
                1e-4,
                &format!("log_softmax {what}"),
            );

            // The grads take the forward outputs, here as a transposed view of them.
            let contiguous = rtx_backends::Layout::contiguous(&shape);
            let stored: Vec<usize> = shape.iter().rev().copied().collect();
            let transpose = |values: &[f32]| -> (Vec<f32>, rtx_backends::Layout) {
                let mut data = vec![0.0; values.len()];
                for (linear, &v) in values.iter().enumerate() {
                    let mut index = unravel(linear, &shape);
                    index.reverse();
                    data[ravel(&index, &stored)] = v;
                }
                (
                    data,
                    rtx_backends::Layout::contiguous(&stored).permute(&[2, 1, 0]),
                )
            };
            let (yt, lyt) = transpose(&y);
            assert_close(
                &softmax_grad(&yt, &lyt, &g, &lg, axis),
                &want_soft_grad,
                1e-6,
                1e-4,
                &format!("softmax_grad {what}"),
            );
            assert_close(
                &log_softmax_grad(&log_y, &contiguous, &g, &lg, axis),
                &want_log_grad,
                1e-6,
                1e-4,
                &format!("log_softmax_grad {what}"),
            );
        }
    }
}

#[test]
fn softmax_is_stable_for_large_logits_and_long_rows() {
    let x = [1000.0f32, 999.0, -1000.0];
    let l = rtx_backends::Layout::contiguous(&[3]);
    let y = softmax(&x, &l, 0);
    assert!(y.iter().all(|v| v.is_finite()));
    assert!((y[0] - 0.731_058_6).abs() < 1e-6);
    assert!(log_softmax(&x, &l, 0).iter().all(|v| v.is_finite()));

    let mut rng = Rng::new(51);
    let (x, l) = random_contiguous(&mut rng, &[300, 200]);
    let y = softmax(&x, &l, 1);
    for row in y.chunks(200) {
        assert!((row.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < 1e-5);
    }
}
