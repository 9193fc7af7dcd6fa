//! Convolution and pooling on the CUDA runtime over contiguous NCHW tensors, one thread per
//! output value: the wgpu backend's kernels (`wgpu/window.rs`) in CUDA C over the same meta
//! words (`kernel_meta::conv2d`, `kernel_meta::pool2d`), to the CPU's rules (padding as -inf
//! for max pooling, the first maximum wins with NaN first, `count_include_pad`). An implicit
//! GEMM on the tensor cores is the fast schedule, not written yet.

use super::runtime::{Arg, CudaBuffer, CudaDevice, CudaKernel};
use super::{GpuError, Result};
use crate::kernel_meta::{self, ConvPass, ConvShape, PoolPass};

/// Threads per block.
pub const WINDOW_BLOCK: u32 = 256;

/// Both kernels, one module.
pub const WINDOW_SOURCE: &str = r#"
#define RTX_INDEX ((blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x)

// Mode 0: y from x (a) and w (b); 1: the input gradient from g (a) and w (b); 2: the weight
// gradient from x (a) and g (b). Each output sums its taps in order.
extern "C" __global__ void rtx_conv2d(RTX_META, const float* a, const float* b,
                                      float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int e = RTX_INDEX;
    const unsigned int mode = prm[0], n_ = prm[1], c_ = prm[2], h = prm[3], w = prm[4];
    const unsigned int o_ = prm[5], kh_ = prm[6], kw_ = prm[7], oh_ = prm[8], ow_ = prm[9];
    const int sh = (int)prm[10], sw = (int)prm[11], ph = (int)prm[12], pw = (int)prm[13];
    float acc = 0.0f;
    if (mode == 0u) {
        if (e >= n_ * o_ * oh_ * ow_) return;
        const unsigned int ow = e % ow_, oh = (e / ow_) % oh_, o = (e / (ow_ * oh_)) % o_;
        const unsigned int n = e / (ow_ * oh_ * o_);
        for (unsigned int c = 0u; c < c_; ++c) {
            for (unsigned int kh = 0u; kh < kh_; ++kh) {
                const int ih = (int)oh * sh + (int)kh - ph;
                if (ih < 0 || ih >= (int)h) continue;
                for (unsigned int kw = 0u; kw < kw_; ++kw) {
                    const int iw = (int)ow * sw + (int)kw - pw;
                    if (iw < 0 || iw >= (int)w) continue;
                    acc = fmaf(a[((n * c_ + c) * h + (unsigned int)ih) * w + (unsigned int)iw],
                               b[((o * c_ + c) * kh_ + kh) * kw_ + kw], acc);
                }
            }
        }
    } else if (mode == 1u) {
        if (e >= n_ * c_ * h * w) return;
        const unsigned int iw = e % w, ih = (e / w) % h, c = (e / (w * h)) % c_;
        const unsigned int n = e / (w * h * c_);
        for (unsigned int o = 0u; o < o_; ++o) {
            for (unsigned int kh = 0u; kh < kh_; ++kh) {
                const int th = (int)ih + ph - (int)kh;
                if (th < 0 || th % sh != 0 || th / sh >= (int)oh_) continue;
                for (unsigned int kw = 0u; kw < kw_; ++kw) {
                    const int tw = (int)iw + pw - (int)kw;
                    if (tw < 0 || tw % sw != 0 || tw / sw >= (int)ow_) continue;
                    acc = fmaf(a[((n * o_ + o) * oh_ + (unsigned int)(th / sh)) * ow_ + (unsigned int)(tw / sw)],
                               b[((o * c_ + c) * kh_ + kh) * kw_ + kw], acc);
                }
            }
        }
    } else {
        if (e >= o_ * c_ * kh_ * kw_) return;
        const unsigned int kw = e % kw_, kh = (e / kw_) % kh_, c = (e / (kw_ * kh_)) % c_;
        const unsigned int o = e / (kw_ * kh_ * c_);
        for (unsigned int n = 0u; n < n_; ++n) {
            for (unsigned int oh = 0u; oh < oh_; ++oh) {
                const int ih = (int)oh * sh + (int)kh - ph;
                if (ih < 0 || ih >= (int)h) continue;
                for (unsigned int ow = 0u; ow < ow_; ++ow) {
                    const int iw = (int)ow * sw + (int)kw - pw;
                    if (iw < 0 || iw >= (int)w) continue;
                    acc = fmaf(a[((n * c_ + c) * h + (unsigned int)ih) * w + (unsigned int)iw],
                               b[((n * o_ + o) * oh_ + oh) * ow_ + ow], acc);
                }
            }
        }
    }
    out[e] = acc;
}

// The first maximum of window (oh, ow) of `plane` (row-major, a NaN first), or (-1, -1)
// when the window holds only padding.
__device__ __forceinline__ void rtx_window_first_max(const unsigned int* prm, const float* a,
                                                     unsigned int plane, int oh, int ow,
                                                     int* at_h, int* at_w) {
    const int h = (int)prm[3], w = (int)prm[4], kh_ = (int)prm[5], kw_ = (int)prm[6];
    const int top = oh * (int)prm[9] - (int)prm[11];
    const int left = ow * (int)prm[10] - (int)prm[12];
    float best = __uint_as_float(0xff800000u);
    *at_h = -1;
    *at_w = -1;
    for (int kh = 0; kh < kh_; ++kh) {
        const int ih = top + kh;
        if (ih < 0 || ih >= h) continue;
        for (int kw = 0; kw < kw_; ++kw) {
            const int iw = left + kw;
            if (iw < 0 || iw >= w) continue;
            const float v = a[plane * (unsigned int)(h * w) + (unsigned int)(ih * w + iw)];
            const bool best_nan = best != best;
            if (!best_nan && (v != v || v > best || *at_h < 0)) { best = v; *at_h = ih; *at_w = iw; }
        }
    }
}

