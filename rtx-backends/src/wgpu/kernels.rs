//! The wgpu backend's own kernels for the core ops that are not pointwise (those come from
//! `rtx_ir::emit`): a tiled shared-memory GEMM over strided, batched operands, reductions
//! over any set of axes, and the gather and scatter of `Pick` and its gradient.
//!
//! Each takes a `u32` meta buffer laid out as its Rust entry point writes it, so operands are
//! read through their offsets and strides (a transposed weight is never copied first) and
//! outputs are written contiguously.

use super::{GpuBuffer, Kernel, WgpuDevice, grid};
use crate::gpu_error::{GpuError, Result};

/// A strided view of a buffer's values: element offset, then sizes and strides per axis.
#[derive(Clone)]
pub struct GpuView<'a> {
    pub buffer: &'a GpuBuffer,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

/// What a reduction computes per output element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    /// The largest value; NaN when any value is NaN (as on the CPU).
    Max,
}

/// Output tile edge of the GEMM (each of 16 x 16 threads computes 4 x 4 values).
const TILE: usize = 64;

/// `C[b] = A[b] @ B[b]` for each batch index `b`, 64 x 64 tiles of C per workgroup, K in
/// steps of 16 through shared memory. Meta: `[m, k, n, batches, a_offset, a_batch_stride,
/// a_row_stride, a_col_stride, b_offset, b_batch_stride, b_row_stride, b_col_stride]`;
/// the batch strides are per flattened batch index, which is what the caller's broadcast
/// (stride 0) or contiguous batch axes give.
const MATMUL: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

var<workgroup> ta: array<f32, 1024>; // [16 k][64 rows]
var<workgroup> tb: array<f32, 1024>; // [16 k][64 cols]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = prm[0]; let k = prm[1]; let n = prm[2];
    let batch = wg.z;
    let a0 = prm[4] + batch * prm[5];
    let b0 = prm[8] + batch * prm[9];
    let ars = prm[6]; let acs = prm[7]; let brs = prm[10]; let bcs = prm[11];
    let row0 = wg.y * 64u; let col0 = wg.x * 64u;
    let t = lid.y * 16u + lid.x;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) { acc[i] = 0.0; }
    for (var k0 = 0u; k0 < k; k0 = k0 + 16u) {
        for (var l = 0u; l < 4u; l = l + 1u) {
            let e = t + l * 256u;
            // A tile: element e is row e % 64, k e / 64; B tile: col e % 64, k e / 64.
            let r = row0 + e % 64u; let kk = k0 + e / 64u;
            var va = 0.0;
            if (r < m && kk < k) { va = a[a0 + r * ars + kk * acs]; }
            ta[e] = va;
            let cc = col0 + e % 64u;
            var vb = 0.0;
            if (cc < n && kk < k) { vb = b[b0 + kk * brs + cc * bcs]; }
            tb[e] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {
            var ra: array<f32, 4>;
            var rb: array<f32, 4>;
            for (var i = 0u; i < 4u; i = i + 1u) {
                ra[i] = ta[kk * 64u + lid.y * 4u + i];
                rb[i] = tb[kk * 64u + lid.x * 4u + i];
            }
            for (var i = 0u; i < 4u; i = i + 1u) {
                for (var j = 0u; j < 4u; j = j + 1u) {
                    acc[i * 4u + j] = fma(ra[i], rb[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    let c0 = batch * m * n;
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let cc = col0 + lid.x * 4u + j;
            if (r < m && cc < n) { c[c0 + r * n + cc] = acc[i * 4u + j]; }
        }
    }
}
"#;

/// One thread per output element: its kept coordinates give a base offset, then a loop over
/// the reduced elements. Meta: `[outputs, reduced count, kept rank, reduced rank, mode,
/// offset, kept sizes.., kept strides.., reduced sizes.., reduced strides..]`, mode 0 sum,
/// 1 mean, 2 max.
const REDUCE: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let o = gid.x + gid.y * groups.x * 64u;
    if (o >= prm[0]) { return; }
    let count = prm[1]; let kr = prm[2]; let rr = prm[3]; let mode = prm[4];
    let ks = 6u; let kst = 6u + kr; let rs = 6u + 2u * kr; let rst = 6u + 2u * kr + rr;
    var base = prm[5];
    var rest = o;
    for (var d = kr; d > 0u; d = d - 1u) {
        let size = prm[ks + d - 1u];
        base = base + (rest % size) * prm[kst + d - 1u];
        rest = rest / size;
    }
    var acc = 0.0;
    if (mode == 2u) { acc = bitcast<f32>(0xff800000u); }
    var nan = false;
    for (var e = 0u; e < count; e = e + 1u) {
        var off = base;
        var r = e;
        for (var d = rr; d > 0u; d = d - 1u) {
            let size = prm[rs + d - 1u];
            off = off + (r % size) * prm[rst + d - 1u];
            r = r / size;
        }
        let v = x[off];
        if (mode == 2u) {
            nan = nan || v != v;
            acc = max(acc, v);
        } else {
            acc = acc + v;
        }
    }
    if (mode == 1u) { acc = acc / f32(count); }
    if (nan) { acc = bitcast<f32>(0x7fc00000u); }
    out[o] = acc;
}
"#;

/// `out[r] = x[r * cols + idx[r]]` over contiguous rows. Meta: `[rows, cols]`. Indices were
/// checked on the host (they keep a host copy), so every read is in bounds.
const PICK: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = gid.x + gid.y * groups.x * 64u;
    if (r >= prm[0]) { return; }
    let cols = prm[1];
    out[r] = x[r * cols + min(idx[r], cols - 1u)];
}
"#;

/// `out[r, j] = g[r] if j == idx[r] else 0` over contiguous rows. Meta: `[rows, cols]`.
const PICK_GRAD: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = gid.x + gid.y * groups.x * 256u;
    let cols = prm[1];
    if (e >= prm[0] * cols) { return; }
    let r = e / cols;
    out[e] = select(0.0, g[r], e % cols == idx[r]);
}
"#;

fn word(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::Call(format!("{what} {v} exceeds 2^32")))
}

