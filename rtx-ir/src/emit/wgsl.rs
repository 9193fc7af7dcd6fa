//! WGSL: the scalar functions of the pointwise table and the fused pointwise kernel.
//!
//! Buffers: binding 0 holds the [`Meta`](super::Meta) words, then one read-only binding per
//! input, then one read-write binding per output, all in group 0.

use super::rows::{self, RowSpelling};
use super::{POINTWISE_GROUP, ROWS_GROUP, Spelling, body_lines, decimal};
use crate::fusion::Instr;
use crate::fusion::RowInstr;
use crate::graph::NodeId;

/// The scalar functions, one per [`Pointwise`](crate::fusion::Pointwise) name, to the
/// formulas of `rtx_backends::cpu::scalar`. WGSL has no `erf`: [`rtx_erf`] is Numerical
/// Recipes' `erfc` (relative error below 1.2e-7). NaN checks are `x != x`.
pub const PRELUDE: &str = r#"
struct Rounding {
    bias: u32, shift: u32, lsb: u32, keep: u32,
    smallest_normal: f32, overflow: f32, grad_scale: f32, grad_inv: f32,
}

fn rtx_copysign(m: f32, s: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(m) & 0x7fffffffu) | (bitcast<u32>(s) & 0x80000000u));
}

// Round to the nearest value of the type the pattern describes, ties to even (scalar.rs
// `round_with`): the same branch-free arithmetic, so GPU and CPU round to the same bits.
fn rtx_round(x: f32, p: Rounding) -> f32 {
    let bits = bitcast<u32>(x);
    let a = abs(x);
    let normal = bitcast<f32>((bits + p.bias + ((bits >> p.shift) & p.lsb)) & p.keep);
    let subnormal = (((a * 16777216.0) + 12582912.0) - 12582912.0) * 5.9604645e-8;
    var v = select(normal, rtx_copysign(subnormal, x), a < p.smallest_normal);
    v = select(v, rtx_copysign(bitcast<f32>(0x7f800000u), x), a >= p.overflow);
    return select(v, x, x != x);
}

fn rtx_identity(x: f32) -> f32 { return x; }
fn rtx_autocast(x: f32, r: Rounding) -> f32 { return rtx_round(x, r); }
fn rtx_autocast_grad(g: f32, r: Rounding) -> f32 {
    return rtx_round(g * r.grad_scale, r) * r.grad_inv;
}
fn rtx_neg(x: f32) -> f32 { return -x; }
fn rtx_relu(x: f32) -> f32 { return select(0.0, x, x > 0.0 || x != x); }

fn rtx_erf(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * exp(-z * z + p);
    return select(erfc - 1.0, 1.0 - erfc, x >= 0.0);
}
fn rtx_gelu(x: f32) -> f32 { return 0.5 * x * (1.0 + rtx_erf(x * 0.70710678)); }
fn rtx_gelu_grad(x: f32, g: f32) -> f32 {
    let cdf = 0.5 * (1.0 + rtx_erf(x * 0.70710678));
    let pdf = exp(-0.5 * x * x) * 0.3989423;
    return g * (cdf + x * pdf);
}

