//! The checks of emitted kernels shared by every GPU target: each distinct fused pointwise
//! and row-group kernel of every model, and each prelude function, run on a device on fresh
//! random inputs and compared element by element with the CPU's scalar functions (at f32
//! within 1e-4 relative, 1e-7 absolute near zero; the rounding groups bit for bit; row sums
//! against f64 sums, within 1e-4 relative plus 1e-5 of the output's largest magnitude).
//! `wgpu_kernels.rs` runs them on the wgpu adapter, `cuda_runtime.rs` on a CUDA GPU.

use std::collections::{HashMap, HashSet};

use models::cnn::Cnn;
use models::gpt::Gpt;
use models::mlp::Mlp;
use rtx_backends::cpu::scalar::{self, Rounding};
use rtx_core::ir::emit::{Meta, POINTWISE_GROUP, ROWS_GROUP, Target, fused_kernel, kernel, passes};
use rtx_core::ir::fusion::{Instr, Operand, Pointwise, RowInstr, RowReduce, Step, rounding_only};
use rtx_core::ir::{Cmp, Graph, ModelIr, NodeId};

/// The five checks as `#[test]`s of the file that invokes it, each taking its device from
/// `$device(test_name) -> Option<D>` (which prints why it skipped when it gives `None`).
macro_rules! kernel_check_tests {
    ($device:ident) => {
        #[test]
        fn every_fused_kernel_of_every_model_matches_the_cpu_at_f32() {
            let test = "every_fused_kernel_of_every_model_matches_the_cpu_at_f32";
            let Some(d) = $device(test) else { return };
            kernel_checks::fused_kernels_match(&d, test, Rounding::NONE, false);
        }

        #[test]
        fn every_rounding_kernel_of_every_model_rounds_to_bf16_and_f16_bit_for_bit() {
            let test = "every_rounding_kernel_of_every_model_rounds_to_bf16_and_f16_bit_for_bit";
            let Some(d) = $device(test) else { return };
            for to in [HalfType::Bf16, HalfType::F16] {
                kernel_checks::fused_kernels_match(&d, test, Rounding::new(to, 1024.0), true);
            }
        }

        #[test]
        fn every_pointwise_function_of_the_prelude_matches_the_cpu() {
            let test = "every_pointwise_function_of_the_prelude_matches_the_cpu";
            let Some(d) = $device(test) else { return };
            kernel_checks::prelude_functions_match(&d);
        }

        #[test]
        fn every_row_group_kernel_of_every_model_matches_the_cpu_at_f32() {
            let test = "every_row_group_kernel_of_every_model_matches_the_cpu_at_f32";
            let Some(d) = $device(test) else { return };
            kernel_checks::row_kernels_match(&d, test);
        }

        #[test]
        fn a_pointwise_kernel_reads_a_transposed_input_at_an_offset_through_its_strides() {
            let test =
                "a_pointwise_kernel_reads_a_transposed_input_at_an_offset_through_its_strides";
            let Some(d) = $device(test) else { return };
            kernel_checks::transposed_input_is_read_through_its_strides(&d);
        }
    };
}

/// A device that runs emitted kernels (parameters: meta words, inputs, outputs).
pub trait KernelDevice {
    type Buffer;
    /// The language of the kernels it runs.
    const TARGET: Target;
    fn describe(&self) -> String;
    fn upload(&self, values: &[f32]) -> Result<Self::Buffer, String>;
    fn zeros(&self, len: usize) -> Result<Self::Buffer, String>;
    fn read(&self, buffer: &Self::Buffer) -> Result<Vec<f32>, String>;
    /// Runs kernel `entry` of `source` over `threads` threads, `group` per workgroup.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        name: &str,
        source: &str,
        entry: &str,
        meta: &[u32],
        inputs: &[&Self::Buffer],
        outputs: &mut [Self::Buffer],
        threads: usize,
        group: u32,
    ) -> Result<(), String>;
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }
}