// Mode 0 max, 1 average, 2 max gradient (a = x, b = g), 3 average gradient (a = g).
extern "C" __global__ void rtx_pool2d(RTX_META, const float* a, const float* b,
                                      float* out) {
    const unsigned int* prm = RTX_META_WORDS;
    const unsigned int e = RTX_INDEX;
    const unsigned int mode = prm[0], planes = prm[1] * prm[2];
    const int h = (int)prm[3], w = (int)prm[4], kh_ = (int)prm[5], kw_ = (int)prm[6];
    const int oh_ = (int)prm[7], ow_ = (int)prm[8];
    const int sh = (int)prm[9], sw = (int)prm[10], ph = (int)prm[11], pw = (int)prm[12];
    const float taps = (float)(kh_ * kw_);
    if (mode < 2u) {
        if (e >= planes * (unsigned int)(oh_ * ow_)) return;
        const unsigned int plane = e / (unsigned int)(oh_ * ow_);
        const int oh = (int)(e / (unsigned int)ow_) % oh_, ow = (int)e % ow_;
        if (mode == 0u) {
            int at_h, at_w;
            rtx_window_first_max(prm, a, plane, oh, ow, &at_h, &at_w);
            out[e] = at_h >= 0 ? a[plane * (unsigned int)(h * w) + (unsigned int)(at_h * w + at_w)]
                               : __uint_as_float(0xff800000u);
            return;
        }
        float sum = 0.0f;
        for (int kh = 0; kh < kh_; ++kh) {
            const int ih = oh * sh - ph + kh;
            if (ih < 0 || ih >= h) continue;
            for (int kw = 0; kw < kw_; ++kw) {
                const int iw = ow * sw - pw + kw;
                if (iw < 0 || iw >= w) continue;
                sum = sum + a[plane * (unsigned int)(h * w) + (unsigned int)(ih * w + iw)];
            }
        }
        out[e] = sum / taps;
        return;
    }
    if (e >= planes * (unsigned int)(h * w)) return;
    const unsigned int plane = e / (unsigned int)(h * w);
    const int ih = (int)(e / (unsigned int)w) % h, iw = (int)e % w;
    float acc = 0.0f;
    for (int oh = 0; oh < oh_; ++oh) {
        const int top = oh * sh - ph;
        if (ih < top || ih >= top + kh_) continue;
        for (int ow = 0; ow < ow_; ++ow) {
            const int left = ow * sw - pw;
            if (iw < left || iw >= left + kw_) continue;
            const unsigned int gi = plane * (unsigned int)(oh_ * ow_) + (unsigned int)(oh * ow_ + ow);
            if (mode == 3u) {
                acc = acc + a[gi] / taps;
            } else {
                int at_h, at_w;
                rtx_window_first_max(prm, a, plane, oh, ow, &at_h, &at_w);
                if (at_h == ih && at_w == iw) acc = acc + b[gi];
            }
        }
    }
    out[e] = acc;
}
"#;

fn kernel(entry: &'static str) -> CudaKernel<'static> {
    CudaKernel {
        name: entry,
        source: WINDOW_SOURCE,
        entry,
    }
}

impl CudaDevice {
    /// One pass of a convolution over contiguous operands `a` and `b` (see [`ConvPass`])
    /// into the contiguous `out`.
    pub fn conv2d(
        &self,
        pass: ConvPass,
        shape: ConvShape,
        a: &CudaBuffer,
        b: &CudaBuffer,
        out: &CudaBuffer,
    ) -> Result<()> {
        let (meta, outputs) = kernel_meta::conv2d(pass, shape)?;
        if out.len() < outputs {
            return Err(GpuError::Call(format!(
                "conv2d of {shape:?} into {} values",
                out.len()
            )));
        }
        self.run_kernel(
            &kernel("rtx_conv2d"),
            &meta,
            &[Arg::In(a), Arg::In(b), Arg::Out(out)],
            outputs,
            WINDOW_BLOCK,
        )
    }

    /// One pooling pass over contiguous operands (`x` `[N, C, H, W]`; `b` is read by
    /// `MaxGrad` only).
    #[allow(clippy::too_many_arguments)]
    pub fn pool2d(
        &self,
        pass: PoolPass,
        x_shape: [usize; 4],
        window: ([usize; 2], [usize; 2], [usize; 2]),
        out_hw: [usize; 2],
        a: &CudaBuffer,
        b: &CudaBuffer,
        out: &CudaBuffer,
    ) -> Result<()> {
        let (meta, outputs) = kernel_meta::pool2d(pass, x_shape, window, out_hw)?;
        if out.len() < outputs {
            return Err(GpuError::Call(format!(
                "pool2d of {x_shape:?} into {} values",
                out.len()
            )));
        }
        self.run_kernel(
            &kernel("rtx_pool2d"),
            &meta,
            &[Arg::In(a), Arg::In(b), Arg::Out(out)],
            outputs,
            WINDOW_BLOCK,
        )
    }
}
