//! The CUDA runtime on the machine's first GPU: buffers, emitted-style kernels, cuBLAS
//! products against a float64 reference on fresh random inputs, and the errors. Without a
//! GPU (or libcuda, libcublas, libnvrtc) each test says it was skipped, by name;
//! `RTX_REQUIRE_CUDA=1` (as in `scripts/gpu_check.sh`) makes that a failure. The tests that
//! need no driver (buffers, launches, products through strided views) also run on
//! `CudaDevice::on_cpu`, on every machine, and with the `hip` feature on the first AMD GPU
//! (`CudaDevice::open_hip`) when there is one (`RTX_REQUIRE_HIP=1` makes its absence a
//! failure).
#![cfg(feature = "cuda")]

use rtx_backends::cuda::{Arg, CudaDevice, CudaKernel, CudaView, GemmShape, GpuError};

fn device(test: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("RTX_REQUIRE_CUDA").as_deref() != Ok("1") => {
            eprintln!("skipped: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_CUDA=1 but {e}"),
    }
}

/// The GPU when there is one (else a printed skip), and the CPU standing in for one
/// (`CudaDevice::on_cpu`: the same kernels built by `c++`, the CPU's GEMM for cuBLAS's), so
/// what does not need the driver is checked on every machine with a C++ compiler
/// (`RTX_REQUIRE_CXX=1` makes a missing one a failure).
fn devices(test: &str) -> Vec<CudaDevice> {
    let mut found: Vec<CudaDevice> = device(test).into_iter().collect();
    #[cfg(feature = "hip")]
    match CudaDevice::open_hip(0) {
        Ok(d) => found.push(d),
        Err(e) if std::env::var("RTX_REQUIRE_HIP").as_deref() != Ok("1") => {
            eprintln!("skipped on HIP: {test}: {e}");
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_HIP=1 but {e}"),
    }
    match CudaDevice::on_cpu() {
        Ok(d) => found.push(d),
        Err(e) if std::env::var("RTX_REQUIRE_CXX").as_deref() != Ok("1") => {
            eprintln!("skipped on the CPU: {test}: {e}");
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_CXX=1 but {e}"),
    }
    found
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

/// `C[m, n] = A @ B` in f64, reading A as `[k, m]` when `at` and B as `[n, k]` when `bt`.
fn reference(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, at: bool, bt: bool) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|p| {
                    let x = if at { a[p * m + i] } else { a[i * k + p] };
                    let y = if bt { b[j * k + p] } else { b[p * n + j] };
                    x as f64 * y as f64
                })
                .sum();
        }
    }
    c
}

fn assert_close(got: &[f32], want: &[f64], k: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (e, (&g, &w)) in got.iter().zip(want).enumerate() {
        // f32 products and sums of k terms of magnitude up to 4.
        let tol = 1e-5 * (k as f64).sqrt() * 4.0 + 1e-5 * w.abs();
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}: element {e}: {g} vs {w}"
        );
    }
}

const AXPY: &str = r#"
extern "C" __global__ void axpy(RTX_META, const float* x, float* y) {
    const unsigned int* params = RTX_META_WORDS;
    const unsigned int i = (blockIdx.y * gridDim.x + blockIdx.x) * 256u + threadIdx.x;
    if (i >= params[0]) return;
    y[i] = 2.0f * x[i] + y[i];
}
"#;

/// Opening an AMD GPU either gives one compiling for its `gfx` architecture, or says what is
/// missing: the HIP runtime library, or a GPU.
#[cfg(feature = "hip")]
#[test]
fn a_hip_device_compiles_for_its_gfx_architecture_or_says_what_is_missing() {
    match CudaDevice::open_hip(0) {
        Ok(d) => {
            assert!(
                d.is_hip() && d.arch().starts_with("gfx"),
                "{}",
                d.describe()
            );
        }
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("no AMD GPU") || text.contains("libamdhip64"),
                "{text}"
            );
            assert!(
                std::env::var("RTX_REQUIRE_HIP").as_deref() != Ok("1"),
                "{text}"
            );
            eprintln!(
                "skipped on HIP: a_hip_device_compiles_for_its_gfx_architecture_or_says_what_is_missing: {text}"
            );
        }
    }
}