/// The CPU meaning of one instruction, by the same scalar functions the compiled CPU code calls.
fn eval(op: Pointwise, a: &[f32], r: Rounding) -> f32 {
    match op {
        Pointwise::Identity => a[0],
        Pointwise::Autocast => scalar::autocast(a[0], r),
        Pointwise::AutocastGrad => scalar::autocast_grad(a[0], r),
        Pointwise::Neg => scalar::neg(a[0]),
        Pointwise::Relu => scalar::relu(a[0]),
        Pointwise::Gelu => scalar::gelu(a[0]),
        Pointwise::GeluTanh => scalar::gelu_tanh(a[0]),
        Pointwise::Tanh => scalar::tanh(a[0]),
        Pointwise::Sin => scalar::sin(a[0]),
        Pointwise::Cos => scalar::cos(a[0]),
        Pointwise::Sigmoid => scalar::sigmoid(a[0]),
        Pointwise::Exp => scalar::exp(a[0]),
        Pointwise::Log => scalar::log(a[0]),
        Pointwise::Sqrt => scalar::sqrt(a[0]),
        Pointwise::Pow(p) => scalar::pow(a[0], p as f32),
        Pointwise::Add => scalar::add(a[0], a[1]),
        Pointwise::Sub => scalar::sub(a[0], a[1]),
        Pointwise::Mul => scalar::mul(a[0], a[1]),
        Pointwise::Div => scalar::div(a[0], a[1]),
        Pointwise::ReluGrad => scalar::relu_grad(a[0], a[1]),
        Pointwise::GeluGrad => scalar::gelu_grad(a[0], a[1]),
        Pointwise::GeluTanhGrad => scalar::gelu_tanh_grad(a[0], a[1]),
        Pointwise::Maximum => scalar::maximum(a[0], a[1]),
        Pointwise::Minimum => scalar::minimum(a[0], a[1]),
        Pointwise::Compare(c) => match c {
            Cmp::Gt => scalar::gt(a[0], a[1]),
            Cmp::Ge => scalar::ge(a[0], a[1]),
            Cmp::Lt => scalar::lt(a[0], a[1]),
            Cmp::Le => scalar::le(a[0], a[1]),
            Cmp::Eq => scalar::eq(a[0], a[1]),
            Cmp::Ne => scalar::ne(a[0], a[1]),
        },
        Pointwise::Select => scalar::select(a[0], a[1], a[2]),
    }
}

/// Row-major strides of `shape` broadcast (numpy rules, aligned right) to `to`.
fn broadcast_strides(shape: &[usize], to: &[usize]) -> Vec<u32> {
    let mut strides = vec![0u32; to.len()];
    let mut step = 1usize;
    for (k, &d) in shape.iter().enumerate().rev() {
        let axis = to.len() - (shape.len() - k);
        strides[axis] = if d == 1 && to[axis] != 1 {
            0
        } else {
            step as u32
        };
        step *= d;
    }
    strides
}

fn dims(graph: &Graph, node: NodeId, env: &HashMap<String, i64>) -> Vec<usize> {
    graph
        .node(node)
        .shape
        .iter()
        .map(|d| d.eval(env).unwrap() as usize)
        .collect()
}

struct Group<'a> {
    inputs: &'a [NodeId],
    body: &'a [Instr],
    outputs: &'a [NodeId],
}