fn words(vs: &[usize], what: &str) -> Result<Vec<u32>> {
    vs.iter().map(|&v| word(v, what)).collect()
}

impl WgpuDevice {
    fn run(
        &self,
        name: &str,
        source: &str,
        meta: &[u32],
        buffers: &[&GpuBuffer],
        groups: [u32; 3],
    ) -> Result<()> {
        let meta = self.upload_u32(meta)?;
        let mut all = vec![&meta];
        all.extend_from_slice(buffers);
        let kernel = Kernel {
            name,
            source,
            entry: "main",
        };
        self.dispatch(&kernel, &all, groups)
    }

    /// `out = a @ b` for `batches` products of `[m, k] @ [k, n]`; `a` and `b` are
    /// `[batches, m, k]` and `[batches, k, n]` views (a batch stride of 0 broadcasts), `out`
    /// holds `batches * m * n` values, written contiguously.
    pub fn matmul(&self, a: &GpuView, b: &GpuView, out: &GpuBuffer) -> Result<()> {
        let (Some(&[batches, m, k]), Some(&[_, k2, n])) = (
            a.shape.get(..3).filter(|_| a.shape.len() == 3),
            b.shape.get(..3).filter(|_| b.shape.len() == 3),
        ) else {
            return Err(GpuError::Call(format!(
                "matmul takes [batch, m, k] and [batch, k, n] views, found {:?} and {:?}",
                a.shape, b.shape
            )));
        };
        if k != k2 || b.shape[0] != batches || out.len() < batches * m * n {
            return Err(GpuError::Call(format!(
                "matmul operands {:?} @ {:?} do not fit an output of {}",
                a.shape,
                b.shape,
                out.len()
            )));
        }
        if batches * m * n == 0 {
            return Ok(());
        }
        let mut meta = words(&[m, k, n, batches, a.offset], "matmul size")?;
        meta.extend(words(&a.strides, "matmul stride")?);
        meta.push(word(b.offset, "matmul offset")?);
        meta.extend(words(&b.strides, "matmul stride")?);
        let groups = [
            word(n.div_ceil(TILE), "matmul grid")?,
            word(m.div_ceil(TILE), "matmul grid")?,
            word(batches, "matmul batch count")?,
        ];
        let limit = self.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > limit) {
            return Err(GpuError::Call(format!(
                "matmul grid {groups:?} exceeds the device's {limit} workgroups per dimension"
            )));
        }
        self.run(
            "rtx_matmul",
            MATMUL,
            &meta,
            &[a.buffer, b.buffer, out],
            groups,
        )
    }

    /// Reduces `x` over the axes marked in `reduced` (the others are kept, in order) into the
    /// contiguous `out`, one value per kept coordinate.
    pub fn reduce(
        &self,
        x: &GpuView,
        reduced: &[bool],
        mode: Reduce,
        out: &GpuBuffer,
    ) -> Result<()> {
        let (mut ks, mut kst, mut rs, mut rst) = (vec![], vec![], vec![], vec![]);
        for (axis, (&size, &stride)) in x.shape.iter().zip(&x.strides).enumerate() {
            if reduced.get(axis).copied().unwrap_or(false) {
                rs.push(size);
                rst.push(stride);
            } else {
                ks.push(size);
                kst.push(stride);
            }
        }
        let outputs: usize = ks.iter().product();
        let count: usize = rs.iter().product();
        if out.len() < outputs {
            return Err(GpuError::Call(format!(
                "reduction of {:?} needs {outputs} outputs, the buffer holds {}",
                x.shape,
                out.len()
            )));
        }
        if outputs == 0 {
            return Ok(());
        }
        let mode_word = match mode {
            Reduce::Sum => 0,
            Reduce::Mean => 1,
            Reduce::Max => 2,
        };
        let mut meta = words(&[outputs, count, ks.len(), rs.len()], "reduction size")?;
        meta.push(mode_word);
        meta.push(word(x.offset, "reduction offset")?);
        for part in [&ks, &kst, &rs, &rst] {
            meta.extend(words(part, "reduction size")?);
        }
        let groups = grid(
            outputs,
            64,
            self.limits.max_compute_workgroups_per_dimension,
        )?;
        self.run("rtx_reduce", REDUCE, &meta, &[x.buffer, out], groups)
    }

    /// `out[r] = x[r, idx[r]]` for contiguous `[rows, cols]` values and `rows` indices, each
    /// below `cols` (the caller checks them).
    pub fn pick(
        &self,
        x: &GpuBuffer,
        idx: &GpuBuffer,
        rows: usize,
        cols: usize,
        out: &GpuBuffer,
    ) -> Result<()> {
        if rows * cols == 0 {
            return Ok(());
        }
        let meta = words(&[rows, cols], "pick size")?;
        let groups = grid(rows, 64, self.limits.max_compute_workgroups_per_dimension)?;
        self.run("rtx_pick", PICK, &meta, &[x, idx, out], groups)
    }

    /// `out[r, j] = g[r]` where `j == idx[r]`, else 0, for contiguous `[rows, cols]` `out`.
    pub fn pick_grad(
        &self,
        g: &GpuBuffer,
        idx: &GpuBuffer,
        rows: usize,
        cols: usize,
        out: &GpuBuffer,
    ) -> Result<()> {
        if rows * cols == 0 {
            return Ok(());
        }
        let meta = words(&[rows, cols], "pick size")?;
        let groups = grid(
            rows * cols,
            256,
            self.limits.max_compute_workgroups_per_dimension,
        )?;
        self.run("rtx_pick_grad", PICK_GRAD, &meta, &[g, idx, out], groups)
    }
}

