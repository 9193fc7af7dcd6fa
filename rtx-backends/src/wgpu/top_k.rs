//! Top-k along the last axis on the wgpu backend, and its gradient.

use super::kernels::words;
use super::{GpuBuffer, WgpuDevice, grid};
use crate::gpu_error::{GpuError, Result};

/// Top-k along the last axis of contiguous `[rows, n]` values, one thread per row: the `t`-th
/// pick is the first element, in the order "NaN first, then larger, then earlier", that comes
/// after pick `t - 1` in that order (O(k n) per row, no sort buffer). Mode 0 writes the values
/// to `out [rows, k]` and the positions to `idx [rows, k]`; mode 1 writes the gradient `out
/// [rows, n]`: zeros with `g [rows, k]` at the picked positions. Meta: `[mode, rows, n, k]`.
const TOP_K: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> idx: array<u32>;

// Whether element i (value a) comes before element j (value b).
fn before(a: f32, i: u32, b: f32, j: u32) -> bool {
    let an = a != a; let bn = b != b;
    if (an != bn) { return an; }
    if (!an && a != b) { return a > b; }
    return i < j;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = gid.x + gid.y * groups.x * 64u;
    let mode = prm[0]; let n = prm[2]; let k = prm[3];
    if (r >= prm[1]) { return; }
    let base = r * n;
    if (mode == 1u) {
        for (var j = 0u; j < n; j = j + 1u) { out[base + j] = 0.0; }
    }
    var prev = 0u;
    var prev_v = 0.0;
    for (var t = 0u; t < k; t = t + 1u) {
        var best = n;
        var best_v = 0.0;
        for (var j = 0u; j < n; j = j + 1u) {
            let v = x[base + j];
            if (t > 0u && !before(prev_v, prev, v, j)) { continue; }
            if (best == n || before(v, j, best_v, best)) { best = j; best_v = v; }
        }
        prev = best;
        prev_v = best_v;
        if (mode == 0u) {
            out[r * k + t] = best_v;
            idx[r * k + t] = best;
        } else {
            out[base + best] = g[r * k + t];
        }
    }
}
"#;

impl WgpuDevice {
    /// The `k` largest of each contiguous row of `n` values (see [`TOP_K`]) into `values`
    /// and `positions` (`[rows, k]` each), `k <= n`.
    pub fn top_k(
        &self,
        x: &GpuBuffer,
        (rows, n, k): (usize, usize, usize),
        values: &GpuBuffer,
        positions: &GpuBuffer,
    ) -> Result<()> {
        self.top_k_pass(0, x, x, (rows, n, k), values, positions)
    }

    /// The gradient of [`WgpuDevice::top_k`]: `out [rows, n]` zeros with `g [rows, k]` at
    /// the positions top-k picks from `x`.
    pub fn top_k_grad(
        &self,
        x: &GpuBuffer,
        g: &GpuBuffer,
        (rows, n, k): (usize, usize, usize),
        out: &GpuBuffer,
    ) -> Result<()> {
        let unused = self.zeros(1)?;
        self.top_k_pass(1, x, g, (rows, n, k), out, &unused)
    }

    fn top_k_pass(
        &self,
        mode: usize,
        x: &GpuBuffer,
        g: &GpuBuffer,
        (rows, n, k): (usize, usize, usize),
        out: &GpuBuffer,
        idx: &GpuBuffer,
    ) -> Result<()> {
        if k > n {
            return Err(GpuError::Call(format!("top-{k} of rows of {n}")));
        }
        if rows * n == 0 {
            return Ok(());
        }
        let meta = words(&[mode, rows, n, k], "top-k size")?;
        let groups = grid(rows, 64, self.limits.max_compute_workgroups_per_dimension)?;
        self.run("rtx_top_k", TOP_K, &meta, &[x, g, out, idx], groups)
    }
}