/// Runs one group on the device and on the CPU; returns the worst error, or a message.
#[allow(clippy::too_many_arguments)]
fn check_group<D: KernelDevice>(
    d: &D,
    name: &str,
    step: &Step,
    input_shapes: &[Vec<usize>],
    shape: &[usize],
    g: &Group,
    rounding: Rounding,
    rng: &mut Rng,
) -> Result<f32, String> {
    let k = fused_kernel(step, name, D::TARGET).unwrap();
    let n: usize = shape.iter().product();
    let mut host = Vec::new();
    let mut meta_inputs = Vec::new();
    let mut buffers = Vec::new();
    for s in input_shapes {
        let values: Vec<f32> = (0..s.iter().product::<usize>())
            .map(|_| rng.next())
            .collect();
        let strides = broadcast_strides(s, shape);
        buffers.push(d.upload(&values)?);
        meta_inputs.push((0u32, strides.clone()));
        host.push((values, strides));
    }
    let mut outs = Vec::new();
    for _ in 0..g.outputs.len() {
        outs.push(d.zeros(n)?);
    }
    let shape32: Vec<u32> = shape.iter().map(|&v| v as u32).collect();
    let meta = Meta::words(&shape32, &meta_inputs, rounding.words());
    let ins: Vec<_> = buffers.iter().collect();
    d.run(
        name,
        &k.source,
        &k.entry,
        &meta,
        &ins,
        &mut outs,
        n,
        POINTWISE_GROUP,
    )?;
    let mut got = Vec::new();
    for o in &outs {
        got.push(d.read(o)?);
    }
    let exact = rounding_only(g.body, g.inputs, g.outputs);
    let mut worst = 0f32;
    let mut values: HashMap<NodeId, f32> = HashMap::new();
    #[allow(clippy::needless_range_loop)] // `e` indexes every output and the coordinates
    for e in 0..n {
        let mut rest = e;
        let mut offsets = vec![0usize; host.len()];
        for axis in (0..shape.len()).rev() {
            let c = rest % shape[axis];
            rest /= shape[axis];
            for (o, (_, strides)) in offsets.iter_mut().zip(&host) {
                *o += c * strides[axis] as usize;
            }
        }
        values.clear();
        for ins in g.body {
            let args: Vec<f32> = ins
                .args
                .iter()
                .map(|a| match *a {
                    Operand::Input(i) => host[i].0[offsets[i]],
                    Operand::Node(m) => values[&m],
                    Operand::Const(c) => c as f32,
                    Operand::RowLen => unreachable!("row operand in a pointwise group"),
                })
                .collect();
            values.insert(ins.node, eval(ins.op, &args, rounding));
        }
        for (o, node) in g.outputs.iter().enumerate() {
            let (want, have) = (values[node], got[o][e]);
            if want.is_nan() && have.is_nan() {
                continue;
            }
            let err = (want - have).abs() / (1e-3 + want.abs());
            let bad = if exact {
                want.to_bits() != have.to_bits()
            } else {
                err.is_nan() || err > 1e-4
            };
            if bad {
                return Err(format!(
                    "{name}: element {e} of output {o}: cpu {want:e}, gpu {have:e}"
                ));
            }
            worst = worst.max(err);
        }
    }
    Ok(worst)
}

fn models() -> Vec<ModelIr> {
    vec![
        Mlp::graph().unwrap(),
        Cnn::graph().unwrap(),
        Gpt::graph().unwrap(),
    ]
}

