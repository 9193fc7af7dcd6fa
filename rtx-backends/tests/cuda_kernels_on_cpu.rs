//! The CUDA runtime's core-op kernels (`cuda::kernels::SOURCE`) built for this CPU
//! (`cuda::on_cpu`) and run over their whole grids with the meta words `kernel_meta` writes
//! for the GPU, against references computed here on fresh random inputs, through strided
//! and offset views. Without a C++ compiler each test says it was skipped, by name
//! (`RTX_REQUIRE_CXX=1`, as in CI, makes that a failure).
#![cfg(feature = "cuda")]

use std::ffi::c_void;

use rtx_backends::cuda::kernels::{BLOCK, SOURCE};
use rtx_backends::cuda::on_cpu::CudaOnCpu;
use rtx_backends::kernel_meta::{self, Reduce};

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
    let mut all = vec![ptr(meta)];
    all.extend_from_slice(params);
    let blocks = threads.div_ceil(BLOCK as usize) as u32;
    // SAFETY: each test passes the kernel's parameters in order, with buffers of the sizes
    // its meta words describe.
    unsafe { d.launch(entry, SOURCE, entry, &all, [blocks, 1, 1], [BLOCK, 1, 1]) }
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
