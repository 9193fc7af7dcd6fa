//! Every fused kernel of every model, emitted as CUDA C and compiled as HIP (`HIP_PRELUDE` in
//! front) by hiprtc to a gfx90a code object (MI200), one module per model. Needs
//! `--features hip` and ROCm's libamdhip64 (Debian `libamdhip64-5`, `libhiprtc-builtins5`);
//! without it the test says it was skipped, by name (`RTX_REQUIRE_HIPRTC=1`, as in CI, makes
//! that a failure).
#![cfg(feature = "hip")]

use models::cnn::Cnn;
use models::gpt::Gpt;
use models::mlp::Mlp;
use rtx_backends::hip::{compile, hiprtc_available};
use rtx_core::ir::emit::{Target, cuda, model_kernels};

#[test]
fn every_kernel_of_every_model_compiles_as_hip_for_gfx90a() {
    let test = "every_kernel_of_every_model_compiles_as_hip_for_gfx90a";
    if !hiprtc_available() {
        assert!(
            std::env::var("RTX_REQUIRE_HIPRTC").as_deref() != Ok("1"),
            "{test}: RTX_REQUIRE_HIPRTC=1 but hiprtc cannot be loaded"
        );
        eprintln!("skipped: {test}: hiprtc (libamdhip64.so.5) not found");
        return;
    }
    for ir in [
        Mlp::graph().unwrap(),
        Cnn::graph().unwrap(),
        Gpt::graph().unwrap(),
    ] {
        let kernels = model_kernels(&ir, Target::Cuda);
        let mut module = format!("{}{}", cuda::HIP_PRELUDE, cuda::PRELUDE);
        for k in &kernels {
            module.push_str(
                k.source
                    .strip_prefix(cuda::PRELUDE)
                    .expect("kernels start with the prelude"),
            );
        }
        let compiled = compile(&ir.model, &module, "gfx90a", &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            &compiled.code[..4],
            b"\x7fELF",
            "{}: not an ELF code object",
            ir.model
        );
        for k in &kernels {
            let entry = k.entry.as_bytes();
            assert!(
                compiled.code.windows(entry.len()).any(|w| w == entry),
                "{}: no symbol {} in the code object",
                ir.model,
                k.entry
            );
        }
        eprintln!(
            "{}: {} kernels, {} bytes of gfx90a code",
            ir.model,
            kernels.len(),
            compiled.code.len()
        );
    }
}

/// The CUDA runtime's own core-op kernels (`rtx_backends::cuda::kernels`) as HIP too, so a
/// HIP runtime can take them as they are.
#[cfg(feature = "cuda")]
#[test]
fn the_core_op_kernels_compile_as_hip_for_gfx90a() {
    let test = "the_core_op_kernels_compile_as_hip_for_gfx90a";
    if !hiprtc_available() {
        assert!(
            std::env::var("RTX_REQUIRE_HIPRTC").as_deref() != Ok("1"),
            "{test}: RTX_REQUIRE_HIPRTC=1 but hiprtc cannot be loaded"
        );
        eprintln!("skipped: {test}: hiprtc (libamdhip64.so.5) not found");
        return;
    }
    let source = format!(
        "{}{}",
        cuda::HIP_PRELUDE,
        rtx_backends::cuda::kernels::SOURCE
    );
    let compiled = compile("core_ops", &source, "gfx90a", &[]).unwrap_or_else(|e| panic!("{e}"));
    for entry in [
        "rtx_reduce",
        "rtx_pick",
        "rtx_scatter_rows",
        "rtx_copy_into",
    ] {
        let entry = entry.as_bytes();
        assert!(compiled.code.windows(entry.len()).any(|w| w == entry));
    }
    // The GEMM a HIP device runs in place of cuBLAS.
    let tiled = rtx_backends::cuda::gemm_tiled::GEMM_TILED;
    let source = format!("{}{}", cuda::HIP_PRELUDE, tiled.source);
    let compiled = compile(tiled.name, &source, "gfx90a", &[]).unwrap_or_else(|e| panic!("{e}"));
    let entry = tiled.entry.as_bytes();
    assert!(compiled.code.windows(entry.len()).any(|w| w == entry));
}