/// One optimizer step over a parameter, in place, to the CPU's formulas (`rtx_core::optim`).
/// Meta: `[n, rule]` then f32 bits of `lr, beta1 | momentum, beta2 | dampening, eps,
/// weight_decay, flag (decoupled | nesterov), scalar0 (bias correction 1 | first step),
/// scalar1 (bias correction 2)`; rule 0 Adam, 1 SGD with momentum, 2 plain SGD.
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

/// The update rule of [`WgpuDevice::optimizer_step`], with its hyperparameters.
#[derive(Clone, Copy, Debug)]
pub enum UpdateRule {
    Adam {
        lr: f32,
        betas: (f32, f32),
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
        /// `1 - beta^step` for each beta.
        corrections: (f32, f32),
    },
    Sgd {
        lr: f32,
        momentum: f32,
        dampening: f32,
        nesterov: bool,
        weight_decay: f32,
        first_step: bool,
    },
}

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
        let f = |v: f32| v.to_bits();
        let meta = match rule {
            UpdateRule::Adam {
                lr,
                betas,
                eps,
                weight_decay,
                decoupled,
                corrections,
            } => vec![
                word(n, "parameter size")?,
                0,
                f(lr),
                f(betas.0),
                f(betas.1),
                f(eps),
                f(weight_decay),
                u32::from(decoupled),
                f(corrections.0),
                f(corrections.1),
            ],
            UpdateRule::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
                first_step,
            } => vec![
                word(n, "parameter size")?,
                if momentum == 0.0 { 2 } else { 1 },
                f(lr),
                f(momentum),
                f(dampening),
                0,
                f(weight_decay),
                u32::from(nesterov),
                f(if first_step { 1.0 } else { 0.0 }),
                0,
            ],
        };
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

