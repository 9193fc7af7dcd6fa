//! Convolution and pooling on the wgpu backend, over contiguous NCHW tensors, one thread per
//! output value (direct loops over the taps; a tiled implicit GEMM is the faster schedule).

use super::{GpuBuffer, WgpuDevice, grid};
use crate::gpu_error::{GpuError, Result};
use crate::kernel_meta;
pub use crate::kernel_meta::{ConvPass, ConvShape, PoolPass};

/// The three passes of a 2-D convolution over contiguous NCHW tensors, one thread per output
/// value summing its taps directly (mode 0: `y` from `x` and `w`; 1: the input gradient from
/// `g` and `w`; 2: the weight gradient from `x` and `g`). Meta: `[mode, N, C, H, W, O, KH,
/// KW, OH, OW, stride_h, stride_w, pad_h, pad_w]` (`kernel_meta::conv2d`).
const CONV2D: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = gid.x + gid.y * groups.x * 256u;
    let mode = prm[0];
    let n_ = prm[1]; let c_ = prm[2]; let h = prm[3]; let w = prm[4]; let o_ = prm[5];
    let kh_ = prm[6]; let kw_ = prm[7]; let oh_ = prm[8]; let ow_ = prm[9];
    let sh = i32(prm[10]); let sw = i32(prm[11]); let ph = i32(prm[12]); let pw = i32(prm[13]);
    var acc = 0.0;
    if (mode == 0u) {
        if (e >= n_ * o_ * oh_ * ow_) { return; }
        let ow = e % ow_; let oh = (e / ow_) % oh_; let o = (e / (ow_ * oh_)) % o_; let n = e / (ow_ * oh_ * o_);
        for (var c = 0u; c < c_; c = c + 1u) {
            for (var kh = 0u; kh < kh_; kh = kh + 1u) {
                let ih = i32(oh) * sh + i32(kh) - ph;
                if (ih < 0 || ih >= i32(h)) { continue; }
                for (var kw = 0u; kw < kw_; kw = kw + 1u) {
                    let iw = i32(ow) * sw + i32(kw) - pw;
                    if (iw < 0 || iw >= i32(w)) { continue; }
                    acc = fma(a[((n * c_ + c) * h + u32(ih)) * w + u32(iw)],
                              b[((o * c_ + c) * kh_ + kh) * kw_ + kw], acc);
                }
            }
        }
    } else if (mode == 1u) {
        if (e >= n_ * c_ * h * w) { return; }
        let iw = e % w; let ih = (e / w) % h; let c = (e / (w * h)) % c_; let n = e / (w * h * c_);
        for (var o = 0u; o < o_; o = o + 1u) {
            for (var kh = 0u; kh < kh_; kh = kh + 1u) {
                let th = i32(ih) + ph - i32(kh);
                if (th < 0 || th % sh != 0 || th / sh >= i32(oh_)) { continue; }
                for (var kw = 0u; kw < kw_; kw = kw + 1u) {
                    let tw = i32(iw) + pw - i32(kw);
                    if (tw < 0 || tw % sw != 0 || tw / sw >= i32(ow_)) { continue; }
                    acc = fma(a[((n * o_ + o) * oh_ + u32(th / sh)) * ow_ + u32(tw / sw)],
                              b[((o * c_ + c) * kh_ + kh) * kw_ + kw], acc);
                }
            }
        }
    } else {
        if (e >= o_ * c_ * kh_ * kw_) { return; }
        let kw = e % kw_; let kh = (e / kw_) % kh_; let c = (e / (kw_ * kh_)) % c_; let o = e / (kw_ * kh_ * c_);
        for (var n = 0u; n < n_; n = n + 1u) {
            for (var oh = 0u; oh < oh_; oh = oh + 1u) {
                let ih = i32(oh) * sh + i32(kh) - ph;
                if (ih < 0 || ih >= i32(h)) { continue; }
                for (var ow = 0u; ow < ow_; ow = ow + 1u) {
                    let iw = i32(ow) * sw + i32(kw) - pw;
                    if (iw < 0 || iw >= i32(w)) { continue; }
                    acc = fma(a[((n * c_ + c) * h + u32(ih)) * w + u32(iw)],
                              b[((n * o_ + o) * oh_ + oh) * ow_ + ow], acc);
                }
            }
        }
    }
    out[e] = acc;
}
"#;

