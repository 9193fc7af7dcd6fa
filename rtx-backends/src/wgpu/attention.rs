//! Attention on the wgpu backend: the forward pass and both halves of the backward pass,
//! one thread per query (or key) row, an online softmax, never a `Tq x Tk` matrix.

use super::{GpuBuffer, WgpuDevice, grid};
use crate::gpu_error::{GpuError, Result};
pub use crate::kernel_meta::{ATTENTION_MAX_HEAD, AttentionShape};

/// Attention over contiguous `q [S, Tq, D]`, `k [S, Tk, D]`, `v [S, Tk, Dv]`, one thread per
/// query row: an online softmax over the keys, no `Tq x Tk` matrix. Meta: `[S, Tq, Tk, D,
/// causal, scale bits, Dv]` (the gradient kernels take `Dv == D`).
const ATTENTION: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = gid.x + gid.y * groups.x * 64u;
    let tq = prm[1]; let tk = prm[2]; let d = prm[3]; let dv = prm[6];
    if (r >= prm[0] * tq) { return; }
    let s = r / tq; let i = r % tq;
    let scale = bitcast<f32>(prm[5]);
    var last = tk;
    if (prm[4] != 0u) { last = min(tk, i + 1u); }
    var acc: array<f32, 128>;
    for (var c = 0u; c < dv; c = c + 1u) { acc[c] = 0.0; }
    var m = bitcast<f32>(0xff800000u);
    var l = 0.0;
    let qo = r * d;
    for (var j = 0u; j < last; j = j + 1u) {
        let ko = (s * tk + j) * d;
        var dot = 0.0;
        for (var c = 0u; c < d; c = c + 1u) { dot = fma(q[qo + c], k[ko + c], dot); }
        let score = dot * scale;
        let m2 = max(m, score);
        let corr = exp(m - m2);
        let p = exp(score - m2);
        l = l * corr + p;
        let vo = (s * tk + j) * dv;
        for (var c = 0u; c < dv; c = c + 1u) { acc[c] = acc[c] * corr + p * v[vo + c]; }
        m = m2;
    }
    for (var c = 0u; c < dv; c = c + 1u) { out[r * dv + c] = acc[c] / l; }
}
"#;

/// The backward pass's per-query half: for each query row, its softmax maximum and sum and
/// `D_i = sum_j p_ij (g_i . v_j)` into `stats [S * Tq, 3]`, and `dq` into the first third of
/// `out [3, S, Tq, D]`. Same meta as [`ATTENTION`].
const ATTENTION_GRAD_Q: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = gid.x + gid.y * groups.x * 64u;
    let tq = prm[1]; let tk = prm[2]; let d = prm[3];
    if (r >= prm[0] * tq) { return; }
    let s = r / tq; let i = r % tq;
    let scale = bitcast<f32>(prm[5]);
    var last = tk;
    if (prm[4] != 0u) { last = min(tk, i + 1u); }
    let qo = r * d;
    var m = bitcast<f32>(0xff800000u);
    var l = 0.0;
    for (var j = 0u; j < last; j = j + 1u) {
        let ko = (s * tk + j) * d;
        var dot = 0.0;
        for (var c = 0u; c < d; c = c + 1u) { dot = fma(q[qo + c], k[ko + c], dot); }
        let score = dot * scale;
        let m2 = max(m, score);
        l = l * exp(m - m2) + exp(score - m2);
        m = m2;
    }
    var dsum = 0.0;
    for (var j = 0u; j < last; j = j + 1u) {
        let ko = (s * tk + j) * d;
        var dot = 0.0;
        var gv = 0.0;
        for (var c = 0u; c < d; c = c + 1u) {
            dot = fma(q[qo + c], k[ko + c], dot);
            gv = fma(g[qo + c], v[ko + c], gv);
        }
        dsum = dsum + exp(dot * scale - m) / l * gv;
    }
    var dq: array<f32, 128>;
    for (var c = 0u; c < d; c = c + 1u) { dq[c] = 0.0; }
    for (var j = 0u; j < last; j = j + 1u) {
        let ko = (s * tk + j) * d;
        var dot = 0.0;
        var gv = 0.0;
        for (var c = 0u; c < d; c = c + 1u) {
            dot = fma(q[qo + c], k[ko + c], dot);
            gv = fma(g[qo + c], v[ko + c], gv);
        }
        let ds = exp(dot * scale - m) / l * (gv - dsum) * scale;
        for (var c = 0u; c < d; c = c + 1u) { dq[c] = fma(ds, k[ko + c], dq[c]); }
    }
    for (var c = 0u; c < d; c = c + 1u) { out[qo + c] = dq[c]; }
    stats[r * 3u] = m;
    stats[r * 3u + 1u] = l;
    stats[r * 3u + 2u] = dsum;
}
"#;