/// `out[r, j] = w[ids[r], j]`. Meta: `[rows, cols, w_offset, w_row_stride, w_col_stride]`;
/// ids were checked on the host.
const GATHER_ROWS: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = gid.x + gid.y * groups.x * 256u;
    let cols = prm[1];
    if (e >= prm[0] * cols) { return; }
    let r = e / cols;
    out[e] = w[prm[2] + ids[r] * prm[3] + (e % cols) * prm[4]];
}
"#;

/// `out[v, j] = sum of g[k, j] over the rows k whose id is v`, in row order: row `v`'s rows
/// are `rows[starts[v] .. starts[v + 1]]` (the ids grouped on the host), so every output is
/// one thread's sum and no atomics are needed. Meta: `[vocab, cols]`; `g` is contiguous.
const SCATTER_ROWS: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> starts: array<u32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = gid.x + gid.y * groups.x * 256u;
    let cols = prm[1];
    if (e >= prm[0] * cols) { return; }
    let v = e / cols;
    let j = e % cols;
    var acc = 0.0;
    for (var k = starts[v]; k < starts[v + 1u]; k = k + 1u) {
        acc = acc + g[rows[k] * cols + j];
    }
    out[e] = acc;
}
"#;

/// `out[view] = x[view]` for two strided views of one shape. Meta: `[n, rank, shape..,
/// x_offset, x_strides.., out_offset, out_strides..]`.
const STRIDED_COPY: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    if (i >= prm[0]) { return; }
    let rank = prm[1];
    let xb = 2u + rank;
    let ob = 3u + 2u * rank;
    var xo = prm[xb];
    var oo = prm[ob];
    var rest = i;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = prm[1u + d];
        let c = rest % size;
        rest = rest / size;
        xo = xo + c * prm[xb + d];
        oo = oo + c * prm[ob + d];
    }
    out[oo] = x[xo];
}
"#;

impl WgpuDevice {
    /// `out[r, :] = w[ids[r], :]` for `rows` ids, each below `w`'s row count (checked by the
    /// caller); `w` is a 2-D view, `out` contiguous `[rows, cols]`.
    pub fn gather_rows(
        &self,
        w: &GpuView,
        ids: &GpuBuffer,
        rows: usize,
        out: &GpuBuffer,
    ) -> Result<()> {
        let (Some(&cols), [rs, cs]) = (w.shape.get(1), w.strides.as_slice()) else {
            return Err(GpuError::Call(format!(
                "gather_rows takes a 2-D table, found {:?}",
                w.shape
            )));
        };
        if rows * cols == 0 {
            return Ok(());
        }
        let meta = words(&[rows, cols, w.offset, *rs, *cs], "gather size")?;
        let groups = grid(
            rows * cols,
            256,
            self.limits.max_compute_workgroups_per_dimension,
        )?;
        self.run(
            "rtx_gather_rows",
            GATHER_ROWS,
            &meta,
            &[w.buffer, ids, out],
            groups,
        )
    }

