//! Every fused kernel of every model, emitted as CUDA C, compiles with NVRTC to PTX and to an
//! sm_90 cubin (the H200's architecture): as one module per model, the way the runtime loads
//! them, and each kernel's own source alone. Needs `--features cuda` and libnvrtc (the pip
//! wheel `nvidia-cuda-nvrtc-cu12` on `LD_LIBRARY_PATH`); without the library each test says it
//! was skipped, by name (`RTX_REQUIRE_NVRTC=1`, as in CI, makes that a failure).
#![cfg(feature = "cuda")]

use models::cnn::Cnn;
use models::gpt::Gpt;
use models::mlp::Mlp;
use rtx_backends::cuda::{compile, nvrtc_available, nvrtc_version};
use rtx_core::ir::ModelIr;
use rtx_core::ir::emit::{KernelSource, Target, cuda::PRELUDE, model_kernels};

fn nvrtc(test: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    assert!(
        std::env::var("RTX_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "{test}: RTX_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded"
    );
    eprintln!("skipped: {test}: libnvrtc not found");
    false
}

fn models() -> Vec<ModelIr> {
    vec![
        Mlp::graph().unwrap(),
        Cnn::graph().unwrap(),
        Gpt::graph().unwrap(),
    ]
}

/// The kernels as one translation unit, the prelude once.
fn one_module(kernels: &[KernelSource]) -> String {
    let mut module = String::from(PRELUDE);
    for k in kernels {
        module.push_str(
            k.source
                .strip_prefix(PRELUDE)
                .expect("kernels start with the prelude"),
        );
    }
    module
}

#[test]
fn every_cuda_kernel_of_every_model_compiles_to_an_sm_90_cubin_as_one_module() {
    let test = "every_cuda_kernel_of_every_model_compiles_to_an_sm_90_cubin_as_one_module";
    if !nvrtc(test) {
        return;
    }
    for ir in models() {
        let kernels = model_kernels(&ir, Target::Cuda);
        let module = one_module(&kernels);
        let compiled = compile(&ir.model, &module, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            compiled.cubin.len() > 1000,
            "{}: cubin of {} bytes",
            ir.model,
            compiled.cubin.len()
        );
        for k in &kernels {
            assert!(
                compiled.ptx.contains(&format!(".entry {}(", k.entry)),
                "{}: no entry {} in the PTX",
                ir.model,
                k.entry
            );
        }
        eprintln!(
            "{}: {} kernels, {} bytes of PTX, {} of sm_90 cubin (NVRTC {:?})",
            ir.model,
            kernels.len(),
            compiled.ptx.len(),
            compiled.cubin.len(),
            nvrtc_version().unwrap()
        );
    }
}

#[test]
fn a_kernels_own_source_compiles_alone() {
    let test = "a_kernels_own_source_compiles_alone";
    if !nvrtc(test) {
        return;
    }
    let ir = Gpt::graph().unwrap();
    let kernels = model_kernels(&ir, Target::Cuda);
    // The longest body: the backward pass's biggest fused group.
    let k = kernels.iter().max_by_key(|k| k.source.len()).unwrap();
    let compiled = compile(&k.name, &k.source, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(compiled.ptx.contains(&format!(".entry {}(", k.entry)));
    assert!(!compiled.cubin.is_empty());
}

#[test]
fn the_runtimes_core_op_kernels_compile_to_an_sm_90_cubin() {
    let test = "the_runtimes_core_op_kernels_compile_to_an_sm_90_cubin";
    if !nvrtc(test) {
        return;
    }
    let source = rtx_backends::cuda::kernels::SOURCE;
    let compiled = compile("core_ops", source, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    for entry in [
        "rtx_reduce",
        "rtx_pick",
        "rtx_pick_grad",
        "rtx_gather_rows",
        "rtx_scatter_rows",
        "rtx_copy_into",
        "rtx_scatter_first",
        "rtx_optimizer_step",
        "rtx_top_k",
    ] {
        assert!(
            compiled.ptx.contains(&format!(".entry {entry}(")),
            "no entry {entry}"
        );
    }
    assert!(!compiled.cubin.is_empty());
    let tiled = rtx_backends::cuda::gemm_tiled::GEMM_TILED;
    let compiled =
        compile(tiled.name, tiled.source, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(compiled.ptx.contains(&format!(".entry {}(", tiled.entry)));
    // Its tiles are staged in shared memory, and its accumulators stay in registers.
    assert!(compiled.ptx.contains(".shared"));
    let attention = rtx_backends::cuda::attention::ATTENTION_SOURCE;
    let compiled = compile("attention", attention, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    for entry in [
        "rtx_attention",
        "rtx_attention_grad_q",
        "rtx_attention_grad_kv",
    ] {
        assert!(
            compiled.ptx.contains(&format!(".entry {entry}(")),
            "no entry {entry}"
        );
    }
}

#[test]
fn kernels_read_their_meta_words_where_the_launch_put_them() {
    let test = "kernels_read_their_meta_words_where_the_launch_put_them";
    if !nvrtc(test) {
        return;
    }
    // The meta words are a by-value `__grid_constant__` parameter: indexing them must not
    // make every thread copy the 512-byte struct to local memory first (a `__local_depot`).
    let mut sources = vec![
        (
            "core_ops".to_string(),
            rtx_backends::cuda::kernels::SOURCE.to_string(),
        ),
        (
            "attention".to_string(),
            rtx_backends::cuda::attention::ATTENTION_SOURCE.to_string(),
        ),
        (
            "window".to_string(),
            rtx_backends::cuda::window::WINDOW_SOURCE.to_string(),
        ),
        (
            "gemm_tiled".to_string(),
            rtx_backends::cuda::gemm_tiled::GEMM_TILED
                .source
                .to_string(),
        ),
    ];
    for ir in models() {
        sources.push((
            ir.model.clone(),
            one_module(&model_kernels(&ir, Target::Cuda)),
        ));
    }
    for (name, source) in sources {
        let compiled = compile(&name, &source, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
        // Indexed in place: a generic address of the parameter itself.
        assert!(
            compiled.ptx.contains("cvta.param"),
            "{name}: no kernel addresses its meta words in the parameter space"
        );
        // Attention keeps a head-sized accumulator per thread in local memory; nothing
        // else has a local frame, so a copy of the meta struct would show as one.
        if name != "attention" {
            assert!(
                !compiled.ptx.contains("__local_depot"),
                "{name}: a kernel copies its parameters to local memory"
            );
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_nvrtcs_log() {
    let test = "a_kernel_that_does_not_compile_is_an_error_with_nvrtcs_log";
    if !nvrtc(test) {
        return;
    }
    let err = compile(
        "broken",
        "extern \"C\" __global__ void broken() { undefined_call(); }",
        "sm_90",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("broken") && err.contains("undefined_call"),
        "{err}"
    );
}

/// The MLP's module through the kernel cache in `RTX_KERNEL_CACHE`; prints how many modules
/// this process compiled. Run as a child process by the test below.
#[test]
#[ignore = "run as a child process by a_second_process_compiles_nothing"]
fn compile_the_mlp_through_the_kernel_cache() {
    let cache = rtx_backends::kernel_cache::KernelCache::default_location();
    let ir = Mlp::graph().unwrap();
    let mut module = String::from(PRELUDE);
    for k in model_kernels(&ir, Target::Cuda) {
        module.push_str(k.source.strip_prefix(PRELUDE).unwrap());
    }
    let k = rtx_backends::cuda::compile_cached(&cache, "mlp", &module, "sm_90", &[]).unwrap();
    assert!(k.cubin.len() > 1000 && k.ptx.contains(".entry"));
    println!("compiled={}", rtx_backends::kernel_cache::compiled());
}

#[test]
fn a_second_process_compiles_nothing() {
    let test = "a_second_process_compiles_nothing";
    if !nvrtc(test) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rtx-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = || {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "compile_the_mlp_through_the_kernel_cache",
                "--nocapture",
            ])
            .env("RTX_KERNEL_CACHE", &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "child failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    assert!(
        run().contains("compiled=1"),
        "the first process compiles the module"
    );
    assert!(
        run().contains("compiled=0"),
        "the second loads it from {}",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
