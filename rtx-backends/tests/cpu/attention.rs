//! `attention` and `attention_grad` against softmax(q k^T / sqrt(D)) v written out in f64,
//! for query counts around the kernels' row groups and key blocks, odd feature widths,
//! causal or not, strided operands, and the same bits at every SIMD level.

use crate::common::{Rng, View, assert_close, bits, make_view, random_contiguous, read};
use rtx_backends::Layout;
use rtx_backends::cpu::{attention, attention_grad, set_simd_level, simd_level, simd_levels};

/// One slice's f64 attention: the output `[tq, dv]` and, given `g`, the gradients of q, k, v.
struct Reference {
    out: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn reference_slice(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: Option<&[f64]>,
    (tq, tk, d, dv): (usize, usize, usize, usize),
    causal: bool,
) -> Reference {
    let scale = 1.0 / (d as f64).sqrt();
    let mut r = Reference {
        out: vec![0.0; tq * dv],
        dq: vec![0.0; tq * d],
        dk: vec![0.0; tk * d],
        dv: vec![0.0; tk * dv],
    };
    for i in 0..tq {
        let end = if causal { i + 1 } else { tk };
        let s: Vec<f64> = (0..end)
            .map(|j| (0..d).map(|e| q[i * d + e] * k[j * d + e]).sum::<f64>() * scale)
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let total: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|x| x / total).collect();
        for c in 0..dv {
            r.out[i * dv + c] = (0..end).map(|j| p[j] * v[j * dv + c]).sum();
        }
        let Some(g) = g else { continue };
        let dp: Vec<f64> = (0..end)
            .map(|j| (0..dv).map(|c| g[i * dv + c] * v[j * dv + c]).sum())
            .collect();
        let dot: f64 = (0..end).map(|j| p[j] * dp[j]).sum();
        for j in 0..end {
            let ds = p[j] * (dp[j] - dot) * scale;
            for e in 0..d {
                r.dq[i * d + e] += ds * k[j * d + e];
                r.dk[j * d + e] += ds * q[i * d + e];
            }
            for c in 0..dv {
                r.dv[j * dv + c] += p[j] * g[i * dv + c];
            }
        }
    }
    r
}

/// (slices, tq, tk, d, dv): row counts below, at and past the row groups (4) and the key
/// blocks (32), feature widths below, at and past one vector register (16).
const SHAPES: [(usize, usize, usize, usize, usize); 8] = [
    (1, 1, 1, 1, 1),
    (2, 3, 3, 7, 7),
    (3, 4, 4, 16, 16),
    (2, 5, 5, 32, 32),
    (1, 31, 31, 17, 17),
    (2, 33, 33, 40, 40),
    (1, 64, 64, 32, 32),
    (1, 70, 70, 9, 9),
];

fn check_shape(
    rng: &mut Rng,
    (b, tq, tk, d, dv): (usize, usize, usize, usize, usize),
    causal: bool,
    view: View,
) {
    let shape = |t: usize, w: usize| [b, t, w];
    let mut fill = |r: &mut Rng| r.uniform() * 2.0;
    let (q, lq) = make_view(rng, &shape(tq, d), view, &mut fill);
    let (k, lk) = make_view(rng, &shape(tk, d), view, &mut fill);
    let (v, lv) = make_view(rng, &shape(tk, dv), view, &mut fill);
    let (g, lg) = make_view(rng, &shape(tq, dv), view, &mut fill);
    let (out, out_shape) = attention((&q, &lq), (&k, &lk), (&v, &lv), causal).unwrap();
    assert_eq!(out_shape.as_slice(), shape(tq, dv).as_slice());
    let same_shape = tq == tk && d == dv;
    let grads = same_shape.then(|| {
        let (grads, grad_shape) =
            attention_grad((&q, &lq), (&k, &lk), (&v, &lv), (&g, &lg), causal).unwrap();
        assert_eq!(grad_shape.as_slice(), [3, b, tq, d]);
        grads
    });
    let (q, k, v, g) = (read(&q, &lq), read(&k, &lk), read(&v, &lv), read(&g, &lg));
    let what = format!("{:?} causal={causal} {view:?}", (b, tq, tk, d, dv));
    for s in 0..b {
        let r = reference_slice(
            &q[s * tq * d..(s + 1) * tq * d],
            &k[s * tk * d..(s + 1) * tk * d],
            &v[s * tk * dv..(s + 1) * tk * dv],
            Some(&g[s * tq * dv..(s + 1) * tq * dv]),
            (tq, tk, d, dv),
            causal,
        );
        let rows = |x: &[f32], n: usize| x[s * n..(s + 1) * n].to_vec();
        assert_close(
            &rows(&out, tq * dv),
            &r.out,
            1e-5,
            1e-4,
            &format!("out {what}"),
        );
        if let Some(grads) = &grads {
            let part = b * tq * d;
            let (dq, dk, dv_) = (&grads[..part], &grads[part..2 * part], &grads[2 * part..]);
            assert_close(&rows(dq, tq * d), &r.dq, 1e-4, 1e-3, &format!("dq {what}"));
            assert_close(&rows(dk, tq * d), &r.dk, 1e-4, 1e-3, &format!("dk {what}"));
            assert_close(&rows(dv_, tq * d), &r.dv, 1e-4, 1e-3, &format!("dv {what}"));
        }
    }
}

#[test]
fn attention_matches_f64_reference_causal_and_not() {
    let mut rng = Rng::new(71);
    for shape in SHAPES {
        for causal in [true, false] {
            check_shape(&mut rng, shape, causal, View::Contiguous);
        }
    }
}

#[test]
fn attention_reads_strided_operands() {
    let mut rng = Rng::new(72);
    for view in [View::Reversed, View::Narrowed, View::Broadcast] {
        check_shape(&mut rng, (2, 37, 37, 24, 24), true, view);
    }
}

#[test]
fn attention_with_more_keys_than_queries() {
    let mut rng = Rng::new(73);
    for (tq, tk) in [(1, 45), (6, 33), (9, 70)] {
        check_shape(&mut rng, (2, tq, tk, 20, 12), false, View::Contiguous);
    }
}

#[test]
fn attention_gives_the_same_bits_at_every_simd_level() {
    let mut rng = Rng::new(74);
    let shape = [3, 45, 32];
    let operands: Vec<(Vec<f32>, Layout)> = (0..4)
        .map(|_| random_contiguous(&mut rng, &shape))
        .collect();
    let [q, k, v, g] = [0, 1, 2, 3].map(|i| (&operands[i].0[..], &operands[i].1));
    let initial = simd_level();
    let mut results = Vec::new();
    for level in simd_levels() {
        assert!(set_simd_level(level));
        let (out, _) = attention(q, k, v, true).unwrap();
        let (grads, _) = attention_grad(q, k, v, g, true).unwrap();
        results.push((level, bits(&out), bits(&grads)));
    }
    set_simd_level(initial);
    for r in &results[1..] {
        assert!(
            r.1 == results[0].1 && r.2 == results[0].2,
            "{} vs {}",
            r.0,
            results[0].0
        );
    }
}
