//! CUDA C (and HIP): the scalar functions of the pointwise table and the fused pointwise
//! kernel, `extern "C"` so its name is the entry point NVRTC and hiprtc look up.
//!
//! Parameters: the [`Meta`](super::Meta) words, then one pointer per input, then one per
//! output. Launch with [`POINTWISE_GROUP`] threads per block over a grid of
//! `ceil(n / POINTWISE_GROUP)` blocks, split over `x` and `y` when above 65535.

use super::rows::{self, RowSpelling};
use super::{POINTWISE_GROUP, ROWS_GROUP, Spelling, body_lines, decimal};
use crate::fusion::Instr;
use crate::fusion::RowInstr;
use crate::graph::NodeId;

/// Put in front of a kernel for hiprtc: HIP spells the CUDA built-ins the same way, and
/// hiprtc defines them without includes (`GPU.md`: including `hip_fp16.h` under hiprtc
/// fails), so only the `__restrict__`-style keywords need nothing more.
pub const HIP_PRELUDE: &str = "// HIP: built-ins provided by hiprtc\n";

/// The scalar functions, one per [`Pointwise`](crate::fusion::Pointwise) name, to the
/// formulas of `rtx_backends::cpu::scalar`.
pub const PRELUDE: &str = r#"
struct Rounding {
    unsigned int bias, shift, lsb, keep;
    float smallest_normal, overflow, grad_scale, grad_inv;
};

// Round to the nearest value of the type the pattern describes, ties to even (scalar.rs
// `round_with`): the same branch-free arithmetic, so GPU and CPU round to the same bits.
__device__ __forceinline__ float rtx_round(float x, Rounding p) {
    unsigned int bits = __float_as_uint(x);
    float a = fabsf(x);
    float normal = __uint_as_float((bits + p.bias + ((bits >> p.shift) & p.lsb)) & p.keep);
    float subnormal = __fmul_rn(__fsub_rn(__fadd_rn(__fmul_rn(a, 16777216.0f), 12582912.0f),
                                          12582912.0f), 5.9604645e-8f);
    float v = a < p.smallest_normal ? copysignf(subnormal, x) : normal;
    v = a >= p.overflow ? copysignf(__uint_as_float(0x7f800000u), x) : v;
    return x != x ? x : v;
}

