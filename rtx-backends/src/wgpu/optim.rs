//! The optimizer step of the wgpu backend: one kernel per parameter, in place, to the CPU's
//! formulas (`rtx_core::optim`).

use super::{GpuBuffer, WgpuDevice, grid};
use crate::gpu_error::Result;
use crate::kernel_meta;
pub use crate::kernel_meta::UpdateRule;

/// One optimizer step over a parameter, in place, to the CPU's formulas (`rtx_core::optim`).
/// Meta: `kernel_meta::optimizer`.
const OPTIM: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> p: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> s1: array<f32>;
@group(0) @binding(4) var<storage, read_write> s2: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    if (i >= prm[0]) { return; }
    let rule = prm[1];
    let lr = bitcast<f32>(prm[2]); let h1 = bitcast<f32>(prm[3]); let h2 = bitcast<f32>(prm[4]);
    let eps = bitcast<f32>(prm[5]); let wd = bitcast<f32>(prm[6]); let flag = prm[7] != 0u;
    let c1 = bitcast<f32>(prm[8]); let c2 = bitcast<f32>(prm[9]);
    var x = p[i];
    let gi0 = g[i];
    if (rule == 0u) {
        var gi = gi0;
        if (flag) { x = x * (1.0 - lr * wd); } else { gi = gi + wd * x; }
        let m = h1 * s1[i] + (1.0 - h1) * gi;
        let v = h2 * s2[i] + (1.0 - h2) * gi * gi;
        s1[i] = m;
        s2[i] = v;
        let denom = sqrt(v / c2) + eps;
        x = x - lr * (m / c1) / denom;
    } else if (rule == 1u) {
        let d = gi0 + wd * x;
        var b = h1 * s1[i] + (1.0 - h2) * d;
        if (c1 == 1.0) { b = d; }
        s1[i] = b;
        var step = b;
        if (flag) { step = d + h1 * b; }
        x = x - lr * step;
    } else {
        x = x - lr * (gi0 + wd * x);
    }
    p[i] = x;
}
"#;

impl WgpuDevice {
    /// Updates `param` (`n` values) in place from `grad` and the state buffers `first` and
    /// `second` (each `n` values, or one word where the rule keeps none).
    pub fn optimizer_step(
        &self,
        rule: UpdateRule,
        n: usize,
        param: &GpuBuffer,
        grad: &GpuBuffer,
        first: &GpuBuffer,
        second: &GpuBuffer,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let meta = kernel_meta::optimizer(rule, n)?;
        let groups = grid(n, 256, self.limits.max_compute_workgroups_per_dimension)?;
        self.run(
            "rtx_optimizer_step",
            OPTIM,
            &meta,
            &[param, grad, first, second],
            groups,
        )
    }
}
