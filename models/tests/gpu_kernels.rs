//! Every fused kernel of every model, emitted for the GPU targets from the same plan as the
//! CPU code, must compile: WGSL is parsed and validated by naga and translated to Metal
//! Shading Language (the Metal path of the wgpu backend). CUDA and HIP sources are compiled
//! by NVRTC and hiprtc in `rtx-backends`' GPU tests where those libraries are installed.

use models::cnn::Cnn;
use models::gpt::Gpt;
use models::mlp::Mlp;
use rtx_core::ir::ModelIr;
use rtx_core::ir::emit::{KernelKind, KernelSource, Target, model_kernels};

fn models() -> Vec<ModelIr> {
    vec![
        Mlp::graph().unwrap(),
        Cnn::graph().unwrap(),
        Gpt::graph().unwrap(),
    ]
}

fn validate_wgsl(k: &KernelSource) -> Result<String, String> {
    let module = naga::front::wgsl::parse_str(&k.source)
        .map_err(|e| format!("{}: parse: {}", k.name, e.emit_to_string(&k.source)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| format!("{}: validate: {}", k.name, e.emit_to_string(&k.source)))?;
    let (msl, _) = naga::back::msl::write_string(
        &module,
        &info,
        &naga::back::msl::Options::default(),
        &naga::back::msl::PipelineOptions::default(),
    )
    .map_err(|e| format!("{}: msl: {e}", k.name))?;
    Ok(msl)
}

#[test]
fn every_fused_kernel_of_every_model_validates_as_wgsl_and_translates_to_metal() {
    let mut count = 0;
    let mut failures = Vec::new();
    for ir in models() {
        for k in model_kernels(&ir, Target::Wgsl) {
            count += 1;
            match validate_wgsl(&k) {
                Ok(msl) => assert!(msl.contains("kernel"), "{}: no kernel in MSL", k.name),
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(count > 20, "only {count} kernels emitted");
    assert!(
        failures.is_empty(),
        "{} of {count} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_model_emits_one_cuda_kernel_per_wgsl_kernel_with_the_same_buffers() {
    for ir in models() {
        let wgsl = model_kernels(&ir, Target::Wgsl);
        let cuda = model_kernels(&ir, Target::Cuda);
        assert_eq!(wgsl.len(), cuda.len(), "{}", ir.model);
        for (w, c) in wgsl.iter().zip(&cuda) {
            // A WGSL matmul epilogue is the GEMM itself: it reads A and B instead of the
            // product the CUDA epilogue reads after cuBLAS.
            let extra = usize::from(w.kind == KernelKind::GemmEpilogue);
            assert_eq!(
                (&w.name, w.inputs, w.outputs),
                (&c.name, c.inputs + extra, c.outputs)
            );
            assert!(
                c.source
                    .contains(&format!("extern \"C\" __global__ void {}(", c.entry))
            );
        }
    }
}
