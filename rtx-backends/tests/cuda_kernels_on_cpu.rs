//! The CUDA runtime's core-op kernels (`cuda::kernels::SOURCE`) built for this CPU
//! (`cuda::on_cpu`) and run over their whole grids with the meta words `kernel_meta` writes
//! for the GPU, against references computed here on fresh random inputs, through strided
//! and offset views. Without a C++ compiler each test says it was skipped, by name
//! (`RTX_REQUIRE_CXX=1`, as in CI, makes that a failure).
#![cfg(feature = "cuda")]

use std::ffi::c_void;

use rtx_backends::cuda::kernels::{BLOCK, SOURCE};
use rtx_backends::cuda::on_cpu::CudaOnCpu;
use rtx_backends::kernel_meta::{self, Reduce, UpdateRule};

fn device(test: &str) -> Option<CudaOnCpu> {
    match CudaOnCpu::open() {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(
                std::env::var("RTX_REQUIRE_CXX").as_deref() != Ok("1"),
                "{test}: RTX_REQUIRE_CXX=1 but {e}"
            );
            eprintln!("skipped: {test}: {e}");
            None
        }
    }
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

fn ptr<T>(v: &[T]) -> *mut c_void {
    v.as_ptr() as *mut c_void
}

/// A buffer the kernel writes.
fn out<T>(v: &mut [T]) -> *mut c_void {
    v.as_mut_ptr() as *mut c_void
}

/// Runs `entry` over `threads` threads with `meta` first and then `params`.
fn run(d: &CudaOnCpu, entry: &str, meta: &[u32], params: &[*mut c_void], threads: usize) {
    let blocks = threads.div_ceil(BLOCK as usize) as u32;
    // SAFETY: each test passes the kernel's parameters in order, with buffers of the sizes
    // its meta words describe.
    unsafe {
        d.launch(
            entry,
            SOURCE,
            entry,
            meta,
            params,
            [blocks, 1, 1],
            [BLOCK, 1, 1],
        )
    }
    .unwrap_or_else(|e| panic!("{entry}: {e}"));
}

/// Row-major coordinates of element `i` of `shape`.
fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for axis in (0..shape.len()).rev() {
        c[axis] = i % shape[axis];
        i /= shape[axis];
    }
    c
}