/// Every distinct fused pointwise kernel of the three models (those that only round, or the
/// others), run on `d` with every symbolic size 3 and compared with the CPU.
pub fn fused_kernels_match<D: KernelDevice>(
    d: &D,
    test: &str,
    rounding: Rounding,
    only_rounding: bool,
) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut seen, mut failures, mut worst, mut ran) = (HashSet::new(), Vec::new(), 0f32, 0);
    for ir in models() {
        for f in &ir.functions {
            // Every symbolic dimension (`B`, `T`) bound to a small odd size.
            let env: HashMap<String, i64> = f.symbols.iter().map(|s| (s.clone(), 3)).collect();
            for (pass, steps) in passes(f) {
                for (i, step) in steps.iter().enumerate() {
                    let Step::Fused {
                        shape_of,
                        inputs,
                        body,
                        outputs,
                    } = step
                    else {
                        continue;
                    };
                    if only_rounding != rounding_only(body, inputs, outputs) {
                        continue;
                    }
                    let name = format!("{}_{}_{pass}_{i}", ir.model, f.name);
                    let k = fused_kernel(step, &name, D::TARGET).unwrap();
                    if !seen.insert(k.source) {
                        continue;
                    }
                    let shape = dims(&f.graph, *shape_of, &env);
                    let g = Group {
                        inputs,
                        body,
                        outputs,
                    };
                    let input_shapes: Vec<_> =
                        inputs.iter().map(|&i| dims(&f.graph, i, &env)).collect();
                    match check_group(
                        d,
                        &name,
                        step,
                        &input_shapes,
                        &shape,
                        &g,
                        rounding,
                        &mut rng,
                    ) {
                        Ok(w) => worst = worst.max(w),
                        Err(e) => failures.push(e),
                    }
                    ran += 1;
                }
            }
        }
    }
    eprintln!(
        "{test}: {ran} distinct kernels on {}, worst relative error {worst:e}",
        d.describe()
    );
    assert!(ran > 0);
    assert!(
        failures.is_empty(),
        "{} of {ran} kernels differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Each function of the target's prelude as a one-instruction kernel over `[37, 29]`, its
/// second input broadcast along rows, against the CPU.
pub fn prelude_functions_match<D: KernelDevice>(d: &D) {
    let mut ops = vec![
        Pointwise::Identity,
        Pointwise::Neg,
        Pointwise::Relu,
        Pointwise::Gelu,
        Pointwise::GeluTanh,
        Pointwise::Tanh,
        Pointwise::Sin,
        Pointwise::Cos,
        Pointwise::Sigmoid,
        Pointwise::Exp,
        Pointwise::Log,
        Pointwise::Sqrt,
        Pointwise::Pow(2.0),
        Pointwise::Pow(3.0),
        Pointwise::Pow(0.5),
        Pointwise::Pow(-1.5),
        Pointwise::Add,
        Pointwise::Sub,
        Pointwise::Mul,
        Pointwise::Div,
        Pointwise::ReluGrad,
        Pointwise::GeluGrad,
        Pointwise::GeluTanhGrad,
        Pointwise::Maximum,
        Pointwise::Minimum,
        Pointwise::Select,
    ];
    ops.extend([Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le, Cmp::Eq, Cmp::Ne].map(Pointwise::Compare));
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut failures = Vec::new();
    for op in ops {
        let arity = match op {
            Pointwise::Select => 3,
            Pointwise::Add
            | Pointwise::Sub
            | Pointwise::Mul
            | Pointwise::Div
            | Pointwise::ReluGrad
            | Pointwise::GeluGrad
            | Pointwise::GeluTanhGrad
            | Pointwise::Maximum
            | Pointwise::Minimum
            | Pointwise::Compare(_) => 2,
            _ => 1,
        };
        // Inputs 0..arity; the result is node 100. The second input broadcasts along rows.
        let inputs: Vec<NodeId> = (0..arity).collect();
        let body = vec![Instr {
            node: 100,
            op,
            args: (0..arity).map(Operand::Input).collect(),
        }];
        let outputs = vec![100];
        let step = Step::Fused {
            shape_of: 100,
            inputs: inputs.clone(),
            body: body.clone(),
            outputs: outputs.clone(),
        };
        let shape = vec![37, 29];
        let input_shapes: Vec<Vec<usize>> = (0..arity)
            .map(|i| if i == 1 { vec![1, 29] } else { shape.clone() })
            .collect();
        let g = Group {
            inputs: &inputs,
            body: &body,
            outputs: &outputs,
        };
        let name = format!("pointwise_{}", op.name());
        match check_group(
            d,
            &name,
            &step,
            &input_shapes,
            &shape,
            &g,
            Rounding::NONE,
            &mut rng,
        ) {
            Ok(w) => eprintln!("{name}: worst relative error {w:e}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One row group's CPU meaning, row by row: wide values per column, reductions in f64 (as
/// `cpu::reduce::row_sum`), row scalars once.
#[allow(clippy::too_many_arguments)]
fn rows_on_cpu(
    body: &[RowInstr],
    outputs: &[NodeId],
    wide_out: &[bool],
    host: &[(Vec<f32>, Vec<u32>)],
    varies: &[bool],
    shape: &[usize],
) -> Vec<Vec<f32>> {
    let cols = *shape.last().unwrap();
    let rows = shape.iter().product::<usize>() / cols.max(1);
    let mut out: Vec<Vec<f32>> = wide_out
        .iter()
        .map(|&w| vec![0.0; if w { rows * cols } else { rows }])
        .collect();
    for r in 0..rows {
        // Each input's offset of this row's first column.
        let mut base = vec![0usize; host.len()];
        let mut rest = r;
        for axis in (0..shape.len() - 1).rev() {
            let c = rest % shape[axis];
            rest /= shape[axis];
            for (b, (_, st)) in base.iter_mut().zip(host) {
                *b += c * st[axis] as usize;
            }
        }
        let last = shape.len() - 1;
        let mut scalars: HashMap<NodeId, f32> = HashMap::new();
        let mut wide: Vec<HashMap<NodeId, f32>> = vec![HashMap::new(); cols];
        let value = |a: &Operand,
                     j: usize,
                     scalars: &HashMap<NodeId, f32>,
                     wide: &[HashMap<NodeId, f32>]| match *a {
            Operand::Input(i) if varies[i] => host[i].0[base[i] + j * host[i].1[last] as usize],
            Operand::Input(i) => host[i].0[base[i]],
            Operand::Node(n) => wide[j].get(&n).copied().unwrap_or_else(|| scalars[&n]),
            Operand::Const(c) => c as f32,
            Operand::RowLen => cols as f32,
        };
        for step in body {
            match step {
                RowInstr::Map { instr, wide: true } => {
                    for j in 0..cols {
                        let args: Vec<f32> = instr
                            .args
                            .iter()
                            .map(|a| value(a, j, &scalars, &wide))
                            .collect();
                        let v = eval(instr.op, &args, Rounding::NONE);
                        wide[j].insert(instr.node, v);
                    }
                }
                RowInstr::Map { instr, wide: false } => {
                    let args: Vec<f32> = instr
                        .args
                        .iter()
                        .map(|a| value(a, 0, &scalars, &wide))
                        .collect();
                    scalars.insert(instr.node, eval(instr.op, &args, Rounding::NONE));
                }
                RowInstr::Reduce { node, op, arg } => {
                    let vals: Vec<f32> =
                        (0..cols).map(|j| value(arg, j, &scalars, &wide)).collect();
                    let v = match op {
                        RowReduce::Sum => vals.iter().map(|&v| v as f64).sum::<f64>() as f32,
                        RowReduce::Mean => {
                            (vals.iter().map(|&v| v as f64).sum::<f64>() / cols as f64) as f32
                        }
                        RowReduce::Max => vals.iter().fold(f32::NEG_INFINITY, |acc, &v| {
                            if v > acc || (v.is_nan() && !acc.is_nan()) {
                                v
                            } else {
                                acc
                            }
                        }),
                    };
                    scalars.insert(*node, v);
                }
            }
        }
        for (m, &o) in outputs.iter().enumerate() {
            if wide_out[m] {
                for j in 0..cols {
                    out[m][r * cols + j] = wide[j].get(&o).copied().unwrap_or_else(|| scalars[&o]);
                }
            } else {
                out[m][r] = scalars[&o];
            }
        }
    }
    out
}

/// Every distinct row-group kernel of the three models, run on `d` and compared with a CPU
/// evaluation of the row body.
pub fn row_kernels_match<D: KernelDevice>(d: &D, test: &str) {
    let mut rng = Rng(0x0bad_5eed_1234_5678);
    let (mut seen, mut failures, mut ran, mut worst) = (HashSet::new(), Vec::new(), 0, 0f32);
    for ir in models() {
        for f in &ir.functions {
            let env: HashMap<String, i64> = f.symbols.iter().map(|s| (s.clone(), 3)).collect();
            for (pass, steps) in passes(f) {
                for (i, step) in steps.iter().enumerate() {
                    let Step::Rows {
                        shape_of,
                        inputs,
                        body,
                        outputs,
                    } = step
                    else {
                        continue;
                    };
                    let name = format!("{}_{}_{pass}_{i}", ir.model, f.name);
                    let k = kernel(&f.graph, step, &name, D::TARGET).unwrap();
                    if !seen.insert(k.source.clone()) {
                        continue;
                    }
                    ran += 1;
                    let shape = dims(&f.graph, *shape_of, &env);
                    let n: usize = shape.iter().product();
                    let cols = *shape.last().unwrap();
                    let mut host = Vec::new();
                    let mut buffers = Vec::new();
                    for &inp in inputs.iter() {
                        let s = dims(&f.graph, inp, &env);
                        let values: Vec<f32> = (0..s.iter().product::<usize>())
                            .map(|_| rng.next())
                            .collect();
                        buffers.push(d.upload(&values).unwrap());
                        host.push((values, broadcast_strides(&s, &shape)));
                    }
                    let varies: Vec<bool> = inputs
                        .iter()
                        .map(|&i| dims(&f.graph, i, &env).last().is_some_and(|&v| v != 1))
                        .collect();
                    let wide_out: Vec<bool> = outputs
                        .iter()
                        .map(|&o| dims(&f.graph, o, &env) == shape)
                        .collect();
                    let mut outs: Vec<_> = wide_out
                        .iter()
                        .map(|&w| d.zeros(if w { n } else { n / cols }).unwrap())
                        .collect();
                    let shape32: Vec<u32> = shape.iter().map(|&v| v as u32).collect();
                    let meta_inputs: Vec<(u32, Vec<u32>)> =
                        host.iter().map(|(_, s)| (0, s.clone())).collect();
                    let meta = Meta::words(&shape32, &meta_inputs, Rounding::NONE.words());
                    let ins: Vec<_> = buffers.iter().collect();
                    let threads = n / cols;
                    if let Err(e) = d.run(
                        &name, &k.source, &k.entry, &meta, &ins, &mut outs, threads, ROWS_GROUP,
                    ) {
                        failures.push(format!("{name}: {e}"));
                        continue;
                    }
                    let want = rows_on_cpu(body, outputs, &wide_out, &host, &varies, &shape);
                    'outs: for (m, o) in outs.iter().enumerate() {
                        let got = d.read(o).unwrap();
                        // A reduction sums in f32 on the GPU and in f64 here, and a value
                        // that cancels (x - mean) keeps that sum's absolute error: allow
                        // 1e-4 relative plus 1e-5 of the output's largest magnitude.
                        let scale = want[m]
                            .iter()
                            .filter(|v| v.is_finite())
                            .fold(0f32, |a, v| a.max(v.abs()));
                        for (e, (&w, &g)) in want[m].iter().zip(&got).enumerate() {
                            if w.is_nan() && g.is_nan() {
                                continue;
                            }
                            let err = (w - g).abs() / (1e-4 * w.abs() + 1e-5 * scale + 1e-30);
                            if err.is_nan() || err > 1.0 {
                                failures.push(format!(
                                    "{name}: output {m} element {e}: cpu {w:e}, gpu {g:e}"
                                ));
                                break 'outs;
                            }
                            worst = worst.max(err);
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{test}: {ran} distinct row kernels on {}, worst error {worst:.3} of the tolerance",
        d.describe()
    );
    assert!(ran > 0);
    assert!(
        failures.is_empty(),
        "{} of {ran} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `out[i][j] = a[j][i] + b[j]`: an input read transposed from an offset through its meta
/// strides, and a broadcast row, give exactly the CPU's sums.
pub fn transposed_input_is_read_through_its_strides<D: KernelDevice>(d: &D) {
    // out[i][j] = a[j][i] + b[j] for a [29, 37] buffer read from element 5 on, as its
    // transpose [37, 29], and b a broadcast [29] row.
    let (rows, cols, offset) = (37usize, 29usize, 5usize);
    let mut rng = Rng(0x5151_7e57_0ff5_e7a1);
    let a: Vec<f32> = (0..offset + rows * cols).map(|_| rng.next()).collect();
    let b: Vec<f32> = (0..cols).map(|_| rng.next()).collect();
    let body = vec![Instr {
        node: 2,
        op: Pointwise::Add,
        args: vec![Operand::Input(0), Operand::Input(1)],
    }];
    let step = Step::Fused {
        shape_of: 2,
        inputs: vec![0, 1],
        body,
        outputs: vec![2],
    };
    let k = fused_kernel(&step, "transposed_add", D::TARGET).unwrap();
    let meta = Meta::words(
        &[rows as u32, cols as u32],
        &[(offset as u32, vec![1, rows as u32]), (0, vec![0, 1])],
        Rounding::NONE.words(),
    );
    let (ba, bb) = (d.upload(&a).unwrap(), d.upload(&b).unwrap());
    let mut outs = vec![d.zeros(rows * cols).unwrap()];
    d.run(
        &k.name,
        &k.source,
        &k.entry,
        &meta,
        &[&ba, &bb],
        &mut outs,
        rows * cols,
        POINTWISE_GROUP,
    )
    .unwrap();
    let got = d.read(&outs[0]).unwrap();
    for i in 0..rows {
        for j in 0..cols {
            assert_eq!(
                got[i * cols + j],
                a[offset + j * rows + i] + b[j],
                "element ({i}, {j})"
            );
        }
    }
}