#[test]
fn a_buffer_reads_back_the_values_uploaded() {
    for d in devices("a_buffer_reads_back_the_values_uploaded") {
        let data = random(1000, 1);
        let b = d.upload_f32(&data).unwrap();
        assert_eq!(d.read_f32(&b).unwrap(), data);
        let z = d.zeros(77).unwrap();
        assert_eq!(d.read_f32(&z).unwrap(), vec![0.0; 77]);
        eprintln!("{}", d.describe());
    }
}

#[test]
fn a_kernel_runs_over_its_meta_inputs_and_outputs() {
    for d in devices("a_kernel_runs_over_its_meta_inputs_and_outputs") {
        let (x, y) = (random(777, 2), random(777, 3));
        let bx = d.upload_f32(&x).unwrap();
        let by = d.upload_f32(&y).unwrap();
        let k = CudaKernel {
            name: "axpy",
            source: AXPY,
            entry: "axpy",
        };
        d.run_emitted(&k, &[777], &[&bx], &[&by], 777, 256).unwrap();
        let got = d.read_f32(&by).unwrap();
        for i in 0..777 {
            assert_eq!(got[i], 2.0 * x[i] + y[i], "element {i}");
        }
    }
}

/// Copies its meta words after the count (`params[0]`) into `out`.
const META_ECHO: &str = r#"
extern "C" __global__ void meta_echo(RTX_META, float* out) {
    const unsigned int* params = RTX_META_WORDS;
    const unsigned int i = (blockIdx.y * gridDim.x + blockIdx.x) * 64u + threadIdx.x;
    if (i >= params[0]) return;
    out[i] = (float)params[1u + i];
}
"#;

