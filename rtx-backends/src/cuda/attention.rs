//! Attention on the CUDA runtime: the forward pass and both halves of the backward pass, one
//! thread per query (or key) row with an online softmax, never a `Tq x Tk` matrix; the wgpu
//! backend's kernels (`wgpu/attention.rs`) in CUDA C over the same meta words
//! (`kernel_meta::AttentionShape::meta`), so both compute the same sums in the same order.
//! Tiled kernels (query blocks in shared memory, tensor cores) are the fast schedule, not
//! written yet.

use super::runtime::{Arg, CudaBuffer, CudaDevice, CudaKernel};
use super::{GpuError, Result};
use crate::kernel_meta::AttentionShape;

/// Threads per block.
pub const ATTENTION_BLOCK: u32 = 64;

/// The three kernels, one module. Meta: `[S, Tq, Tk, D, causal, scale bits, Dv]`.
pub const ATTENTION_SOURCE: &str = r#"
#define RTX_INDEX ((blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x)
#define RTX_MAX_HEAD 128

// out[s, i] = softmax_j(q_i . k_j * scale) v_j over contiguous q [S, Tq, D], k [S, Tk, D],
// v [S, Tk, Dv]: one thread per query row, an online softmax over the keys.
extern "C" __global__ void rtx_attention(RTX_META, const float* q, const float* k,
                                         const float* v, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int r = RTX_INDEX;
    const unsigned int tq = prm[1], tk = prm[2], d = prm[3], dv = prm[6];
    if (r >= prm[0] * tq) return;
    const unsigned int s = r / tq, i = r % tq;
    const float scale = __uint_as_float(prm[5]);
    const unsigned int last = prm[4] != 0u ? (i + 1u < tk ? i + 1u : tk) : tk;
    float acc[RTX_MAX_HEAD];
    for (unsigned int c = 0u; c < dv; ++c) acc[c] = 0.0f;
    float m = __uint_as_float(0xff800000u);
    float l = 0.0f;
    const unsigned int qo = r * d;
    for (unsigned int j = 0u; j < last; ++j) {
        const unsigned int ko = (s * tk + j) * d;
        float dot = 0.0f;
        for (unsigned int c = 0u; c < d; ++c) dot = fmaf(q[qo + c], k[ko + c], dot);
        const float score = dot * scale;
        const float m2 = fmaxf(m, score);
        const float corr = expf(m - m2);
        const float p = expf(score - m2);
        l = l * corr + p;
        const unsigned int vo = (s * tk + j) * dv;
        for (unsigned int c = 0u; c < dv; ++c) acc[c] = acc[c] * corr + p * v[vo + c];
        m = m2;
    }
    for (unsigned int c = 0u; c < dv; ++c) out[r * dv + c] = acc[c] / l;
}

// The backward pass's per-query half: each query row's softmax maximum and sum and
// D_i = sum_j p_ij (g_i . v_j) into stats [S * Tq, 3], dq into the first third of
// out [3, S, Tq, D].
extern "C" __global__ void rtx_attention_grad_q(RTX_META, const float* q,
                                                const float* k, const float* v, const float* g,
                                                float* stats, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int r = RTX_INDEX;
    const unsigned int tq = prm[1], tk = prm[2], d = prm[3];
    if (r >= prm[0] * tq) return;
    const unsigned int s = r / tq, i = r % tq;
    const float scale = __uint_as_float(prm[5]);
    const unsigned int last = prm[4] != 0u ? (i + 1u < tk ? i + 1u : tk) : tk;
    const unsigned int qo = r * d;
    float m = __uint_as_float(0xff800000u);
    float l = 0.0f;
    for (unsigned int j = 0u; j < last; ++j) {
        const unsigned int ko = (s * tk + j) * d;
        float dot = 0.0f;
        for (unsigned int c = 0u; c < d; ++c) dot = fmaf(q[qo + c], k[ko + c], dot);
        const float score = dot * scale;
        const float m2 = fmaxf(m, score);
        l = l * expf(m - m2) + expf(score - m2);
        m = m2;
    }
    float dsum = 0.0f;
    for (unsigned int j = 0u; j < last; ++j) {
        const unsigned int ko = (s * tk + j) * d;
        float dot = 0.0f, gv = 0.0f;
        for (unsigned int c = 0u; c < d; ++c) {
            dot = fmaf(q[qo + c], k[ko + c], dot);
            gv = fmaf(g[qo + c], v[ko + c], gv);
        }
        dsum = dsum + expf(dot * scale - m) / l * gv;
    }
    float dq[RTX_MAX_HEAD];
    for (unsigned int c = 0u; c < d; ++c) dq[c] = 0.0f;
    for (unsigned int j = 0u; j < last; ++j) {
        const unsigned int ko = (s * tk + j) * d;
        float dot = 0.0f, gv = 0.0f;
        for (unsigned int c = 0u; c < d; ++c) {
            dot = fmaf(q[qo + c], k[ko + c], dot);
            gv = fmaf(g[qo + c], v[ko + c], gv);
        }
        const float ds = expf(dot * scale - m) / l * (gv - dsum) * scale;
        for (unsigned int c = 0u; c < d; ++c) dq[c] = fmaf(ds, k[ko + c], dq[c]);
    }
    for (unsigned int c = 0u; c < d; ++c) out[qo + c] = dq[c];
    stats[r * 3u] = m;
    stats[r * 3u + 1u] = l;
    stats[r * 3u + 2u] = dsum;
}