impl WgpuDevice {
    /// One pass of a convolution over contiguous operands `a` and `b` (see [`ConvPass`]) into
    /// the contiguous `out`.
    pub fn conv2d(
        &self,
        pass: ConvPass,
        s: ConvShape,
        a: &GpuBuffer,
        b: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<()> {
        let (meta, outputs) = kernel_meta::conv2d(pass, s)?;
        if outputs == 0 {
            return Ok(());
        }
        if out.len() < outputs {
            return Err(GpuError::Call(format!(
                "conv2d of {s:?} into {} values",
                out.len()
            )));
        }
        let groups = grid(
            outputs,
            256,
            self.limits.max_compute_workgroups_per_dimension,
        )?;
        self.run("rtx_conv2d", CONV2D, &meta, &[a, b, out], groups)
    }
}

/// 2-D max and average pooling and their gradients over contiguous NCHW tensors, as the CPU
/// computes them: max pooling reads padding as -inf and a window holding a NaN gives NaN; its
/// gradient goes to each window's first maximum (row-major, a NaN first); average pooling
/// divides by the whole window (`count_include_pad`). Gradients run one thread per input
/// value over the windows that hold it, in window order. Meta: `[mode, N, C, H, W, KH, KW,
/// OH, OW, stride_h, stride_w, pad_h, pad_w]`, mode 0 max, 1 average, 2 max gradient (a = x,
/// b = g), 3 average gradient (a = g).
const POOL2D: &str = r#"
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn window_first_max(plane: u32, oh: u32, ow: u32) -> vec2<i32> {
    let h = i32(prm[3]); let w = i32(prm[4]);
    let kh_ = i32(prm[5]); let kw_ = i32(prm[6]);
    let top = i32(oh) * i32(prm[9]) - i32(prm[11]);
    let left = i32(ow) * i32(prm[10]) - i32(prm[12]);
    var best = bitcast<f32>(0xff800000u);
    var at = vec2<i32>(-1, -1);
    for (var kh = 0; kh < kh_; kh = kh + 1) {
        let ih = top + kh;
        if (ih < 0 || ih >= h) { continue; }
        for (var kw = 0; kw < kw_; kw = kw + 1) {
            let iw = left + kw;
            if (iw < 0 || iw >= w) { continue; }
            let v = a[plane * u32(h * w) + u32(ih * w + iw)];
            let best_nan = best != best;
            if (!best_nan && (v != v || v > best || at.x < 0)) { best = v; at = vec2<i32>(ih, iw); }
        }
    }
    return at;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = gid.x + gid.y * groups.x * 256u;
    let mode = prm[0];
    let planes = prm[1] * prm[2];
    let h = i32(prm[3]); let w = i32(prm[4]); let kh_ = i32(prm[5]); let kw_ = i32(prm[6]);
    let oh_ = i32(prm[7]); let ow_ = i32(prm[8]);
    let sh = i32(prm[9]); let sw = i32(prm[10]); let ph = i32(prm[11]); let pw = i32(prm[12]);
    let taps = f32(kh_ * kw_);
    if (mode < 2u) {
        if (e >= planes * u32(oh_ * ow_)) { return; }
        let plane = e / u32(oh_ * ow_);
        let oh = i32(e / u32(ow_)) % oh_; let ow = i32(e) % ow_;
        if (mode == 0u) {
            let at = window_first_max(plane, u32(oh), u32(ow));
            var v = bitcast<f32>(0xff800000u);
            if (at.x >= 0) { v = a[plane * u32(h * w) + u32(at.x * w + at.y)]; }
            out[e] = v;
            return;
        }
        var sum = 0.0;
        for (var kh = 0; kh < kh_; kh = kh + 1) {
            let ih = oh * sh - ph + kh;
            if (ih < 0 || ih >= h) { continue; }
            for (var kw = 0; kw < kw_; kw = kw + 1) {
                let iw = ow * sw - pw + kw;
                if (iw < 0 || iw >= w) { continue; }
                sum = sum + a[plane * u32(h * w) + u32(ih * w + iw)];
            }
        }
        out[e] = sum / taps;
        return;
    }
    if (e >= planes * u32(h * w)) { return; }
    let plane = e / u32(h * w);
    let ih = i32(e / u32(w)) % h; let iw = i32(e) % w;
    var acc = 0.0;
    for (var oh = 0; oh < oh_; oh = oh + 1) {
        let top = oh * sh - ph;
        if (ih < top || ih >= top + kh_) { continue; }
        for (var ow = 0; ow < ow_; ow = ow + 1) {
            let left = ow * sw - pw;
            if (iw < left || iw >= left + kw_) { continue; }
            let gi = plane * u32(oh_ * ow_) + u32(oh * ow_ + ow);
            if (mode == 3u) {
                acc = acc + a[gi] / taps;
            } else {
                let at = window_first_max(plane, u32(oh), u32(ow));
                if (at.x == ih && at.y == iw) { acc = acc + b[gi]; }
            }
        }
    }
    out[e] = acc;
}
"#;

impl WgpuDevice {
    /// One pooling pass over contiguous operands: `x` is `[N, C, H, W]`, `kernel`, `stride`
    /// and `padding` PyTorch's, `out_hw` the output plane; `b` is read by `MaxGrad` only.
    #[allow(clippy::too_many_arguments)]
    pub fn pool2d(
        &self,
        pass: PoolPass,
        x_shape: [usize; 4],
        (kernel, stride, padding): ([usize; 2], [usize; 2], [usize; 2]),
        out_hw: [usize; 2],
        a: &GpuBuffer,
        b: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<()> {
        let (meta, outputs) =
            kernel_meta::pool2d(pass, x_shape, (kernel, stride, padding), out_hw)?;
        if outputs == 0 {
            return Ok(());
        }
        if out.len() < outputs {
            return Err(GpuError::Call(format!(
                "pool2d of {x_shape:?} with stride {stride:?} into {} values",
                out.len()
            )));
        }
        let groups = grid(
            outputs,
            256,
            self.limits.max_compute_workgroups_per_dimension,
        )?;
        self.run("rtx_pool2d", POOL2D, &meta, &[a, b, out], groups)
    }
}
