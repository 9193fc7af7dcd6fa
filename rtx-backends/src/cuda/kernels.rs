//! The CUDA runtime's own kernels for the core ops that are not pointwise (those come from
//! `rtx_ir::emit`): reductions over any set of axes, the gathers and scatters of `Pick`,
//! embeddings and their gradients, the max gradient's scatter, strided copies, top-k and
//! the optimizer step. They are
//! the wgpu backend's kernels (`wgpu/kernels.rs`) spelled in CUDA C, reading the same meta
//! words (`kernel_meta`), so both targets compute the same values in the same order.
//!
//! Every kernel is one thread per output element with no shared memory or barriers, so
//! `on_cpu` runs them on the CPU in tests (`tests/cuda_kernels_on_cpu.rs`). Index buffers
//! hold u32 words that the caller checked on the host.

use super::runtime::{Arg, CudaBuffer, CudaDevice, CudaKernel};
use super::{GpuError, Result};
use crate::kernel_meta::{self, Reduce, UpdateRule};

/// Threads per block of every kernel here.
pub const BLOCK: u32 = 256;

/// All the kernels, one module (compiled once, cached on disk like the emitted ones).
pub const SOURCE: &str = r#"
#define RTX_INDEX ((blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x)

// One thread per output: its kept coordinates give a base offset, then a loop over the
// reduced elements in order. Meta: kernel_meta::reduce.
extern "C" __global__ void rtx_reduce(RTX_META, const float* x, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int o = RTX_INDEX;
    if (o >= prm[0]) return;
    const unsigned int count = prm[1], kr = prm[2], rr = prm[3], mode = prm[4];
    const unsigned int ks = 6u, kst = 6u + kr, rs = 6u + 2u * kr, rst = 6u + 2u * kr + rr;
    unsigned int base = prm[5], rest = o;
    for (unsigned int d = kr; d > 0u; --d) {
        const unsigned int size = prm[ks + d - 1u];
        base += (rest % size) * prm[kst + d - 1u];
        rest /= size;
    }
    float acc = mode == 2u ? __uint_as_float(0xff800000u) : 0.0f;
    bool nan = false;
    unsigned int best = 0u;
    float best_v = 0.0f;
    for (unsigned int e = 0u; e < count; ++e) {
        unsigned int off = base, r = e;
        for (unsigned int d = rr; d > 0u; --d) {
            const unsigned int size = prm[rs + d - 1u];
            off += (r % size) * prm[rst + d - 1u];
            r /= size;
        }
        const float v = x[off];
        if (mode == 3u) {
            // The first maximum; a NaN wins and stays (as on the CPU).
            if (e == 0u || (best_v == best_v && (v != v || v > best_v))) { best = e; best_v = v; }
        } else if (mode == 2u) {
            nan = nan || v != v;
            acc = v > acc ? v : acc;
        } else {
            acc = acc + v;
        }
    }
    if (mode == 1u) acc = acc / (float)count;
    if (nan) acc = __uint_as_float(0x7fc00000u);
    if (mode == 3u) acc = __uint_as_float(best);
    out[o] = acc;
}

// out[r] = x[r * cols + idx[r]]. Meta: [rows, cols].
extern "C" __global__ void rtx_pick(RTX_META, const float* x,
                                    const unsigned int* idx, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int r = RTX_INDEX;
    if (r >= prm[0]) return;
    const unsigned int cols = prm[1];
    const unsigned int j = idx[r] < cols ? idx[r] : cols - 1u;
    out[r] = x[r * cols + j];
}

// out[r, j] = g[r] if j == idx[r] else 0. Meta: [rows, cols].
extern "C" __global__ void rtx_pick_grad(RTX_META, const float* g,
                                         const unsigned int* idx, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int e = RTX_INDEX;
    const unsigned int cols = prm[1];
    if (e >= prm[0] * cols) return;
    const unsigned int r = e / cols;
    out[e] = e % cols == idx[r] ? g[r] : 0.0f;
}

// out[r, j] = w[ids[r], j]. Meta: kernel_meta::gather_rows.
extern "C" __global__ void rtx_gather_rows(RTX_META, const float* w,
                                           const unsigned int* ids, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int e = RTX_INDEX;
    const unsigned int cols = prm[1];
    if (e >= prm[0] * cols) return;
    const unsigned int r = e / cols;
    out[e] = w[prm[2] + ids[r] * prm[3] + (e % cols) * prm[4]];
}