#[test]
fn meta_words_reach_the_kernel_whether_they_fit_the_launch_parameters_or_spill() {
    let test = "meta_words_reach_the_kernel_whether_they_fit_the_launch_parameters_or_spill";
    let k = CudaKernel {
        name: "meta_echo",
        source: META_ECHO,
        entry: "meta_echo",
    };
    for d in devices(test) {
        // One word short of the inline limit, exactly at it, and past it (a buffer).
        let limit = rtx_backends::cuda::META_INLINE_WORDS;
        for words in [limit - 2, limit - 1, limit + 300] {
            let meta: Vec<u32> = std::iter::once(words as u32 - 1)
                .chain((1..words as u32).map(|w| w * 7 + 3))
                .collect();
            let out = d.zeros(words - 1).unwrap();
            d.run_kernel(&k, &meta, &[Arg::Out(&out)], words - 1, 64)
                .unwrap();
            let got = d.read_f32(&out).unwrap();
            let want: Vec<f32> = meta[1..].iter().map(|&w| w as f32).collect();
            assert_eq!(got, want, "{words} meta words on {}", d.describe());
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_naming_it() {
    for d in devices("a_kernel_that_does_not_compile_is_an_error_naming_it") {
        let k = CudaKernel {
            name: "broken",
            source: "extern \"C\" __global__ void broken( {",
            entry: "broken",
        };
        match d.load(&k) {
            Err(GpuError::Compile { name, .. }) => assert_eq!(name, "broken"),
            other => panic!("expected a compile error, got {:?}", other.err()),
        }
    }
}

#[test]
fn sgemm_matches_the_f64_reference_plain_transposed_and_batched() {
    for d in devices("sgemm_matches_the_f64_reference_plain_transposed_and_batched") {
        let (m, n, k) = (67, 45, 129);
        for (at, bt) in [(false, false), (true, false), (false, true), (true, true)] {
            let (a, b) = (random(m * k, 4), random(k * n, 5));
            let (ba, bb) = (d.upload_f32(&a).unwrap(), d.upload_f32(&b).unwrap());
            let c = d.zeros(m * n).unwrap();
            let shape = GemmShape {
                a_transposed: at,
                b_transposed: bt,
                ..GemmShape::plain(m, n, k)
            };
            d.gemm_f32(shape, &ba, &bb, &c).unwrap();
            let want = reference(&a, &b, m, n, k, at, bt);
            assert_close(
                &d.read_f32(&c).unwrap(),
                &want,
                k,
                &format!("at={at} bt={bt}"),
            );
        }
        // Three products sharing one B (a weight): stride 0.
        let batches = 3;
        let (a, b) = (random(batches * m * k, 6), random(k * n, 7));
        let (ba, bb) = (d.upload_f32(&a).unwrap(), d.upload_f32(&b).unwrap());
        let c = d.zeros(batches * m * n).unwrap();
        let shape = GemmShape {
            batches,
            stride_b: 0,
            ..GemmShape::plain(m, n, k)
        };
        d.gemm_f32(shape, &ba, &bb, &c).unwrap();
        let got = d.read_f32(&c).unwrap();
        for batch in 0..batches {
            let want = reference(&a[batch * m * k..][..m * k], &b, m, n, k, false, false);
            assert_close(
                &got[batch * m * n..][..m * n],
                &want,
                k,
                &format!("batch {batch}"),
            );
        }
    }
}

#[test]
fn the_tiled_gemm_matches_the_f64_reference_on_every_layout_past_its_tile_edges() {
    for d in devices("the_tiled_gemm_matches_the_f64_reference_on_every_layout_past_its_tile_edges")
    {
        // Two 64-row and two 64-column tiles, both ragged, and a K that is not a multiple of
        // the kernel's 16-wide slices.
        let (m, n, k) = (70, 67, 37);
        for (at, bt) in [(false, false), (true, false), (false, true), (true, true)] {
            // A's stored rows 3 values longer than they need, after 5 values of something else.
            let (a_rows, a_cols) = if at { (k, m) } else { (m, k) };
            let (lda, offset) = (a_cols + 3, 5);
            let a_store = random(offset + a_rows * lda, 31);
            let a: Vec<f32> = (0..a_rows * a_cols)
                .map(|e| a_store[offset + e / a_cols * lda + e % a_cols])
                .collect();
            let b = random(k * n, 32);
            let (ba, bb) = (d.upload_f32(&a_store).unwrap(), d.upload_f32(&b).unwrap());
            let c = d.zeros(m * n).unwrap();
            let shape = GemmShape {
                a_transposed: at,
                b_transposed: bt,
                a_row_stride: Some(lda),
                a_offset: offset,
                ..GemmShape::plain(m, n, k)
            };
            d.gemm_f32_tiled(shape, &ba, &bb, &c).unwrap();
            let want = reference(&a, &b, m, n, k, at, bt);
            let what = format!("{}: at={at} bt={bt}", d.describe());
            assert_close(&d.read_f32(&c).unwrap(), &want, k, &what);
        }
        // Three products sharing one B (batch stride 0), as a Linear over a batch runs.
        let batches = 3;
        let (a, b) = (random(batches * m * k, 33), random(k * n, 34));
        let (ba, bb) = (d.upload_f32(&a).unwrap(), d.upload_f32(&b).unwrap());
        let c = d.zeros(batches * m * n).unwrap();
        let shape = GemmShape {
            batches,
            stride_b: 0,
            ..GemmShape::plain(m, n, k)
        };
        d.gemm_f32_tiled(shape, &ba, &bb, &c).unwrap();
        let got = d.read_f32(&c).unwrap();
        for batch in 0..batches {
            let want = reference(&a[batch * m * k..][..m * k], &b, m, n, k, false, false);
            let what = format!("{}: batch {batch}", d.describe());
            assert_close(&got[batch * m * n..][..m * n], &want, k, &what);
        }
    }
}

#[test]
fn matmul_reads_strided_views_in_place_or_copied_to_the_f64_reference() {
    for d in devices("matmul_reads_strided_views_in_place_or_copied_to_the_f64_reference") {
        let (batches, m, n, k) = (3, 17, 23, 29);
        // A: [batches, m, k] read transposed from a [batches, k, m] buffer at offset 4.
        let a_store = random(4 + batches * k * m, 21);
        // B: [k, n] shared by every batch (batch stride 0), its columns every second element,
        // so neither stride is 1 and it is copied first.
        let b_store = random(k * n * 2, 22);
        let (ba, bb) = (
            d.upload_f32(&a_store).unwrap(),
            d.upload_f32(&b_store).unwrap(),
        );
        let a = CudaView {
            buffer: &ba,
            offset: 4,
            shape: vec![batches, m, k],
            strides: vec![k * m, 1, m],
        };
        let b = CudaView {
            buffer: &bb,
            offset: 0,
            shape: vec![batches, k, n],
            strides: vec![0, 2 * n, 2],
        };
        let c = d.zeros(batches * m * n).unwrap();
        d.matmul(&a, &b, &c).unwrap();
        let got = d.read_f32(&c).unwrap();
        for bi in 0..batches {
            let mut want = vec![0.0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] = (0..k)
                        .map(|t| {
                            a_store[4 + bi * k * m + t * m + i] as f64
                                * b_store[t * 2 * n + 2 * j] as f64
                        })
                        .sum();
                }
            }
            let at = bi * m * n;
            assert_close(&got[at..at + m * n], &want, k, &format!("batch {bi}"));
        }
    }
}

#[test]
fn bf16_gemm_accumulates_in_f32_to_the_reference_of_its_rounded_operands() {
    let Some(d) = device("bf16_gemm_accumulates_in_f32_to_the_reference_of_its_rounded_operands")
    else {
        return;
    };
    let (m, n, k) = (96, 80, 256);
    let to_bf16 = |v: &[f32]| -> Vec<u16> {
        v.iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect()
    };
    let (a, b) = (random(m * k, 8), random(k * n, 9));
    let (ah, bh) = (to_bf16(&a), to_bf16(&b));
    let widen = |v: &[u16]| -> Vec<f32> {
        v.iter()
            .map(|&h| half::bf16::from_bits(h).to_f32())
            .collect()
    };
    let want = reference(&widen(&ah), &widen(&bh), m, n, k, false, false);
    let (ba, bb) = (d.upload_bf16(&ah).unwrap(), d.upload_bf16(&bh).unwrap());
    let c = d.zeros((m * n).div_ceil(2)).unwrap();
    d.gemm_bf16(GemmShape::plain(m, n, k), &ba, &bb, &c)
        .unwrap();
    let got = widen(&d.read_bf16(&c, m * n).unwrap());
    for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
        // The result is rounded to bf16 (8 bits of mantissa): half an ulp is 2^-8 relative.
        let tol = w.abs() * (1.0 / 128.0) + 1e-3 * (k as f64).sqrt();
        assert!((g as f64 - w).abs() <= tol, "element {e}: {g} vs {w}");
    }
}

