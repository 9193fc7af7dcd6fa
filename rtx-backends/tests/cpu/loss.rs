use rtx_backends::Layout;
use rtx_backends::cpu::{LabelOutOfRange, cross_entropy, cross_entropy_grad};

use crate::common::*;

#[test]
fn cross_entropy_and_grad_match_reference() {
    let mut rng = Rng::new(60);
    for (n, c) in [(1, 1), (5, 3), (64, 10), (400, 100)] {
        for view in [View::Contiguous, View::Reversed, View::Narrowed] {
            let (x, l) = make_view(&mut rng, &[n, c], view, &mut |r| r.uniform() * 6.0);
            let labels: Vec<i64> = (0..n).map(|_| rng.below(c) as i64).collect();
            let xv = read(&x, &l);
            let upstream = 0.7f32;
            let mut want_loss = 0.0;
            let mut want_grad = vec![0.0; n * c];
            for i in 0..n {
                let row = &xv[i * c..(i + 1) * c];
                let log_total = row.iter().map(|v| v.exp()).sum::<f64>().ln();
                want_loss += log_total - row[labels[i] as usize];
                for j in 0..c {
                    let one_hot = if j as i64 == labels[i] { 1.0 } else { 0.0 };
                    want_grad[i * c + j] =
                        ((row[j] - log_total).exp() - one_hot) * upstream as f64 / n as f64;
                }
            }
            want_loss /= n as f64;
            let what = format!("{n}x{c} {view:?}");
            let loss = cross_entropy(&x, &l, &labels).unwrap();
            assert_close(&[loss], &[want_loss], 1e-6, 1e-4, &what);
            let grad = cross_entropy_grad(&x, &l, &labels, upstream).unwrap();
            assert_close(&grad, &want_grad, 1e-7, 1e-4, &what);
        }
    }
}

#[test]
fn cross_entropy_rejects_out_of_range_labels() {
    let x = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
    let l = Layout::contiguous(&[2, 3]);
    for (labels, index, label) in [([0i64, 3], 1, 3), ([-1, 0], 0, -1)] {
        let want = LabelOutOfRange {
            index,
            label,
            classes: 3,
        };
        assert_eq!(cross_entropy(&x, &l, &labels), Err(want.clone()));
        assert_eq!(cross_entropy_grad(&x, &l, &labels, 1.0), Err(want));
    }
}