// The per-key half: dk and dv of each key row from the query rows that see it, into the
// second and third thirds of out, from the statistics of rtx_attention_grad_q.
extern "C" __global__ void rtx_attention_grad_kv(RTX_META, const float* q,
                                                 const float* k, const float* v, const float* g,
                                                 const float* stats, float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int r = RTX_INDEX;
    const unsigned int tq = prm[1], tk = prm[2], d = prm[3];
    if (r >= prm[0] * tk) return;
    const unsigned int s = r / tk, j = r % tk;
    const float scale = __uint_as_float(prm[5]);
    const unsigned int first = prm[4] != 0u ? j : 0u;
    const unsigned int ko = r * d;
    float dk[RTX_MAX_HEAD], dv[RTX_MAX_HEAD];
    for (unsigned int c = 0u; c < d; ++c) { dk[c] = 0.0f; dv[c] = 0.0f; }
    for (unsigned int i = first; i < tq; ++i) {
        const unsigned int row = s * tq + i;
        const unsigned int qo = row * d;
        float dot = 0.0f, gv = 0.0f;
        for (unsigned int c = 0u; c < d; ++c) {
            dot = fmaf(q[qo + c], k[ko + c], dot);
            gv = fmaf(g[qo + c], v[ko + c], gv);
        }
        const float p = expf(dot * scale - stats[row * 3u]) / stats[row * 3u + 1u];
        const float ds = p * (gv - stats[row * 3u + 2u]) * scale;
        for (unsigned int c = 0u; c < d; ++c) {
            dv[c] = fmaf(p, g[qo + c], dv[c]);
            dk[c] = fmaf(ds, q[qo + c], dk[c]);
        }
    }
    const unsigned int third = prm[0] * tk * d;
    for (unsigned int c = 0u; c < d; ++c) {
        out[third + ko + c] = dk[c];
        out[2u * third + ko + c] = dv[c];
    }
}
"#;

fn kernel(entry: &'static str) -> CudaKernel<'static> {
    CudaKernel {
        name: entry,
        source: ATTENTION_SOURCE,
        entry,
    }
}

impl CudaDevice {
    /// `softmax(q k^T / sqrt(D)) v` over contiguous `q`, `k`, `v` into `out` (q's shape).
    pub fn attention(
        &self,
        shape: AttentionShape,
        [q, k, v]: [&CudaBuffer; 3],
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = shape.meta()?;
        self.run_kernel(
            &kernel("rtx_attention"),
            &meta,
            &[Arg::In(q), Arg::In(k), Arg::In(v), Arg::Out(out)],
            shape.slices * shape.queries,
            ATTENTION_BLOCK,
        )
    }

    /// The gradients of [`CudaDevice::attention`] for `q`, `k` and `v` (one shape), stacked
    /// in `out [3, ..]`, from the output gradient `g`.
    pub fn attention_grad(
        &self,
        shape: AttentionShape,
        [q, k, v, g]: [&CudaBuffer; 4],
        out: &CudaBuffer,
    ) -> Result<()> {
        let meta = shape.meta()?;
        if shape.queries != shape.keys || shape.value_head != shape.head {
            return Err(GpuError::Call(format!(
                "device attention gradients take q, k and v of one shape, found {shape:?}"
            )));
        }
        let rows = shape.slices * shape.queries;
        let stats = self.zeros(rows * 3)?;
        self.run_kernel(
            &kernel("rtx_attention_grad_q"),
            &meta,
            &[
                Arg::In(q),
                Arg::In(k),
                Arg::In(v),
                Arg::In(g),
                Arg::Out(&stats),
                Arg::Out(out),
            ],
            rows,
            ATTENTION_BLOCK,
        )?;
        self.run_kernel(
            &kernel("rtx_attention_grad_kv"),
            &meta,
            &[
                Arg::In(q),
                Arg::In(k),
                Arg::In(v),
                Arg::In(g),
                Arg::In(&stats),
                Arg::Out(out),
            ],
            rows,
            ATTENTION_BLOCK,
        )
    }
}