#[test]
fn reductions_over_any_axes_of_a_strided_view_match_the_reference() {
    let Some(d) = device("reductions_over_any_axes_of_a_strided_view_match_the_reference") else {
        return;
    };
    // A [3, 4, 5] view of a [5, 4, 3] buffer (axes reversed) from element 7.
    let shape = [3usize, 4, 5];
    let strides = [1usize, 3, 12];
    let offset = 7;
    let mut x = random(offset + 60, 1);
    // Element (2, 3, 4) of the view.
    x[offset + 2 + 3 * 3 + 4 * 12] = f32::NAN;
    let at = |c: &[usize]| x[offset + c.iter().zip(&strides).map(|(a, b)| a * b).sum::<usize>()];
    for reduced in [
        [false, true, false],
        [true, false, true],
        [true, true, true],
        [false, false, true],
    ] {
        for mode in [Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::ArgMax] {
            let (meta, outputs) =
                kernel_meta::reduce(&shape, &strides, offset, &reduced, mode).unwrap();
            let mut result = vec![0f32; outputs];
            run(
                &d,
                "rtx_reduce",
                &meta,
                &[ptr(&x), out(&mut result)],
                outputs,
            );
            let kept: Vec<usize> = (0..3).filter(|&a| !reduced[a]).map(|a| shape[a]).collect();
            let red: Vec<usize> = (0..3).filter(|&a| reduced[a]).map(|a| shape[a]).collect();
            for (o, &got) in result.iter().enumerate() {
                let kc = coords(o, &kept);
                let values: Vec<f32> = (0..red.iter().product())
                    .map(|e| {
                        let rc = coords(e, &red);
                        let (mut ki, mut ri) = (kc.iter(), rc.iter());
                        let c: Vec<usize> = (0..3)
                            .map(|a| *if reduced[a] { ri.next() } else { ki.next() }.unwrap())
                            .collect();
                        at(&c)
                    })
                    .collect();
                let what = format!("{mode:?} over {reduced:?}, output {o}");
                match mode {
                    Reduce::Sum | Reduce::Mean => {
                        let sum: f64 = values.iter().map(|&v| v as f64).sum();
                        let want = if mode == Reduce::Mean {
                            sum / values.len() as f64
                        } else {
                            sum
                        };
                        if want.is_nan() {
                            assert!(got.is_nan(), "{what}: {got}");
                        } else {
                            assert!((got as f64 - want).abs() < 1e-5, "{what}: {got} vs {want}");
                        }
                    }
                    Reduce::Max => {
                        let want = if values.iter().any(|v| v.is_nan()) {
                            f32::NAN
                        } else {
                            values.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                        };
                        assert!(
                            got == want || (got.is_nan() && want.is_nan()),
                            "{what}: {got} vs {want}"
                        );
                    }
                    Reduce::ArgMax => {
                        let want = values.iter().position(|v| v.is_nan()).unwrap_or_else(|| {
                            let best = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                            values.iter().position(|&v| v == best).unwrap()
                        });
                        assert_eq!(got.to_bits() as usize, want, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn pick_and_its_gradient_route_one_column_per_row() {
    let Some(d) = device("pick_and_its_gradient_route_one_column_per_row") else {
        return;
    };
    let (rows, cols) = (37usize, 11usize);
    let x = random(rows * cols, 2);
    let idx: Vec<u32> = (0..rows).map(|r| ((r * 7 + 3) % cols) as u32).collect();
    let meta = kernel_meta::words(&[rows, cols], "size").unwrap();
    let mut picked = vec![0f32; rows];
    run(
        &d,
        "rtx_pick",
        &meta,
        &[ptr(&x), ptr(&idx), out(&mut picked)],
        rows,
    );
    for r in 0..rows {
        assert_eq!(picked[r], x[r * cols + idx[r] as usize], "row {r}");
    }
    let g = random(rows, 3);
    let mut grad = vec![1f32; rows * cols];
    run(
        &d,
        "rtx_pick_grad",
        &meta,
        &[ptr(&g), ptr(&idx), out(&mut grad)],
        rows * cols,
    );
    for (e, &value) in grad.iter().enumerate() {
        let (r, j) = (e / cols, e % cols);
        let want = if j == idx[r] as usize { g[r] } else { 0.0 };
        assert_eq!(value, want, "element ({r}, {j})");
    }
}

#[test]
fn embedding_rows_gather_from_a_transposed_table_and_scatter_back_in_order() {
    let Some(d) = device("embedding_rows_gather_from_a_transposed_table_and_scatter_back_in_order")
    else {
        return;
    };
    // A [vocab, cols] table read through its transpose's buffer ([cols, vocab]) from 3 on.
    let (vocab, cols, rows, offset) = (13usize, 6usize, 40usize, 3usize);
    let w = random(offset + vocab * cols, 4);
    let ids: Vec<u32> = (0..rows).map(|r| ((r * r + 5) % vocab) as u32).collect();
    let meta = kernel_meta::gather_rows(rows, cols, offset, 1, vocab).unwrap();
    let mut gathered = vec![0f32; rows * cols];
    run(
        &d,
        "rtx_gather_rows",
        &meta,
        &[ptr(&w), ptr(&ids), out(&mut gathered)],
        rows * cols,
    );
    for r in 0..rows {
        for j in 0..cols {
            assert_eq!(
                gathered[r * cols + j],
                w[offset + ids[r] as usize + j * vocab],
                "({r}, {j})"
            );
        }
    }
    // The gradient: rows grouped by id (counting sort), then one ordered sum per output.
    let g = random(rows * cols, 5);
    let mut starts = vec![0u32; vocab + 1];
    for &id in &ids {
        starts[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        starts[v + 1] += starts[v];
    }
    let mut fill = starts.clone();
    let mut grouped = vec![0u32; rows];
    for (r, &id) in ids.iter().enumerate() {
        grouped[fill[id as usize] as usize] = r as u32;
        fill[id as usize] += 1;
    }
    let meta = kernel_meta::words(&[vocab, cols], "size").unwrap();
    let mut dw = vec![0f32; vocab * cols];
    run(
        &d,
        "rtx_scatter_rows",
        &meta,
        &[ptr(&g), ptr(&starts), ptr(&grouped), out(&mut dw)],
        vocab * cols,
    );
    for v in 0..vocab {
        for j in 0..cols {
            let want = (0..rows)
                .filter(|&r| ids[r] as usize == v)
                .fold(0f32, |acc, r| acc + g[r * cols + j]);
            assert_eq!(dw[v * cols + j], want, "({v}, {j})");
        }
    }
}

#[test]
fn a_strided_copy_writes_a_transposed_view_into_an_offset_one() {
    let Some(d) = device("a_strided_copy_writes_a_transposed_view_into_an_offset_one") else {
        return;
    };
    // x: [4, 6] read as the transpose of a [6, 4] buffer; out: rows of 9 from element 2.
    let shape = [4usize, 6];
    let x = random(24, 6);
    let mut dst = vec![-1f32; 2 + 4 * 9];
    let meta = kernel_meta::strided_copy(&shape, (0, &[1, 4]), (2, &[9, 1])).unwrap();
    run(&d, "rtx_copy_into", &meta, &[ptr(&x), out(&mut dst)], 24);
    for i in 0..4 {
        for j in 0..9 {
            let want = if j < 6 { x[j * 4 + i] } else { -1.0 };
            assert_eq!(dst[2 + i * 9 + j], want, "({i}, {j})");
        }
    }
    assert_eq!(&dst[..2], &[-1.0, -1.0]);
}

#[test]
fn the_max_gradient_goes_to_each_groups_first_maximum() {
    let Some(d) = device("the_max_gradient_goes_to_each_groups_first_maximum") else {
        return;
    };
    // [5, 8] with ties: values in a few levels, reduced over the last axis.
    let shape = [5usize, 8];
    let x: Vec<f32> = (0..40).map(|i| ((i * 37) % 5) as f32).collect();
    let (meta, outputs) =
        kernel_meta::reduce(&shape, &[8, 1], 0, &[false, true], Reduce::ArgMax).unwrap();
    let mut firsts = vec![0u32; outputs];
    run(
        &d,
        "rtx_reduce",
        &meta,
        &[ptr(&x), out(&mut firsts)],
        outputs,
    );
    let g = random(5, 7);
    let mut grad = vec![9f32; 40];
    let meta = kernel_meta::scatter_first(&shape, &[false, true]).unwrap();
    run(
        &d,
        "rtx_scatter_first",
        &meta,
        &[ptr(&g), ptr(&firsts), out(&mut grad)],
        40,
    );
    for r in 0..5 {
        let row = &x[r * 8..][..8];
        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first = row.iter().position(|&v| v == best).unwrap();
        for j in 0..8 {
            let want = if j == first { g[r] } else { 0.0 };
            assert_eq!(grad[r * 8 + j], want, "({r}, {j})");
        }
    }
}

/// The CPU's Adam and SGD updates (`rtx_core::optim`), element by element in f32.
fn step_reference(rule: UpdateRule, p: &mut [f32], g: &[f32], s1: &mut [f32], s2: &mut [f32]) {
    for i in 0..p.len() {
        let mut x = p[i];
        match rule {
            UpdateRule::Adam {
                lr,
                betas: (b1, b2),
                eps,
                weight_decay: wd,
                decoupled,
                corrections: (c1, c2),
            } => {
                let mut gi = g[i];
                if decoupled {
                    x *= 1.0 - lr * wd;
                } else {
                    gi += wd * x;
                }
                s1[i] = b1 * s1[i] + (1.0 - b1) * gi;
                s2[i] = b2 * s2[i] + (1.0 - b2) * gi * gi;
                x -= lr * (s1[i] / c1) / ((s2[i] / c2).sqrt() + eps);
            }
            UpdateRule::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay: wd,
                first_step,
            } => {
                let d = g[i] + wd * x;
                if momentum == 0.0 {
                    x -= lr * d;
                } else {
                    let b = if first_step {
                        d
                    } else {
                        momentum * s1[i] + (1.0 - dampening) * d
                    };
                    s1[i] = b;
                    x -= lr * if nesterov { d + momentum * b } else { b };
                }
            }
        }
        p[i] = x;
    }
}

#[test]
fn optimizer_steps_follow_the_cpus_adam_and_sgd_formulas() {
    let Some(d) = device("optimizer_steps_follow_the_cpus_adam_and_sgd_formulas") else {
        return;
    };
    let n = 300;
    let rules = [
        UpdateRule::Adam {
            lr: 1e-2,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.1,
            decoupled: true,
            corrections: (0.19, 0.003),
        },
        UpdateRule::Adam {
            lr: 3e-3,
            betas: (0.8, 0.99),
            eps: 1e-6,
            weight_decay: 0.01,
            decoupled: false,
            corrections: (0.5, 0.02),
        },
        UpdateRule::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.1,
            nesterov: true,
            weight_decay: 1e-3,
            first_step: false,
        },
        UpdateRule::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            first_step: true,
        },
        UpdateRule::Sgd {
            lr: 0.05,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.01,
            first_step: false,
        },
    ];
    for (r, rule) in rules.into_iter().enumerate() {
        let g = random(n, 20 + r as u64);
        let (mut p, mut s1) = (random(n, 30 + r as u64), random(n, 40 + r as u64));
        let mut s2: Vec<f32> = random(n, 50).iter().map(|v| v.abs()).collect();
        let (mut wp, mut ws1, mut ws2) = (p.clone(), s1.clone(), s2.clone());
        step_reference(rule, &mut wp, &g, &mut ws1, &mut ws2);
        let meta = kernel_meta::optimizer(rule, n).unwrap();
        run(
            &d,
            "rtx_optimizer_step",
            &meta,
            &[out(&mut p), ptr(&g), out(&mut s1), out(&mut s2)],
            n,
        );
        for i in 0..n {
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-6 * (1.0 + b.abs());
            assert!(
                close(p[i], wp[i]),
                "{rule:?}: parameter {i}: {} vs {}",
                p[i],
                wp[i]
            );
            assert!(close(s1[i], ws1[i]), "{rule:?}: first state {i}");
            assert!(close(s2[i], ws2[i]), "{rule:?}: second state {i}");
        }
    }
}

/// Attention and its gradients in f64: `(out, dq, dk, dv)` over `[S, T, D]` operands.
fn attention_reference(
    (s, t, d): (usize, usize, usize),
    causal: bool,
    [q, k, v, g]: [&[f32]; 4],
) -> [Vec<f64>; 4] {
    let scale = 1.0 / (d as f64).sqrt();
    let (mut out, mut dq, mut dk, mut dv) = (
        vec![0f64; s * t * d],
        vec![0f64; s * t * d],
        vec![0f64; s * t * d],
        vec![0f64; s * t * d],
    );
    let at = |x: &[f32], sl: usize, row: usize, c: usize| x[(sl * t + row) * d + c] as f64;
    for sl in 0..s {
        for i in 0..t {
            let keys = if causal { i + 1 } else { t };
            let scores: Vec<f64> = (0..keys)
                .map(|j| {
                    (0..d)
                        .map(|c| at(q, sl, i, c) * at(k, sl, j, c))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
            let p: Vec<f64> = scores.iter().map(|x| (x - max).exp() / sum).collect();
            let dp: Vec<f64> = (0..keys)
                .map(|j| (0..d).map(|c| at(g, sl, i, c) * at(v, sl, j, c)).sum())
                .collect();
            let mean: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..keys {
                let ds = p[j] * (dp[j] - mean) * scale;
                for c in 0..d {
                    let o = (sl * t + i) * d + c;
                    let kv = (sl * t + j) * d + c;
                    out[o] += p[j] * at(v, sl, j, c);
                    dq[o] += ds * at(k, sl, j, c);
                    dk[kv] += ds * at(q, sl, i, c);
                    dv[kv] += p[j] * at(g, sl, i, c);
                }
            }
        }
    }
    [out, dq, dk, dv]
}

#[test]
fn attention_and_its_gradients_match_the_f64_reference_causal_or_not() {
    use rtx_backends::cuda::attention::{ATTENTION_BLOCK, ATTENTION_SOURCE};
    use rtx_backends::kernel_meta::AttentionShape;
    let Some(d) = device("attention_and_its_gradients_match_the_f64_reference_causal_or_not")
    else {
        return;
    };
    let (s, t, h) = (3usize, 9usize, 8usize);
    let n = s * t * h;
    let (q, k, v, g) = (random(n, 60), random(n, 61), random(n, 62), random(n, 63));
    for causal in [false, true] {
        let shape = AttentionShape {
            slices: s,
            queries: t,
            keys: t,
            head: h,
            value_head: h,
            causal,
        };
        let meta = shape.meta().unwrap();
        let launch = |entry: &str, params: &[*mut c_void]| {
            let blocks = (s * t).div_ceil(ATTENTION_BLOCK as usize) as u32;
            // SAFETY: the kernels' parameters in order, each buffer of the size the meta says.
            unsafe {
                d.launch(
                    entry,
                    ATTENTION_SOURCE,
                    entry,
                    &meta,
                    params,
                    [blocks, 1, 1],
                    [ATTENTION_BLOCK, 1, 1],
                )
            }
            .unwrap_or_else(|e| panic!("{entry}: {e}"));
        };
        let mut o = vec![0f32; n];
        launch("rtx_attention", &[ptr(&q), ptr(&k), ptr(&v), out(&mut o)]);
        let (mut stats, mut grads) = (vec![0f32; s * t * 3], vec![0f32; 3 * n]);
        launch(
            "rtx_attention_grad_q",
            &[
                ptr(&q),
                ptr(&k),
                ptr(&v),
                ptr(&g),
                out(&mut stats),
                out(&mut grads),
            ],
        );
        launch(
            "rtx_attention_grad_kv",
            &[
                ptr(&q),
                ptr(&k),
                ptr(&v),
                ptr(&g),
                ptr(&stats),
                out(&mut grads),
            ],
        );
        let want = attention_reference((s, t, h), causal, [&q, &k, &v, &g]);
        let got = [&o[..], &grads[..n], &grads[n..2 * n], &grads[2 * n..]];
        for (name, (got, want)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            for (e, (&a, &b)) in got.iter().zip(want).enumerate() {
                assert!(
                    (a as f64 - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                    "causal={causal} {name}[{e}]: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn convolution_passes_match_the_f64_reference_with_strides_and_padding() {
    use rtx_backends::cuda::window::{WINDOW_BLOCK, WINDOW_SOURCE};
    use rtx_backends::kernel_meta::{ConvPass, ConvShape};
    let Some(d) = device("convolution_passes_match_the_f64_reference_with_strides_and_padding")
    else {
        return;
    };
    let ([n, c, h, w], [o, kh, kw], [sh, sw], [ph, pw]) = ([2, 3, 7, 6], [4, 3, 2], [2, 1], [1, 1]);
    let (oh, ow) = ((h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1);
    let shape = ConvShape {
        x: [n, c, h, w],
        w: [o, c, kh, kw],
        y: [n, o, oh, ow],
        stride: [sh, sw],
        padding: [ph, pw],
    };
    let x = random(n * c * h * w, 70);
    let wt = random(o * c * kh * kw, 71);
    let g = random(n * o * oh * ow, 72);
    let (mut y, mut dx, mut dw) = (
        vec![0f64; n * o * oh * ow],
        vec![0f64; n * c * h * w],
        vec![0f64; o * c * kh * kw],
    );
    for (b, oc, i, j, ci, ki, kj) in (0..n * o * oh * ow * c * kh * kw).map(|e| {
        let mut r = e;
        let mut take = |m: usize| {
            let v = r % m;
            r /= m;
            v
        };
        let kj = take(kw);
        let ki = take(kh);
        let ci = take(c);
        let j = take(ow);
        let i = take(oh);
        let oc = take(o);
        (take(n), oc, i, j, ci, ki, kj)
    }) {
        let (ih, iw) = (
            (i * sh + ki) as isize - ph as isize,
            (j * sw + kj) as isize - pw as isize,
        );
        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
            continue;
        }
        let xi = ((b * c + ci) * h + ih as usize) * w + iw as usize;
        let wi = ((oc * c + ci) * kh + ki) * kw + kj;
        let yi = ((b * o + oc) * oh + i) * ow + j;
        y[yi] += x[xi] as f64 * wt[wi] as f64;
        dx[xi] += g[yi] as f64 * wt[wi] as f64;
        dw[wi] += x[xi] as f64 * g[yi] as f64;
    }
    for (pass, a, b, want) in [
        (ConvPass::Forward, &x, &wt, &y),
        (ConvPass::GradInput, &g, &wt, &dx),
        (ConvPass::GradWeight, &x, &g, &dw),
    ] {
        let (meta, outputs) = kernel_meta::conv2d(pass, shape).unwrap();
        assert_eq!(outputs, want.len());
        let mut got = vec![0f32; outputs];
        let all = [ptr(a), ptr(b), out(&mut got)];
        let blocks = outputs.div_ceil(WINDOW_BLOCK as usize) as u32;
        // SAFETY: meta, a, b, out, as the kernel takes them, sized as the meta says.
        unsafe {
            d.launch(
                "rtx_conv2d",
                WINDOW_SOURCE,
                "rtx_conv2d",
                &meta,
                &all,
                [blocks, 1, 1],
                [WINDOW_BLOCK, 1, 1],
            )
        }
        .unwrap();
        for (e, (&a, &b)) in got.iter().zip(want.iter()).enumerate() {
            assert!((a as f64 - b).abs() < 1e-4, "{pass:?}[{e}]: {a} vs {b}");
        }
    }
}

#[test]
fn pooling_and_its_gradients_follow_the_cpus_rules() {
    use rtx_backends::cuda::window::{WINDOW_BLOCK, WINDOW_SOURCE};
    use rtx_backends::kernel_meta::PoolPass;
    let Some(d) = device("pooling_and_its_gradients_follow_the_cpus_rules") else {
        return;
    };
    let ([n, c, h, w], k, s, p) = ([2usize, 3, 7, 6], [3usize, 3], [2usize, 2], [1usize, 1]);
    let (oh, ow) = (
        (h + 2 * p[0] - k[0]) / s[0] + 1,
        (w + 2 * p[1] - k[1]) / s[1] + 1,
    );
    // Ties (values on a coarse grid) and one NaN.
    let mut x: Vec<f32> = random(n * c * h * w, 80)
        .iter()
        .map(|v| (v * 2.0).round())
        .collect();
    x[17] = f32::NAN;
    let g = random(n * c * oh * ow, 81);
    let taps = |plane: usize, i: usize, j: usize| {
        let mut t = Vec::new();
        for a in 0..k[0] {
            for b in 0..k[1] {
                let (ih, iw) = (
                    (i * s[0] + a) as isize - p[0] as isize,
                    (j * s[1] + b) as isize - p[1] as isize,
                );
                if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < w {
                    t.push(plane * h * w + ih as usize * w + iw as usize);
                }
            }
        }
        t
    };
    let first_max = |t: &[usize]| -> usize {
        t.iter()
            .copied()
            .find(|&i| x[i].is_nan())
            .unwrap_or_else(|| {
                let best = t.iter().map(|&i| x[i]).fold(f32::NEG_INFINITY, f32::max);
                t.iter().copied().find(|&i| x[i] == best).unwrap()
            })
    };
    let (mut max, mut avg) = (vec![0f32; n * c * oh * ow], vec![0f32; n * c * oh * ow]);
    let (mut dmax, mut davg) = (vec![0f32; n * c * h * w], vec![0f32; n * c * h * w]);
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let o = (plane * oh + i) * ow + j;
                let t = taps(plane, i, j);
                let at = first_max(&t);
                max[o] = x[at];
                avg[o] = t.iter().map(|&e| x[e]).sum::<f32>() / 9.0;
                dmax[at] += g[o];
                for &e in &t {
                    davg[e] += g[o] / 9.0;
                }
            }
        }
    }
    for (pass, a, b, want) in [
        (PoolPass::Max, &x, &x, &max),
        (PoolPass::Avg, &x, &x, &avg),
        (PoolPass::MaxGrad, &x, &g, &dmax),
        (PoolPass::AvgGrad, &g, &g, &davg),
    ] {
        let (meta, outputs) = kernel_meta::pool2d(pass, [n, c, h, w], (k, s, p), [oh, ow]).unwrap();
        let mut got = vec![0f32; outputs];
        let all = [ptr(a), ptr(b), out(&mut got)];
        let blocks = outputs.div_ceil(WINDOW_BLOCK as usize) as u32;
        // SAFETY: meta, a, b, out, as the kernel takes them, sized as the meta says.
        unsafe {
            d.launch(
                "rtx_pool2d",
                WINDOW_SOURCE,
                "rtx_pool2d",
                &meta,
                &all,
                [blocks, 1, 1],
                [WINDOW_BLOCK, 1, 1],
            )
        }
        .unwrap();
        for (e, (&a, &b)) in got.iter().zip(want.iter()).enumerate() {
            let same = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(same, "{pass:?}[{e}]: {a} vs {b}");
        }
    }
}

#[test]
fn top_k_picks_nan_first_then_larger_then_earlier_and_routes_its_gradient() {
    let Some(d) = device("top_k_picks_nan_first_then_larger_then_earlier_and_routes_its_gradient")
    else {
        return;
    };
    let (rows, n, k) = (9usize, 13usize, 5usize);
    let mut x: Vec<f32> = random(rows * n, 90)
        .iter()
        .map(|v| (v * 2.0).round())
        .collect();
    x[3] = f32::NAN;
    x[n + 7] = f32::NAN;
    let meta = kernel_meta::words(&[0, rows, n, k], "size").unwrap();
    let (mut values, mut positions) = (vec![0f32; rows * k], vec![0u32; rows * k]);
    run(
        &d,
        "rtx_top_k",
        &meta,
        &[ptr(&x), ptr(&x), out(&mut values), out(&mut positions)],
        rows,
    );
    let g = random(rows * k, 91);
    let meta = kernel_meta::words(&[1, rows, n, k], "size").unwrap();
    let (mut grad, mut unused) = (vec![7f32; rows * n], vec![0u32; 1]);
    run(
        &d,
        "rtx_top_k",
        &meta,
        &[ptr(&x), ptr(&g), out(&mut grad), out(&mut unused)],
        rows,
    );
    for r in 0..rows {
        let row = &x[r * n..][..n];
        let mut order: Vec<usize> = (0..n).collect();
        // NaN first, then larger, then earlier: a stable sort on that key.
        order.sort_by(|&a, &b| {
            let (va, vb) = (row[a], row[b]);
            vb.is_nan()
                .cmp(&va.is_nan())
                .then(vb.partial_cmp(&va).unwrap_or(std::cmp::Ordering::Equal))
        });
        for t in 0..k {
            assert_eq!(positions[r * k + t] as usize, order[t], "row {r} pick {t}");
            let (got, want) = (values[r * k + t], row[order[t]]);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "row {r} pick {t}"
            );
        }
        for j in 0..n {
            let want = order[..k]
                .iter()
                .position(|&p| p == j)
                .map_or(0.0, |t| g[r * k + t]);
            assert_eq!(grad[r * n + j], want, "gradient ({r}, {j})");
        }
    }
}
