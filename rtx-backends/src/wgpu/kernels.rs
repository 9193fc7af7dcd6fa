//! The wgpu backend's own kernels for the core ops that are not pointwise (those come from
//! `rtx_ir::emit`): a tiled shared-memory GEMM over strided, batched operands, reductions
//! over any set of axes, the gathers and scatters of `Pick`, embeddings and their gradients,
//! and strided copies (attention and the optimizer step have files of their own).
//!
//! Each takes a `u32` meta buffer laid out as its Rust entry point writes it, so operands are
//! read through their offsets and strides (a transposed weight is never copied first) and
//! outputs are written contiguously.

use super::{GpuBuffer, Kernel, WgpuDevice, grid};
use crate::gpu_error::{GpuError, Result};
use crate::kernel_meta;
pub use crate::kernel_meta::Reduce;
pub(super) use crate::kernel_meta::{word, words};

/// A strided view of a buffer's values: element offset, then sizes and strides per axis.
#[derive(Clone)]
pub struct GpuView<'a> {
    pub buffer: &'a GpuBuffer,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
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
/// 1 mean, 2 max, 3 the position of the first maximum (as u32 bits).
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
    var best = 0u;
    var best_v = 0.0;
    for (var e = 0u; e < count; e = e + 1u) {
        var off = base;
        var r = e;
        for (var d = rr; d > 0u; d = d - 1u) {
            let size = prm[rs + d - 1u];
            off = off + (r % size) * prm[rst + d - 1u];
            r = r / size;
        }
        let v = x[off];
        if (mode == 3u) {
            // The first maximum; a NaN wins and stays (as on the CPU).
            if (e == 0u || (best_v == best_v && (v != v || v > best_v))) { best = e; best_v = v; }
        } else if (mode == 2u) {
            nan = nan || v != v;
            acc = max(acc, v);
        } else {
            acc = acc + v;
        }
    }
    if (mode == 1u) { acc = acc / f32(count); }
    if (nan) { acc = bitcast<f32>(0x7fc00000u); }
    if (mode == 3u) { acc = bitcast<f32>(best); }
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

impl WgpuDevice {
    pub(super) fn run(
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
        let (meta, outputs) = kernel_meta::reduce(&x.shape, &x.strides, x.offset, reduced, mode)?;
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
        let meta = kernel_meta::gather_rows(rows, cols, w.offset, *rs, *cs)?;
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
        let meta = kernel_meta::strided_copy(
            &x.shape,
            (x.offset, &x.strides),
            (out.offset, &out.strides),
        )?;
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

/// The gradient of a max reduction: `out[i] = g[kept(i)]` where `i` is its group's first
/// maximum (`firsts`, the positions [`Reduce::ArgMax`] gives over the same axes), else 0;
/// `out` contiguous in x's shape. Meta: `[n, rank, shape.., reduced flags..]`; `g` is
/// contiguous over the kept axes.
const SCATTER_FIRST: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> firsts: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    if (i >= prm[0]) { return; }
    let rank = prm[1];
    var rest = i;
    var kept = 0u; var kept_scale = 1u;
    var red = 0u; var red_scale = 1u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let size = prm[1u + d];
        let c = rest % size;
        rest = rest / size;
        if (prm[1u + rank + d] != 0u) {
            red = red + c * red_scale; red_scale = red_scale * size;
        } else {
            kept = kept + c * kept_scale; kept_scale = kept_scale * size;
        }
    }
    out[i] = select(0.0, g[kept], firsts[kept] == red);
}
"#;

impl WgpuDevice {
    /// The gradient of a max over the axes marked in `reduced` of a contiguous `shape`: `g`
    /// (contiguous, kept axes) routed to each group's first maximum, whose position within
    /// the group `firsts` holds.
    pub fn scatter_first(
        &self,
        shape: &[usize],
        reduced: &[bool],
        g: &GpuBuffer,
        firsts: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<()> {
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        let meta = kernel_meta::scatter_first(shape, reduced)?;
        let groups = grid(n, 256, self.limits.max_compute_workgroups_per_dimension)?;
        self.run(
            "rtx_scatter_first",
            SCATTER_FIRST,
            &meta,
            &[g, firsts, out],
            groups,
        )
    }
}