__device__ __forceinline__ float rtx_identity(float x) { return x; }
__device__ __forceinline__ float rtx_autocast(float x, Rounding r) { return rtx_round(x, r); }
__device__ __forceinline__ float rtx_autocast_grad(float g, Rounding r) {
    return rtx_round(g * r.grad_scale, r) * r.grad_inv;
}
__device__ __forceinline__ float rtx_neg(float x) { return -x; }
__device__ __forceinline__ float rtx_relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
__device__ __forceinline__ float rtx_gelu(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678f));
}
__device__ __forceinline__ float rtx_gelu_grad(float x, float g) {
    float cdf = 0.5f * (1.0f + erff(x * 0.70710678f));
    float pdf = expf(-0.5f * x * x) * 0.3989423f;
    return g * (cdf + x * pdf);
}
// Eigen's rational tanh, as on the CPU.
__device__ __forceinline__ float rtx_tanh(float x0) {
    float x = fminf(fmaxf(x0, -7.905311f), 7.905311f);
    float x2 = x * x;
    float p = -2.7607685e-16f;
    p = p * x2 + 2.000188e-13f;
    p = p * x2 - 8.604672e-11f;
    p = p * x2 + 5.122297e-8f;
    p = p * x2 + 1.4857224e-5f;
    p = p * x2 + 6.3726193e-4f;
    p = p * x2 + 4.8935246e-3f;
    float q = 1.1982584e-6f;
    q = q * x2 + 1.1853471e-4f;
    q = q * x2 + 2.2684346e-3f;
    q = q * x2 + 4.893525e-3f;
    return x0 != x0 ? x0 : x * p / q;
}
__device__ __forceinline__ float rtx_gelu_tanh(float x) {
    float t = rtx_tanh(0.7978846f * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t);
}
__device__ __forceinline__ float rtx_gelu_tanh_grad(float x, float g) {
    float x2 = x * x;
    float t = rtx_tanh(0.7978846f * (x + 0.044715f * x2 * x));
    float slope = 0.7978846f * (1.0f + 3.0f * 0.044715f * x2);
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * slope);
}
__device__ __forceinline__ float rtx_sin(float x) { return sinf(x); }
__device__ __forceinline__ float rtx_cos(float x) { return cosf(x); }
__device__ __forceinline__ float rtx_exp(float x) { return expf(x); }
__device__ __forceinline__ float rtx_sigmoid(float x) {
    float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
__device__ __forceinline__ float rtx_log(float x) { return logf(x); }
__device__ __forceinline__ float rtx_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float rtx_pow(float x, float p) { return powf(x, p); }
__device__ __forceinline__ float rtx_pow_int(float x, float p, bool odd) { return powf(x, p); }
__device__ __forceinline__ float rtx_add(float a, float b) { return a + b; }
__device__ __forceinline__ float rtx_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float rtx_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float rtx_div(float a, float b) { return a / b; }
__device__ __forceinline__ float rtx_relu_grad(float x, float g) { return x > 0.0f ? g : 0.0f; }
__device__ __forceinline__ float rtx_maximum(float a, float b) { return (a >= b || a != a) ? a : b; }
__device__ __forceinline__ float rtx_minimum(float a, float b) { return (a <= b || a != a) ? a : b; }
__device__ __forceinline__ float rtx_gt(float a, float b) { return a > b ? 1.0f : 0.0f; }
__device__ __forceinline__ float rtx_ge(float a, float b) { return a >= b ? 1.0f : 0.0f; }
__device__ __forceinline__ float rtx_lt(float a, float b) { return a < b ? 1.0f : 0.0f; }
__device__ __forceinline__ float rtx_le(float a, float b) { return a <= b ? 1.0f : 0.0f; }
__device__ __forceinline__ float rtx_eq(float a, float b) { return a == b ? 1.0f : 0.0f; }
__device__ __forceinline__ float rtx_ne(float a, float b) { return a != b ? 1.0f : 0.0f; }
__device__ __forceinline__ float rtx_select(float c, float a, float b) { return c != 0.0f ? a : b; }
"#;

struct Cuda;

impl Spelling for Cuda {
    fn literal(&self, value: f32) -> String {
        match decimal(value) {
            Some(d) => format!("{d}f"),
            None => format!("__uint_as_float({:#010x}u)", value.to_bits()),
        }
    }

    fn bind(&self, name: &str, value: &str) -> String {
        format!("    const float {name} = {value};")
    }
}

/// The kernel of one fused pointwise group, named `name`.
pub fn fused(name: &str, inputs: usize, body: &[Instr], outputs: &[NodeId]) -> String {
    let s = Cuda;
    let mut k = String::from(PRELUDE);
    let params = parameters(inputs, outputs.len());
    k.push_str(&format!(
        "\nextern \"C\" __global__ void {name}({}) {{\n    \
         const unsigned int* __restrict__ params = RTX_META_WORDS;\n    \
         const unsigned int i = (blockIdx.y * gridDim.x + blockIdx.x) * {POINTWISE_GROUP}u + threadIdx.x;\n    \
         if (i >= params[0]) return;\n    \
         const unsigned int rank = params[1];\n",
        params
    ));
    k.push_str(&offsets(inputs, false));
    k.push_str(&rounding(inputs));
    for i in 0..inputs {
        k.push_str(&format!("    const float x{i} = in{i}[o{i}];\n"));
    }
    for line in body_lines(&s, body) {
        k.push_str(&line);
        k.push('\n');
    }
    for (o, &node) in outputs.iter().enumerate() {
        k.push_str(&format!("    out{o}[i] = {};\n", s.node(node)));
    }
    k.push_str("}\n");
    k
}

impl RowSpelling for Cuda {
    fn var(&self, name: &str, value: &str) -> String {
        format!("    float {name} = {value};\n")
    }

    fn row_loop(&self, body: &str) -> String {
        format!("    for (unsigned int j = 0u; j < cols; ++j) {{\n{body}    }}\n")
    }

    fn max_into(&self, acc: &str, v: &str) -> String {
        format!("        if ({v} > {acc} || ({v} != {v} && {acc} == {acc})) {acc} = {v};\n")
    }

    fn cols_f32(&self) -> String {
        "((float)cols)".to_string()
    }
}

/// The kernel of one row group, named `name` (see `emit::rows`); launch one thread per row,
/// [`ROWS_GROUP`] per block.
pub fn rows(
    name: &str,
    varies: &[bool],
    body: &[RowInstr],
    outputs: &[NodeId],
    wide_out: &[bool],
) -> String {
    let s = Cuda;
    let inputs = varies.len();
    let mut k = String::from(PRELUDE);
    let params = parameters(inputs, outputs.len());
    k.push_str(&format!(
        "\nextern \"C\" __global__ void {name}({}) {{\n    \
         const unsigned int* __restrict__ params = RTX_META_WORDS;\n    \
         const unsigned int r = (blockIdx.y * gridDim.x + blockIdx.x) * {ROWS_GROUP}u + threadIdx.x;\n    \
         const unsigned int rank = params[1];\n    \
         const unsigned int cols = params[1u + rank];\n    \
         if (cols == 0u || r >= params[0] / cols) return;\n",
        params
    ));
    k.push_str(&offsets(inputs, true));
    k.push_str(&rounding(inputs));
    for (i, &v) in varies.iter().enumerate() {
        if !v {
            k.push_str(&format!("    const float x{i} = in{i}[o{i}];\n"));
        }
    }
    let read = || {
        varies
            .iter()
            .enumerate()
            .filter(|(_, v)| **v)
            .map(|(i, _)| format!("        const float x{i} = in{i}[o{i} + j * st{i}];\n"))
            .collect::<String>()
    };
    let wide = |m: usize, v: &str| format!("        out{m}[r * cols + j] = {v};\n");
    let scalar = |m: usize, v: &str| format!("    out{m}[r] = {v};\n");
    k.push_str(&rows::body(
        &s, body, outputs, wide_out, &read, &wide, &scalar,
    ));
    k.push_str("}\n");
    k
}

/// The kernel's parameter list: meta words (by value: `RTX_META` of the runtime's launch ABI,
/// `rtx_backends::launch_abi`, which every CUDA and HIP compile puts in front), inputs,
/// outputs.
fn parameters(inputs: usize, outputs: usize) -> String {
    let mut params = vec!["RTX_META".to_string()];
    params.extend((0..inputs).map(|i| format!("const float* __restrict__ in{i}")));
    params.extend((0..outputs).map(|o| format!("float* __restrict__ out{o}")));
    params.join(", ")
}

/// Each input's offset at the thread's element (`rows == false`, counted by `i`) or at the
/// first column of its row (`rows`, counted by `r`, also reading the last axis's stride
/// `st{i}`): from its base word, adding coordinate times stride from the innermost axis out.
fn offsets(inputs: usize, rows: bool) -> String {
    let mut k = String::new();
    for i in 0..inputs {
        k.push_str(&format!(
            "    const unsigned int base{i} = 2u + rank + {i}u * (rank + 1u);\n    \
             unsigned int o{i} = params[base{i}];\n"
        ));
        if rows {
            k.push_str(&format!(
                "    const unsigned int st{i} = params[base{i} + rank];\n"
            ));
        }
    }
    if inputs > 0 {
        let (index, first) = if rows {
            ("r", "rank - 1u")
        } else {
            ("i", "rank")
        };
        k.push_str(&format!(
            "    unsigned int rest = {index};\n    for (unsigned int d = {first}; d > 0u; --d) {{\n"
        ));
        k.push_str("        const unsigned int size = params[1u + d];\n");
        k.push_str("        const unsigned int c = rest % size;\n        rest /= size;\n");
        for i in 0..inputs {
            k.push_str(&format!("        o{i} += c * params[base{i} + d];\n"));
        }
        k.push_str("    }\n");
    }
    k
}

fn rounding(inputs: usize) -> String {
    format!(
        "    const unsigned int rb = 2u + rank + {inputs}u * (rank + 1u);\n    \
         Rounding rounding;\n    \
         rounding.bias = params[rb]; rounding.shift = params[rb + 1u];\n    \
         rounding.lsb = params[rb + 2u]; rounding.keep = params[rb + 3u];\n    \
         rounding.smallest_normal = __uint_as_float(params[rb + 4u]);\n    \
         rounding.overflow = __uint_as_float(params[rb + 5u]);\n    \
         rounding.grad_scale = __uint_as_float(params[rb + 6u]);\n    \
         rounding.grad_inv = __uint_as_float(params[rb + 7u]);\n    \
         (void)rounding;\n"
    )
}