// Eigen's rational tanh, as on the CPU.
fn rtx_tanh(x0: f32) -> f32 {
    let x = clamp(x0, -7.905311, 7.905311);
    let x2 = x * x;
    var p = -2.7607685e-16;
    p = p * x2 + 2.000188e-13;
    p = p * x2 - 8.604672e-11;
    p = p * x2 + 5.122297e-8;
    p = p * x2 + 1.4857224e-5;
    p = p * x2 + 6.3726193e-4;
    p = p * x2 + 4.8935246e-3;
    var q = 1.1982584e-6;
    q = q * x2 + 1.1853471e-4;
    q = q * x2 + 2.2684346e-3;
    q = q * x2 + 4.893525e-3;
    return select(x * p / q, x0, x0 != x0);
}
fn rtx_gelu_tanh(x: f32) -> f32 {
    let t = rtx_tanh(0.7978846 * (x + 0.044715 * x * x * x));
    return 0.5 * x * (1.0 + t);
}
fn rtx_gelu_tanh_grad(x: f32, g: f32) -> f32 {
    let x2 = x * x;
    let t = rtx_tanh(0.7978846 * (x + 0.044715 * x2 * x));
    let slope = 0.7978846 * (1.0 + 3.0 * 0.044715 * x2);
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope);
}
fn rtx_sin(x: f32) -> f32 { return sin(x); }
fn rtx_cos(x: f32) -> f32 { return cos(x); }
fn rtx_exp(x: f32) -> f32 { return exp(x); }
fn rtx_sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}
fn rtx_log(x: f32) -> f32 { return log(x); }
fn rtx_sqrt(x: f32) -> f32 { return sqrt(x); }
fn rtx_pow(x: f32, p: f32) -> f32 { return pow(x, p); }
fn rtx_pow_int(x: f32, p: f32, odd: bool) -> f32 {
    let r = pow(abs(x), p);
    return select(r, -r, odd && x < 0.0);
}
fn rtx_add(a: f32, b: f32) -> f32 { return a + b; }
fn rtx_sub(a: f32, b: f32) -> f32 { return a - b; }
fn rtx_mul(a: f32, b: f32) -> f32 { return a * b; }
fn rtx_div(a: f32, b: f32) -> f32 { return a / b; }
fn rtx_relu_grad(x: f32, g: f32) -> f32 { return select(0.0, g, x > 0.0); }
fn rtx_maximum(a: f32, b: f32) -> f32 { return select(b, a, a >= b || a != a); }
fn rtx_minimum(a: f32, b: f32) -> f32 { return select(b, a, a <= b || a != a); }
fn rtx_gt(a: f32, b: f32) -> f32 { return select(0.0, 1.0, a > b); }
fn rtx_ge(a: f32, b: f32) -> f32 { return select(0.0, 1.0, a >= b); }
fn rtx_lt(a: f32, b: f32) -> f32 { return select(0.0, 1.0, a < b); }
fn rtx_le(a: f32, b: f32) -> f32 { return select(0.0, 1.0, a <= b); }
fn rtx_eq(a: f32, b: f32) -> f32 { return select(0.0, 1.0, a == b); }
fn rtx_ne(a: f32, b: f32) -> f32 { return select(0.0, 1.0, a != b); }
fn rtx_select(c: f32, a: f32, b: f32) -> f32 { return select(b, a, c != 0.0); }
"#;

pub(crate) struct Wgsl;

impl Spelling for Wgsl {
    fn literal(&self, value: f32) -> String {
        match decimal(value) {
            Some(d) => format!("f32({d})"),
            None => format!("bitcast<f32>({:#010x}u)", value.to_bits()),
        }
    }

    fn bind(&self, name: &str, value: &str) -> String {
        format!("    let {name} = {value};")
    }
}

