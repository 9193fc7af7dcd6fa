//! A matmul and its epilogue group (`Step::MatMulEpilogue`) as one WGSL kernel: the tiled
//! shared-memory GEMM of the wgpu backend (64 x 64 tiles of C per workgroup, 4 x 4 per
//! thread, K in steps of 16) whose store runs the group's body on each finished value while
//! it is in a register, so `relu(x @ w + b)` writes its result once and never the product.
//!
//! Buffers: binding 0 the meta words, 1 and 2 the operands A and B, then the group's other
//! inputs (`inputs[1..]`; `inputs[0]` is the product, read from the accumulator), then the
//! outputs. The meta words are the group's [`Meta`](super::Meta) (its shape, every input's
//! offset and strides, input 0's included and unused, the rounding), followed by the GEMM's
//! twelve: `m, k, n, batches`, then per operand its offset and batch, row and column strides.
//! The group's element `e` is the product's element `e` (the same values in the same order,
//! possibly under a reshape), so each value's group coordinates come from its flat index.

use super::wgsl::{PRELUDE, offsets, rounding};
use super::{Spelling, body_lines};
use crate::fusion::Instr;
use crate::graph::NodeId;

/// Output tile edge of [`gemm_epilogue`]'s kernels.
pub const GEMM_TILE: u32 = 64;

/// The WGSL kernel of a matmul with the epilogue `body` over `inputs` group inputs (the
/// product first) writing `outputs`; entry point `main`.
pub fn gemm_epilogue(inputs: usize, body: &[Instr], outputs: &[NodeId]) -> String {
    let s = super::wgsl::Wgsl;
    let mut k = String::from(PRELUDE);
    k.push_str("\n@group(0) @binding(0) var<storage, read> params: array<u32>;\n");
    k.push_str("@group(0) @binding(1) var<storage, read> a: array<f32>;\n");
    k.push_str("@group(0) @binding(2) var<storage, read> b: array<f32>;\n");
    for i in 1..inputs {
        k.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> in{i}: array<f32>;\n",
            2 + i
        ));
    }
    for o in 0..outputs.len() {
        k.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> out{o}: array<f32>;\n",
            2 + inputs + o
        ));
    }
    // The epilogue of one value: its group coordinates from the flat index, the body, the
    // stores. `in0` is never read: the product is `acc`.
    k.push_str("\nfn epilogue(i: u32, acc: f32) {\n    let rank = params[1];\n");
    k.push_str(&offsets(inputs, false));
    k.push_str(&rounding(inputs));
    k.push_str("    let x0 = acc;\n");
    for i in 1..inputs {
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
    k.push_str(&format!(
        r#"
var<workgroup> ta: array<f32, 1024>;
var<workgroup> tb: array<f32, 1024>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
    let rank = params[1];
    let g = 2u + rank + {inputs}u * (rank + 1u) + 8u;
    let m = params[g]; let k = params[g + 1u]; let n = params[g + 2u];
    let batch = wg.z;
    let a0 = params[g + 4u] + batch * params[g + 5u];
    let ars = params[g + 6u]; let acs = params[g + 7u];
    let b0 = params[g + 8u] + batch * params[g + 9u];
    let brs = params[g + 10u]; let bcs = params[g + 11u];
    let row0 = wg.y * {GEMM_TILE}u; let col0 = wg.x * {GEMM_TILE}u;
    let t = lid.y * 16u + lid.x;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) {{ acc[i] = 0.0; }}
    for (var k0 = 0u; k0 < k; k0 = k0 + 16u) {{
        for (var l = 0u; l < 4u; l = l + 1u) {{
            let e = t + l * 256u;
            let r = row0 + e % 64u; let kk = k0 + e / 64u;
            var va = 0.0;
            if (r < m && kk < k) {{ va = a[a0 + r * ars + kk * acs]; }}
            ta[e] = va;
            let cc = col0 + e % 64u;
            var vb = 0.0;
            if (cc < n && kk < k) {{ vb = b[b0 + kk * brs + cc * bcs]; }}
            tb[e] = vb;
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {{
            var ra: array<f32, 4>;
            var rb: array<f32, 4>;
            for (var i = 0u; i < 4u; i = i + 1u) {{
                ra[i] = ta[kk * 64u + lid.y * 4u + i];
                rb[i] = tb[kk * 64u + lid.x * 4u + i];
            }}
            for (var i = 0u; i < 4u; i = i + 1u) {{
                for (var j = 0u; j < 4u; j = j + 1u) {{
                    acc[i * 4u + j] = fma(ra[i], rb[j], acc[i * 4u + j]);
                }}
            }}
        }}
        workgroupBarrier();
    }}
    let c0 = batch * m * n;
    for (var i = 0u; i < 4u; i = i + 1u) {{
        let r = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j = j + 1u) {{
            let cc = col0 + lid.x * 4u + j;
            if (r < m && cc < n) {{ epilogue(c0 + r * n + cc, acc[i * 4u + j]); }}
        }}
    }}
}}
"#
    ));
    k
}