// out[v, j] = sum of g[k, j] over rows[starts[v] .. starts[v + 1]], in order: each output
// is one thread's sum, no atomics. Meta: [vocab, cols]; g contiguous.
extern "C" __global__ void rtx_scatter_rows(RTX_META, const float* g,
                                            const unsigned int* starts,
                                            const unsigned int* rows, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int e = RTX_INDEX;
    const unsigned int cols = prm[1];
    if (e >= prm[0] * cols) return;
    const unsigned int v = e / cols, j = e % cols;
    float acc = 0.0f;
    for (unsigned int k = starts[v]; k < starts[v + 1u]; ++k) acc = acc + g[rows[k] * cols + j];
    out[e] = acc;
}

// out[view] = x[view] for two strided views of one shape. Meta: kernel_meta::strided_copy.
extern "C" __global__ void rtx_copy_into(RTX_META, const float* x, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int i = RTX_INDEX;
    if (i >= prm[0]) return;
    const unsigned int rank = prm[1], xb = 2u + rank, ob = 3u + 2u * rank;
    unsigned int xo = prm[xb], oo = prm[ob], rest = i;
    for (unsigned int d = rank; d > 0u; --d) {
        const unsigned int size = prm[1u + d];
        const unsigned int c = rest % size;
        rest /= size;
        xo += c * prm[xb + d];
        oo += c * prm[ob + d];
    }
    out[oo] = x[xo];
}

// The gradient of a max: out[i] = g[kept(i)] where i is its group's first maximum (firsts,
// the positions rtx_reduce's mode 3 gives), else 0. Meta: kernel_meta::scatter_first.
extern "C" __global__ void rtx_scatter_first(RTX_META, const float* g,
                                             const unsigned int* firsts, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int i = RTX_INDEX;
    if (i >= prm[0]) return;
    const unsigned int rank = prm[1];
    unsigned int rest = i, kept = 0u, kept_scale = 1u, red = 0u, red_scale = 1u;
    for (unsigned int d = rank; d > 0u; --d) {
        const unsigned int size = prm[1u + d];
        const unsigned int c = rest % size;
        rest /= size;
        if (prm[1u + rank + d] != 0u) { red += c * red_scale; red_scale *= size; }
        else { kept += c * kept_scale; kept_scale *= size; }
    }
    out[i] = firsts[kept] == red ? g[kept] : 0.0f;
}

// One optimizer step over a parameter, in place, to the CPU's formulas (rtx_core::optim).
// Meta: kernel_meta::optimizer (rule 0 Adam, 1 SGD with momentum, 2 plain SGD).
extern "C" __global__ void rtx_optimizer_step(RTX_META, float* p, const float* g,
                                              float* s1, float* s2) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int i = RTX_INDEX;
    if (i >= prm[0]) return;
    const unsigned int rule = prm[1];
    const float lr = __uint_as_float(prm[2]), h1 = __uint_as_float(prm[3]);
    const float h2 = __uint_as_float(prm[4]), eps = __uint_as_float(prm[5]);
    const float wd = __uint_as_float(prm[6]);
    const bool flag = prm[7] != 0u;
    const float c1 = __uint_as_float(prm[8]), c2 = __uint_as_float(prm[9]);
    float x = p[i];
    const float gi0 = g[i];
    if (rule == 0u) {
        float gi = gi0;
        if (flag) { x = x * (1.0f - lr * wd); } else { gi = gi + wd * x; }
        const float m = h1 * s1[i] + (1.0f - h1) * gi;
        const float v = h2 * s2[i] + (1.0f - h2) * gi * gi;
        s1[i] = m;
        s2[i] = v;
        const float denom = sqrtf(v / c2) + eps;
        x = x - lr * (m / c1) / denom;
    } else if (rule == 1u) {
        const float d = gi0 + wd * x;
        float b = h1 * s1[i] + (1.0f - h2) * d;
        if (c1 == 1.0f) b = d;
        s1[i] = b;
        const float step = flag ? d + h1 * b : b;
        x = x - lr * step;
    } else {
        x = x - lr * (gi0 + wd * x);
    }
    p[i] = x;
}

// Whether element i (value a) comes before element j (value b): NaN first, then larger,
// then earlier.
__device__ __forceinline__ bool rtx_before(float a, unsigned int i, float b, unsigned int j) {
    const bool an = a != a, bn = b != b;
    if (an != bn) return an;
    if (!an && a != b) return a > b;
    return i < j;
}