/// The kernel of one fused pointwise group (entry point `main`).
pub fn fused(inputs: usize, body: &[Instr], outputs: &[NodeId]) -> String {
    let s = Wgsl;
    let mut k = String::from(PRELUDE);
    k.push_str(&bindings(inputs, outputs.len()));
    k.push_str(&format!(
        "\n@compute @workgroup_size({POINTWISE_GROUP})\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>,\n        \
         @builtin(num_workgroups) groups: vec3<u32>) {{\n    \
         let i = gid.x + gid.y * groups.x * {POINTWISE_GROUP}u;\n    \
         if (i >= params[0]) {{ return; }}\n    \
         let rank = params[1];\n"
    ));
    k.push_str(&offsets(inputs, false));
    k.push_str(&rounding(inputs));
    for i in 0..inputs {
        k.push_str(&format!("    let x{i} = in{i}[o{i}];\n"));
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

impl RowSpelling for Wgsl {
    fn var(&self, name: &str, value: &str) -> String {
        format!("    var {name}: f32 = {value};\n")
    }

    fn row_loop(&self, body: &str) -> String {
        format!("    for (var j = 0u; j < cols; j = j + 1u) {{\n{body}    }}\n")
    }

    fn max_into(&self, acc: &str, v: &str) -> String {
        format!(
            "        {acc} = select({acc}, {v}, {v} > {acc} || ({v} != {v} && {acc} == {acc}));\n"
        )
    }

    fn cols_f32(&self) -> String {
        "f32(cols)".to_string()
    }
}

/// The kernel of one row group (entry point `main`; see `emit::rows`).
pub fn rows(varies: &[bool], body: &[RowInstr], outputs: &[NodeId], wide_out: &[bool]) -> String {
    let s = Wgsl;
    let inputs = varies.len();
    let mut k = String::from(PRELUDE);
    k.push_str(&bindings(inputs, outputs.len()));
    k.push_str(&format!(
        "\n@compute @workgroup_size({ROWS_GROUP})\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>,\n        \
         @builtin(num_workgroups) groups: vec3<u32>) {{\n    \
         let r = gid.x + gid.y * groups.x * {ROWS_GROUP}u;\n    \
         let rank = params[1];\n    \
         let cols = params[1u + rank];\n    \
         if (cols == 0u || r >= params[0] / cols) {{ return; }}\n"
    ));
    k.push_str(&offsets(inputs, true));
    k.push_str(&rounding(inputs));
    for (i, &v) in varies.iter().enumerate() {
        if !v {
            k.push_str(&format!("    let x{i} = in{i}[o{i}];\n"));
        }
    }
    let read = || {
        varies
            .iter()
            .enumerate()
            .filter(|(_, v)| **v)
            .map(|(i, _)| format!("        let x{i} = in{i}[o{i} + j * st{i}];\n"))
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

/// Each input's offset at the thread's element (`rows == false`, counted by `i`) or at the
/// first column of its row (`rows`, counted by `r`, also reading the last axis's stride
/// `st{i}`): from its base word, adding coordinate times stride from the innermost axis out.
pub(crate) fn offsets(inputs: usize, rows: bool) -> String {
    let mut k = String::new();
    for i in 0..inputs {
        k.push_str(&format!(
            "    let base{i} = 2u + rank + {i}u * (rank + 1u);\n    var o{i} = params[base{i}];\n"
        ));
        if rows {
            k.push_str(&format!("    let st{i} = params[base{i} + rank];\n"));
        }
    }
    if inputs > 0 {
        let (index, first) = if rows {
            ("r", "rank - 1u")
        } else {
            ("i", "rank")
        };
        k.push_str(&format!(
            "    var rest = {index};\n    for (var d = {first}; d > 0u; d = d - 1u) {{\n"
        ));
        k.push_str("        let size = params[1u + d];\n");
        k.push_str("        let c = rest % size;\n        rest = rest / size;\n");
        for i in 0..inputs {
            k.push_str(&format!("        o{i} = o{i} + c * params[base{i} + d];\n"));
        }
        k.push_str("    }\n");
    }
    k
}

fn bindings(inputs: usize, outputs: usize) -> String {
    let mut k = String::from("\n@group(0) @binding(0) var<storage, read> params: array<u32>;\n");
    for i in 0..inputs {
        k.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> in{i}: array<f32>;\n",
            1 + i
        ));
    }
    for o in 0..outputs {
        k.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> out{o}: array<f32>;\n",
            1 + inputs + o
        ));
    }
    k
}

pub(crate) fn rounding(inputs: usize) -> String {
    format!(
        "    let rb = 2u + rank + {inputs}u * (rank + 1u);\n    \
         let rounding = Rounding(params[rb], params[rb + 1u], params[rb + 2u], params[rb + 3u],\n        \
         bitcast<f32>(params[rb + 4u]), bitcast<f32>(params[rb + 5u]),\n        \
         bitcast<f32>(params[rb + 6u]), bitcast<f32>(params[rb + 7u]));\n"
    )
}