    /// `out[v, :] = sum of g[k, :] over k in rows[starts[v]..starts[v + 1]]`, for a contiguous
    /// `g` of `cols` columns and `vocab` output rows.
    pub fn scatter_rows(
        &self,
        g: &GpuBuffer,
        starts: &GpuBuffer,
        rows: &GpuBuffer,
        vocab: usize,
        cols: usize,
        out: &GpuBuffer,
    ) -> Result<()> {
        if vocab * cols == 0 {
            return Ok(());
        }
        let meta = words(&[vocab, cols], "scatter size")?;
        let groups = grid(
            vocab * cols,
            256,
            self.limits.max_compute_workgroups_per_dimension,
        )?;
        self.run(
            "rtx_scatter_rows",
            SCATTER_ROWS,
            &meta,
            &[g, starts, rows, out],
            groups,
        )
    }

    /// Copies the strided view `x` into the strided view `out` of the same shape (a part of a
    /// concatenation, a gradient into its padded place).
    pub fn copy_into(&self, x: &GpuView, out: &GpuView) -> Result<()> {
        if x.shape != out.shape {
            return Err(GpuError::Call(format!(
                "copy of {:?} into {:?}",
                x.shape, out.shape
            )));
        }
        let n: usize = x.shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        let mut meta = words(&[n, x.shape.len()], "copy size")?;
        meta.extend(words(&x.shape, "copy size")?);
        for v in [x, out] {
            meta.push(word(v.offset, "copy offset")?);
            meta.extend(words(&v.strides, "copy stride")?);
        }
        let groups = grid(n, 256, self.limits.max_compute_workgroups_per_dimension)?;
        self.run(
            "rtx_copy_into",
            STRIDED_COPY,
            &meta,
            &[x.buffer, out.buffer],
            groups,
        )
    }
}

/// The longest head a device attention kernel keeps in registers.
pub const ATTENTION_MAX_HEAD: usize = 128;

/// Attention over contiguous `q [S, Tq, D]`, `k [S, Tk, D]`, `v [S, Tk, D]`, one thread per
/// query row: an online softmax over the keys, no `Tq x Tk` matrix. Meta: `[S, Tq, Tk, D,
/// causal, scale bits]`.
const ATTENTION: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = gid.x + gid.y * groups.x * 64u;
    let tq = prm[1]; let tk = prm[2]; let d = prm[3];
    if (r >= prm[0] * tq) { return; }
    let s = r / tq; let i = r % tq;
    let scale = bitcast<f32>(prm[5]);
    var last = tk;
    if (prm[4] != 0u) { last = min(tk, i + 1u); }
    var acc: array<f32, 128>;
    for (var c = 0u; c < d; c = c + 1u) { acc[c] = 0.0; }
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
        for (var c = 0u; c < d; c = c + 1u) { acc[c] = acc[c] * corr + p * v[ko + c]; }
        m = m2;
    }
    for (var c = 0u; c < d; c = c + 1u) { out[qo + c] = acc[c] / l; }
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

/// Sizes of an attention call over `S` flattened batch slices.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub slices: usize,
    pub queries: usize,
    pub keys: usize,
    pub head: usize,
    pub causal: bool,
}

impl AttentionShape {
    fn meta(&self) -> Result<Vec<u32>> {
        if self.head > ATTENTION_MAX_HEAD || (self.causal && self.queries != self.keys) {
            return Err(GpuError::Call(format!(
                "device attention takes heads up to {ATTENTION_MAX_HEAD} (and Tq == Tk when causal), found {self:?}"
            )));
        }
        let mut meta = words(
            &[
                self.slices,
                self.queries,
                self.keys,
                self.head,
                usize::from(self.causal),
            ],
            "attention size",
        )?;
        meta.push((1.0 / (self.head as f32).sqrt()).to_bits());
        Ok(meta)
    }
}

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
        if shape.queries != shape.keys {
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