/// The per-key half: `dk` and `dv` of each key row from the query rows that see it, into
/// the second and third thirds of `out`, reading the statistics of [`ATTENTION_GRAD_Q`].
const ATTENTION_GRAD_KV: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = gid.x + gid.y * groups.x * 64u;
    let tq = prm[1]; let tk = prm[2]; let d = prm[3];
    if (r >= prm[0] * tk) { return; }
    let s = r / tk; let j = r % tk;
    let scale = bitcast<f32>(prm[5]);
    var first = 0u;
    if (prm[4] != 0u) { first = j; }
    let ko = r * d;
    var dk: array<f32, 128>;
    var dv: array<f32, 128>;
    for (var c = 0u; c < d; c = c + 1u) { dk[c] = 0.0; dv[c] = 0.0; }
    for (var i = first; i < tq; i = i + 1u) {
        let row = s * tq + i;
        let qo = row * d;
        var dot = 0.0;
        var gv = 0.0;
        for (var c = 0u; c < d; c = c + 1u) {
            dot = fma(q[qo + c], k[ko + c], dot);
            gv = fma(g[qo + c], v[ko + c], gv);
        }
        let p = exp(dot * scale - stats[row * 3u]) / stats[row * 3u + 1u];
        let ds = p * (gv - stats[row * 3u + 2u]) * scale;
        for (var c = 0u; c < d; c = c + 1u) {
            dv[c] = fma(p, g[qo + c], dv[c]);
            dk[c] = fma(ds, q[qo + c], dk[c]);
        }
    }
    let third = prm[0] * tk * d;
    for (var c = 0u; c < d; c = c + 1u) {
        out[third + ko + c] = dk[c];
        out[2u * third + ko + c] = dv[c];
    }
}
"#;

impl WgpuDevice {
    /// `softmax(q k^T / sqrt(D)) v` over contiguous `q`, `k`, `v` into `out` (q's shape).
    pub fn attention(
        &self,
        shape: AttentionShape,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<()> {
        let meta = shape.meta()?;
        let rows = shape.slices * shape.queries;
        if rows == 0 {
            return Ok(());
        }
        let groups = grid(rows, 64, self.limits.max_compute_workgroups_per_dimension)?;
        self.run("rtx_attention", ATTENTION, &meta, &[q, k, v, out], groups)
    }

    /// The gradients of [`WgpuDevice::attention`] for `q`, `k` and `v` (one shape), stacked
    /// in `out [3, ..]`, from the output gradient `g`.
    pub fn attention_grad(
        &self,
        shape: AttentionShape,
        [q, k, v, g]: [&GpuBuffer; 4],
        out: &GpuBuffer,
    ) -> Result<()> {
        let meta = shape.meta()?;
        let rows = shape.slices * shape.queries;
        if rows == 0 {
            return Ok(());
        }
        if shape.queries != shape.keys || shape.value_head != shape.head {
            return Err(GpuError::Call(format!(
                "device attention gradients take q, k and v of one shape, found {shape:?}"
            )));
        }
        let stats = self.zeros(rows * 3)?;
        let groups = grid(rows, 64, self.limits.max_compute_workgroups_per_dimension)?;
        self.run(
            "rtx_attention_grad_q",
            ATTENTION_GRAD_Q,
            &meta,
            &[q, k, v, g, &stats, out],
            groups,
        )?;
        self.run(
            "rtx_attention_grad_kv",
            ATTENTION_GRAD_KV,
            &meta,
            &[q, k, v, g, &stats, out],
            groups,
        )
    }
}
