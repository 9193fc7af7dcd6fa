//! Row groups (`Step::Rows`) as GPU kernels: one thread per row of the wide shape `[.., N]`.
//! Row scalars are computed once; each reduction is a loop over the row that recomputes the
//! wide values before it (as on the CPU) and accumulates in f32; a last loop writes the wide
//! outputs. Inputs are read through the same [`Meta`](super::Meta) words as pointwise
//! kernels (shape = the wide shape); an input whose last axis is 1 (a row scalar) is read
//! once per row. Wide outputs are contiguous `[rows, N]`, row-scalar outputs `[rows]`.
//!
//! One thread per row is the simple, correct schedule (rows of the models are 10 to 512
//! wide); a workgroup per row with a shared-memory reduction is the fast one, still to come.

use super::Spelling;
use super::call;
use crate::fusion::{Operand, RowInstr, RowReduce};
use crate::graph::NodeId;

/// What differs between the targets in a row kernel's body.
pub(crate) trait RowSpelling: Spelling {
    /// A mutable f32 local.
    fn var(&self, name: &str, value: &str) -> String;
    /// `for j in 0..cols { body }`.
    fn row_loop(&self, body: &str) -> String;
    /// `acc = max(acc, v)`, NaN first, ties to the earliest.
    fn max_into(&self, acc: &str, v: &str) -> String;
    /// The row length as f32.
    fn cols_f32(&self) -> String;
}

fn operand(s: &dyn RowSpelling, a: &Operand) -> String {
    match *a {
        Operand::Input(i) => s.input(i),
        Operand::Node(n) => s.node(n),
        Operand::Const(c) => s.literal(c as f32),
        Operand::RowLen => s.cols_f32(),
    }
}

/// The body of a row kernel after its inputs' bases are known: `varies[i]` tells whether
/// input `i` changes along the row (read as `x{i}` inside loops, where the target's loop
/// header reads it), `wide_out[m]` whether output `m` is wide. Returns (statements,
/// wide output writes inside the last loop, scalar output writes).
pub(crate) fn body(
    s: &dyn RowSpelling,
    body: &[RowInstr],
    outputs: &[NodeId],
    wide_out: &[bool],
    read_varying: &dyn Fn() -> String,
    write_wide: &dyn Fn(usize, &str) -> String,
    write_scalar: &dyn Fn(usize, &str) -> String,
) -> String {
    let mut out = String::new();
    let mut wide = String::new();
    for step in body {
        match step {
            RowInstr::Map { instr, wide: w } => {
                let args: Vec<String> = instr.args.iter().map(|a| operand(s, a)).collect();
                let line = s.bind(&s.node(instr.node), &call(s, instr.op, &args));
                if *w {
                    wide.push_str(&line);
                    wide.push('\n');
                } else {
                    out.push_str(&line);
                    out.push('\n');
                }
            }
            RowInstr::Reduce { node, op, arg } => {
                let acc = format!("acc{node}");
                let init = match op {
                    RowReduce::Max => s.literal(f32::NEG_INFINITY),
                    _ => s.literal(0.0),
                };
                out.push_str(&s.var(&acc, &init));
                let v = operand(s, arg);
                let combine = match op {
                    RowReduce::Max => s.max_into(&acc, &v),
                    _ => format!("        {acc} = {acc} + {v};\n"),
                };
                out.push_str(&s.row_loop(&format!("{}{wide}{combine}", read_varying())));
                let value = match op {
                    RowReduce::Mean => format!("{acc} / {}", s.cols_f32()),
                    _ => acc.clone(),
                };
                out.push_str(&s.bind(&s.node(*node), &value));
                out.push('\n');
            }
        }
    }
    let mut writes = String::new();
    for (m, &o) in outputs.iter().enumerate() {
        if wide_out[m] {
            writes.push_str(&write_wide(m, &s.node(o)));
        }
    }
    if !writes.is_empty() {
        out.push_str(&s.row_loop(&format!("{}{wide}{writes}", read_varying())));
    }
    for (m, &o) in outputs.iter().enumerate() {
        if !wide_out[m] {
            out.push_str(&write_scalar(m, &s.node(o)));
        }
    }
    out
}