#[test]
fn a_product_past_its_buffers_is_refused_before_cublas_reads_them() {
    for d in devices("a_product_past_its_buffers_is_refused_before_cublas_reads_them") {
        let (a, b) = (
            d.upload_f32(&random(10, 1)).unwrap(),
            d.upload_f32(&random(10, 2)).unwrap(),
        );
        let c = d.zeros(4).unwrap();
        assert!(matches!(
            d.gemm_f32(GemmShape::plain(2, 2, 8), &a, &b, &c),
            Err(GpuError::Call(_))
        ));
    }
}

#[test]
fn an_allocation_past_the_devices_memory_is_out_of_memory_not_a_panic() {
    let Some(d) = device("an_allocation_past_the_devices_memory_is_out_of_memory_not_a_panic")
    else {
        return;
    };
    // 4 TiB of f32.
    match d.zeros(1 << 40) {
        Err(GpuError::OutOfMemory { requested }) => assert_eq!(requested, 4 << 40),
        other => panic!("expected OutOfMemory, got {:?}", other.err()),
    }
    // The device still works afterwards.
    let b = d.upload_f32(&[1.0f32, 2.0]).unwrap();
    assert_eq!(d.read_f32(&b).unwrap(), vec![1.0, 2.0]);
}

#[test]
fn the_core_op_kernels_run_on_the_device_through_their_meta_words() {
    use rtx_backends::kernel_meta::Reduce;
    for d in devices("the_core_op_kernels_run_on_the_device_through_their_meta_words") {
        // A [3, 4, 5] view of a [5, 4, 3] buffer from element 7, summed over the middle axis.
        let x = random(7 + 60, 10);
        let bx = d.upload_f32(&x).unwrap();
        let view = CudaView {
            buffer: &bx,
            offset: 7,
            shape: vec![3, 4, 5],
            strides: vec![1, 3, 12],
        };
        let sums = d.zeros(15).unwrap();
        d.reduce(&view, &[false, true, false], Reduce::Sum, &sums)
            .unwrap();
        let got = d.read_f32(&sums).unwrap();
        for i in 0..3 {
            for k in 0..5 {
                let want: f32 = (0..4).map(|j| x[7 + i + 3 * j + 12 * k]).sum();
                assert!((got[i * 5 + k] - want).abs() < 1e-5, "({i}, {k})");
            }
        }
        // The same view copied contiguous.
        let copy = d.zeros(60).unwrap();
        d.copy_into(&view, &copy, 0, &[20, 5, 1]).unwrap();
        let got = d.read_f32(&copy).unwrap();
        for (e, &value) in got.iter().enumerate() {
            let (i, j, k) = (e / 20, e / 5 % 4, e % 5);
            assert_eq!(value, x[7 + i + 3 * j + 12 * k], "element {e}");
        }
    }
}