// Top-k along the last axis of contiguous [rows, n] values, one thread per row: pick t is the
// first element in rtx_before's order after pick t - 1 (O(k n), no sort buffer). Mode 0
// writes values to out [rows, k] and positions to idx [rows, k]; mode 1 the gradient
// out [rows, n]: zeros with g [rows, k] at the picked positions. Meta: [mode, rows, n, k].
extern "C" __global__ void rtx_top_k(RTX_META, const float* x, const float* g,
                                     float* out, unsigned int* idx) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int r = RTX_INDEX;
    const unsigned int mode = prm[0], n = prm[2], k = prm[3];
    if (r >= prm[1]) return;
    const unsigned int base = r * n;
    if (mode == 1u) {
        for (unsigned int j = 0u; j < n; ++j) out[base + j] = 0.0f;
    }
    unsigned int prev = 0u;
    float prev_v = 0.0f;
    for (unsigned int t = 0u; t < k; ++t) {
        unsigned int best = n;
        float best_v = 0.0f;
        for (unsigned int j = 0u; j < n; ++j) {
            const float v = x[base + j];
            if (t > 0u && !rtx_before(prev_v, prev, v, j)) continue;
            if (best == n || rtx_before(v, j, best_v, best)) { best = j; best_v = v; }
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

fn kernel(entry: &'static str) -> CudaKernel<'static> {
    CudaKernel {
        name: entry,
        source: SOURCE,
        entry,
    }
}

/// A strided view of a device buffer's values: element offset, then sizes and strides.
pub struct CudaView<'a> {
    pub buffer: &'a CudaBuffer,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

impl CudaDevice {
    /// Reduces `x` over the axes marked in `reduced` into the contiguous `out`, one value
    /// per kept coordinate (`ArgMax`: the first maximum's position, as u32 bits).
    pub fn reduce(
        &self,
        x: &CudaView,
        reduced: &[bool],
        mode: Reduce,
        out: &CudaBuffer,
    ) -> Result<()> {
        let (meta, outputs) = kernel_meta::reduce(&x.shape, &x.strides, x.offset, reduced, mode)?;
        if out.len() < outputs {
            return Err(GpuError::Call(format!(
                "reduction of {:?} needs {outputs} outputs, the buffer holds {}",
                x.shape,
                out.len()
            )));
        }
        self.run_kernel(
            &kernel("rtx_reduce"),
            &meta,
            &[Arg::In(x.buffer), Arg::Out(out)],
            outputs,
            BLOCK,
        )
    }

    /// `out[r] = x[r, idx[r]]` for contiguous `[rows, cols]` values, each index below
    /// `cols` (checked by the caller).
    pub fn pick(
        &self,
        x: &CudaBuffer,
        idx: &CudaBuffer,
        rows: usize,
        cols: usize,
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = kernel_meta::words(&[rows, cols], "pick size")?;
        self.run_kernel(
            &kernel("rtx_pick"),
            &meta,
            &[Arg::In(x), Arg::In(idx), Arg::Out(out)],
            rows,
            BLOCK,
        )
    }

    /// `out[r, j] = g[r]` where `j == idx[r]`, else 0, over contiguous `[rows, cols]`.
    pub fn pick_grad(
        &self,
        g: &CudaBuffer,
        idx: &CudaBuffer,
        rows: usize,
        cols: usize,
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = kernel_meta::words(&[rows, cols], "pick size")?;
        self.run_kernel(
            &kernel("rtx_pick_grad"),
            &meta,
            &[Arg::In(g), Arg::In(idx), Arg::Out(out)],
            rows * cols,
            BLOCK,
        )
    }

    /// `out[r, :] = w[ids[r], :]` for `rows` ids below `w`'s row count (checked by the
    /// caller); `w` a 2-D view, `out` contiguous `[rows, cols]`.
    pub fn gather_rows(
        &self,
        w: &CudaView,
        ids: &CudaBuffer,
        rows: usize,
        out: &CudaBuffer,
    ) -> Result<()> {
        let (Some(&cols), [rs, cs]) = (w.shape.get(1), w.strides.as_slice()) else {
            return Err(GpuError::Call(format!(
                "gather_rows takes a 2-D table, found {:?}",
                w.shape
            )));
        };
        let meta = kernel_meta::gather_rows(rows, cols, w.offset, *rs, *cs)?;
        self.run_kernel(
            &kernel("rtx_gather_rows"),
            &meta,
            &[Arg::In(w.buffer), Arg::In(ids), Arg::Out(out)],
            rows * cols,
            BLOCK,
        )
    }

    /// `out[v, :] = sum of g[k, :] over k in rows[starts[v]..starts[v + 1]]` for a
    /// contiguous `g` of `cols` columns and `vocab` output rows.
    pub fn scatter_rows(
        &self,
        g: &CudaBuffer,
        starts: &CudaBuffer,
        rows: &CudaBuffer,
        vocab: usize,
        cols: usize,
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = kernel_meta::words(&[vocab, cols], "scatter size")?;
        self.run_kernel(
            &kernel("rtx_scatter_rows"),
            &meta,
            &[Arg::In(g), Arg::In(starts), Arg::In(rows), Arg::Out(out)],
            vocab * cols,
            BLOCK,
        )
    }

    /// Copies the strided view `x` into `out` at `out_offset` with `out_strides` (the
    /// same shape).
    pub fn copy_into(
        &self,
        x: &CudaView,
        out: &CudaBuffer,
        out_offset: usize,
        out_strides: &[usize],
    ) -> Result<()> {
        let meta =
            kernel_meta::strided_copy(&x.shape, (x.offset, &x.strides), (out_offset, out_strides))?;
        let n = x.shape.iter().product();
        self.run_kernel(
            &kernel("rtx_copy_into"),
            &meta,
            &[Arg::In(x.buffer), Arg::Out(out)],
            n,
            BLOCK,
        )
    }

    /// The gradient of a max over the axes marked in `reduced` of a contiguous `shape`.
    pub fn scatter_first(
        &self,
        shape: &[usize],
        reduced: &[bool],
        g: &CudaBuffer,
        firsts: &CudaBuffer,
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = kernel_meta::scatter_first(shape, reduced)?;
        self.run_kernel(
            &kernel("rtx_scatter_first"),
            &meta,
            &[Arg::In(g), Arg::In(firsts), Arg::Out(out)],
            shape.iter().product(),
            BLOCK,
        )
    }

    /// Updates `param` (`n` values) in place from `grad` and the state buffers `first` and
    /// `second` (each `n` values, or one word where the rule keeps none).
    pub fn optimizer_step(
        &self,
        rule: UpdateRule,
        n: usize,
        param: &CudaBuffer,
        grad: &CudaBuffer,
        first: &CudaBuffer,
        second: &CudaBuffer,
    ) -> Result<()> {
        let meta = kernel_meta::optimizer(rule, n)?;
        self.run_kernel(
            &kernel("rtx_optimizer_step"),
            &meta,
            &[
                Arg::Out(param),
                Arg::In(grad),
                Arg::Out(first),
                Arg::Out(second),
            ],
            n,
            BLOCK,
        )
    }

    /// The `k` largest of each contiguous row of `n` values (NaN first, ties to the earlier)
    /// into `values` and `positions` (`[rows, k]` each), `k <= n`.
    pub fn top_k(
        &self,
        x: &CudaBuffer,
        (rows, n, k): (usize, usize, usize),
        values: &CudaBuffer,
        positions: &CudaBuffer,
    ) -> Result<()> {
        let meta = top_k_meta(0, rows, n, k)?;
        self.run_kernel(
            &kernel("rtx_top_k"),
            &meta,
            &[
                Arg::In(x),
                Arg::In(x),
                Arg::Out(values),
                Arg::Out(positions),
            ],
            rows,
            BLOCK,
        )
    }

    /// The gradient of [`CudaDevice::top_k`]: `out [rows, n]` zeros with `g [rows, k]` at
    /// the positions top-k picks from `x`.
    pub fn top_k_grad(
        &self,
        x: &CudaBuffer,
        g: &CudaBuffer,
        (rows, n, k): (usize, usize, usize),
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = top_k_meta(1, rows, n, k)?;
        let unused = self.zeros(1)?;
        self.run_kernel(
            &kernel("rtx_top_k"),
            &meta,
            &[Arg::In(x), Arg::In(g), Arg::Out(out), Arg::Out(&unused)],
            rows,
            BLOCK,
        )
    }
}

fn top_k_meta(mode: usize, rows: usize, n: usize, k: usize) -> Result<Vec<u32>> {
    if k > n {
        return Err(GpuError::Call(format!("top-{k} of rows of {n}")));
    }
    kernel_meta::words(&[mode, rows, n, k], "top-k size")
}