/// The same kernel text on the CPU (`on_cpu`), for comparing the device's results with.
fn on_cpu(test: &str) -> Option<rtx_backends::cuda::on_cpu::CudaOnCpu> {
    match rtx_backends::cuda::on_cpu::CudaOnCpu::open() {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("skipped: {test}: {e}");
            None
        }
    }
}

fn close(device: &[f32], cpu: &[f32], what: &str) {
    for (e, (&a, &b)) in device.iter().zip(cpu).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-4 * (1.0 + b.abs());
        assert!(same, "{what}[{e}]: device {a}, cpu {b}");
    }
}

#[test]
fn attention_convolution_pooling_and_top_k_on_the_device_match_the_same_text_on_the_cpu() {
    use rtx_backends::cuda::attention::{ATTENTION_BLOCK, ATTENTION_SOURCE};
    use rtx_backends::cuda::kernels::{BLOCK, SOURCE};
    use rtx_backends::cuda::window::{WINDOW_BLOCK, WINDOW_SOURCE};
    use rtx_backends::kernel_meta::{self, AttentionShape, ConvPass, ConvShape, PoolPass};
    use std::ffi::c_void;
    let test =
        "attention_convolution_pooling_and_top_k_on_the_device_match_the_same_text_on_the_cpu";
    let Some(d) = device(test) else { return };
    let Some(cpu) = on_cpu(test) else { return };
    let p = |v: &[f32]| v.as_ptr() as *mut c_void;
    let run_cpu = |source: &str,
                   entry: &str,
                   meta: &[u32],
                   params: &[*mut c_void],
                   threads: usize,
                   block: u32| {
        let blocks = threads.div_ceil(block as usize) as u32;
        // SAFETY: each call passes the kernel's parameters in order, sized as its meta says.
        unsafe {
            cpu.launch(
                entry,
                source,
                entry,
                meta,
                params,
                [blocks, 1, 1],
                [block, 1, 1],
            )
        }
        .unwrap();
    };

    // Causal attention, [S, T, D] = [6, 33, 32], forward and gradients.
    let shape = AttentionShape {
        slices: 6,
        queries: 33,
        keys: 33,
        head: 32,
        value_head: 32,
        causal: true,
    };
    let n = 6 * 33 * 32;
    let (q, k, v, g) = (random(n, 11), random(n, 12), random(n, 13), random(n, 14));
    let b = |x: &[f32]| d.upload_f32(x).unwrap();
    let (bq, bk, bv, bg) = (b(&q), b(&k), b(&v), b(&g));
    let out = d.zeros(n).unwrap();
    d.attention(shape, [&bq, &bk, &bv], &out).unwrap();
    let grads = d.zeros(3 * n).unwrap();
    d.attention_grad(shape, [&bq, &bk, &bv, &bg], &grads)
        .unwrap();
    let meta = shape.meta().unwrap();
    let (mut o, mut stats, mut gr) = (vec![0f32; n], vec![0f32; 6 * 33 * 3], vec![0f32; 3 * n]);
    run_cpu(
        ATTENTION_SOURCE,
        "rtx_attention",
        &meta,
        &[p(&q), p(&k), p(&v), o.as_mut_ptr().cast()],
        198,
        ATTENTION_BLOCK,
    );
    run_cpu(
        ATTENTION_SOURCE,
        "rtx_attention_grad_q",
        &meta,
        &[
            p(&q),
            p(&k),
            p(&v),
            p(&g),
            stats.as_mut_ptr().cast(),
            gr.as_mut_ptr().cast(),
        ],
        198,
        ATTENTION_BLOCK,
    );
    run_cpu(
        ATTENTION_SOURCE,
        "rtx_attention_grad_kv",
        &meta,
        &[
            p(&q),
            p(&k),
            p(&v),
            p(&g),
            p(&stats),
            gr.as_mut_ptr().cast(),
        ],
        198,
        ATTENTION_BLOCK,
    );
    close(&d.read_f32(&out).unwrap(), &o, "attention");
    close(&d.read_f32(&grads).unwrap(), &gr, "attention gradients");

    // A strided, padded convolution and a max pool.
    let cs = ConvShape {
        x: [2, 3, 9, 8],
        w: [5, 3, 3, 3],
        y: [2, 5, 5, 8],
        stride: [2, 1],
        padding: [1, 1],
    };
    let (x, w) = (random(2 * 3 * 9 * 8, 15), random(5 * 3 * 3 * 3, 16));
    let (bx, bw) = (b(&x), b(&w));
    let y = d.zeros(2 * 5 * 5 * 8).unwrap();
    d.conv2d(ConvPass::Forward, cs, &bx, &bw, &y).unwrap();
    let (meta, outputs) = kernel_meta::conv2d(ConvPass::Forward, cs).unwrap();
    let mut yc = vec![0f32; outputs];
    run_cpu(
        WINDOW_SOURCE,
        "rtx_conv2d",
        &meta,
        &[p(&x), p(&w), yc.as_mut_ptr().cast()],
        outputs,
        WINDOW_BLOCK,
    );
    close(&d.read_f32(&y).unwrap(), &yc, "conv2d");
    let window = ([3, 3], [2, 2], [1, 1]);
    let pooled = d.zeros(2 * 3 * 5 * 4).unwrap();
    d.pool2d(
        PoolPass::Max,
        [2, 3, 9, 8],
        window,
        [5, 4],
        &bx,
        &bx,
        &pooled,
    )
    .unwrap();
    let (meta, outputs) = kernel_meta::pool2d(PoolPass::Max, [2, 3, 9, 8], window, [5, 4]).unwrap();
    let mut pc = vec![0f32; outputs];
    run_cpu(
        WINDOW_SOURCE,
        "rtx_pool2d",
        &meta,
        &[p(&x), p(&x), pc.as_mut_ptr().cast()],
        outputs,
        WINDOW_BLOCK,
    );
    close(&d.read_f32(&pooled).unwrap(), &pc, "max pool");

    // Top-5 of rows of 40.
    let (rows, cols, top) = (24usize, 40usize, 5usize);
    let t = random(rows * cols, 17);
    let bt = b(&t);
    let (values, positions) = (d.zeros(rows * top).unwrap(), d.zeros(rows * top).unwrap());
    d.top_k(&bt, (rows, cols, top), &values, &positions)
        .unwrap();
    let meta = kernel_meta::words(&[0, rows, cols, top], "size").unwrap();
    let (mut vc, mut pcs) = (vec![0f32; rows * top], vec![0u32; rows * top]);
    run_cpu(
        SOURCE,
        "rtx_top_k",
        &meta,
        &[
            p(&t),
            p(&t),
            vc.as_mut_ptr().cast(),
            pcs.as_mut_ptr().cast(),
        ],
        rows,
        BLOCK,
    );
    close(&d.read_f32(&values).unwrap(), &vc, "top-k values");
    assert_eq!(d.read_u32(&positions).unwrap(), pcs, "top-k positions");
}
