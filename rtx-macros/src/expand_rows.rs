//! Row groups of the fused schedule (`rtx_ir::fusion::Step::Rows`): one closure per row of
//! a wide shape, whose passes over the row compute the group's wide values, reduce them
//! (`row_sum`, `row_max`), and write its wide and row-scalar outputs; run by
//! `rtx_core::fused::rows`. The operand and instruction spelling is shared with the
//! pointwise groups (`expand_schedule.rs`).

use crate::expand_kernels::{BodyKey, Kernels, Signature};
use crate::expand_schedule::{instr_with, operand, rounds};
use crate::expand_step_text::{StepText, list};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use rtx_ir::fusion::{Instr, Operand, RowInstr, RowReduce};
use rtx_ir::{GraphFn, NodeId};

/// An operand inside a row body: an input that varies along the row (`varies[i]`) is read
/// at column `__j` of its row slice `__wI` in a pass over the row (`wide`); a row scalar is
/// its one value, read into `__sI` before the passes.
fn row_operand(o: &Operand, wide: bool, varies: &[bool]) -> TokenStream {
    match o {
        Operand::Input(i) => {
            if !varies[*i] {
                let s = format_ident!("__s{}", i);
                quote!(#s)
            } else if wide {
                let w = format_ident!("__w{}", i);
                quote!(#w[__j])
            } else {
                let id = format_ident!("__i{}", i);
                quote!(#id.at(0))
            }
        }
        Operand::RowLen => quote!((__cols as f32)),
        other => operand(other),
    }
}

fn row_map(i: &Instr, wide: bool, varies: &[bool], plain: bool) -> TokenStream {
    instr_with(i, plain, |a| row_operand(a, wide, varies))
}

/// A row group: one closure per row. Row scalars are computed once; each reduction is one
/// pass over the row that recomputes the wide values before it (cheaper than storing them),
/// except that a wide output is written by the first pass that computes it and read back
/// by later passes (an exp computed once, not once per pass); a last pass writes the wide
/// outputs not written yet.
pub(crate) fn rows(
    kernels: &mut Kernels,
    ir: &GraphFn,
    shape_of: NodeId,
    inputs: &[NodeId],
    body: &[RowInstr],
    outputs: &[NodeId],
    w: &mut StepText,
) {
    let wide_shape = &ir.graph.node(shape_of).shape;
    let is_wide = |id: NodeId| &ir.graph.node(id).shape == wide_shape;
    // An input varies along the row unless its last axis is 1 (or it has none): broadcasting
    // aligns it with the row's axis otherwise.
    let varies: Vec<bool> = inputs
        .iter()
        .map(|&i| ir.graph.node(i).shape.last().is_some_and(|d| !d.is_one()))
        .collect();
    let out_wide: Vec<bool> = outputs.iter().map(|&o| is_wide(o)).collect();
    let signature = Signature::Rows {
        inputs: inputs.len(),
        outputs: outputs.len(),
    };
    let closure = kernels.closure_keyed(
        signature,
        BodyKey::rows(body, outputs, &varies, &out_wide),
        || {
            let rounding = row_closure(body, outputs, &varies, &out_wide, false);
            let any_rounding = body
                .iter()
                .any(|step| matches!(step, RowInstr::Map { instr, .. } if rounds(instr)));
            let plain = any_rounding.then(|| row_closure(body, outputs, &varies, &out_wide, true));
            (rounding, plain)
        },
    );
    let shape = w.shape(ir, shape_of);
    let (ins, outs) = (list(inputs), list(outputs));
    let (varies, out_wide) = (list(&varies), list(&out_wide));
    w.line(format!(
        "__s.rows([{ins}], [{outs}], {shape}, [{varies}], [{out_wide}], {closure});"
    ));
}

/// The closure of a row group (see [`rows`]): `varies[i]` tells whether input `i` varies
/// along the row, `out_wide[m]` whether output `m` is wide.
fn row_closure(
    body: &[RowInstr],
    outputs: &[NodeId],
    varies: &[bool],
    out_wide: &[bool],
    plain: bool,
) -> TokenStream {
    let n = varies.len();
    let is_wide = |id: NodeId| {
        outputs
            .iter()
            .position(|&o| o == id)
            .is_some_and(|m| out_wide[m])
    };
    let wide_output = |id: NodeId| {
        outputs
            .iter()
            .position(|&o| o == id)
            .filter(|_| is_wide(id))
    };
    let mut stmts = TokenStream::new();
    // The wide values in order, and which of them an earlier pass stored in an output.
    let mut wide_instrs: Vec<(NodeId, TokenStream)> = Vec::new();
    let mut stored: Vec<NodeId> = Vec::new();
    // The body of a pass over the row: each wide value computed, or read back where stored,
    // and (`store`) the wide outputs not stored yet written; returns the nodes it stored.
    let pass = |wide_instrs: &[(NodeId, TokenStream)], stored: &[NodeId], store: bool| {
        let mut body = TokenStream::new();
        let mut newly = Vec::new();
        for (node, compute) in wide_instrs {
            match wide_output(*node) {
                Some(m) if stored.contains(node) => {
                    let (t, dst) = (format_ident!("__t{}", node), format_ident!("__o{}", m));
                    body.extend(quote!(let #t: f32 = #dst[__j];));
                }
                Some(m) if store => {
                    let (t, dst) = (format_ident!("__t{}", node), format_ident!("__o{}", m));
                    body.extend(compute.clone());
                    body.extend(quote!(#dst[__j] = #t;));
                    newly.push(*node);
                }
                _ => body.extend(compute.clone()),
            }
        }
        (body, newly)
    };
    for step in body {
        match step {
            RowInstr::Map { instr, wide: true } => {
                wide_instrs.push((instr.node, row_map(instr, true, varies, plain)));
            }
            RowInstr::Map { instr, wide: false } => {
                stmts.extend(row_map(instr, false, varies, plain))
            }
            RowInstr::Reduce { node, op, arg } => {
                let t = format_ident!("__t{}", node);
                let arg = row_operand(arg, true, varies);
                let (wide_stmts, newly) = pass(&wide_instrs, &stored, true);
                stored.extend(newly);
                // The values reduced go to the scratch row in one plain loop (vectorized),
                // then one library call reduces them in the order the unfused kernels use.
                let reduced = match op {
                    RowReduce::Sum => quote!(::rtx_core::fused::row_sum(__red) as f32),
                    RowReduce::Mean => {
                        quote!((::rtx_core::fused::row_sum(__red) / __cols as f64) as f32)
                    }
                    RowReduce::Max => quote!(::rtx_core::fused::row_max(__red)),
                };
                stmts.extend(quote! {
                    let #t = {
                        let __red: &mut [f32] = &mut __scratch[..__cols];
                        for __j in 0..__cols {
                            #wide_stmts
                            __red[__j] = #arg;
                        }
                        #reduced
                    };
                });
            }
        }
    }
    let mut wide_writes = TokenStream::new();
    let mut scalar_writes = TokenStream::new();
    for (m, &o) in outputs.iter().enumerate() {
        let dst = format_ident!("__o{}", m);
        let t = format_ident!("__t{}", o);
        if !is_wide(o) {
            scalar_writes.extend(quote!(#dst[0] = #t;));
        } else if !stored.contains(&o) && !wide_instrs.iter().any(|(n, _)| *n == o) {
            // A wide output that is not a wide instruction here (an input passed through).
            wide_writes.extend(quote!(#dst[__j] = #t;));
        }
    }
    let unwritten = outputs.iter().any(|&o| is_wide(o) && !stored.contains(&o));
    if unwritten {
        let (wide_stmts, _) = pass(&wide_instrs, &stored, true);
        stmts.extend(quote! {
            for __j in 0..__cols {
                #wide_stmts
                #wide_writes
            }
        });
    }
    stmts.extend(scalar_writes);
    let m = outputs.len();
    let in_names = (0..n).map(|i| format_ident!("__i{}", i));
    let out_names = (0..m).map(|i| format_ident!("__o{}", i));
    // Slices of exactly `__cols` values, so the passes index them without bounds checks.
    let mut prelude = TokenStream::new();
    // Row scalars are read once, before the passes (a read inside them would be repeated
    // every element, as the passes' stores might alias it).
    for (i, &v) in varies.iter().enumerate() {
        let id = format_ident!("__i{}", i);
        if v {
            let w = format_ident!("__w{}", i);
            prelude.extend(quote!(let #w: &[f32] = &#id.row()[..__cols];));
        } else {
            let s = format_ident!("__s{}", i);
            prelude.extend(quote!(let #s: f32 = #id.at(0);));
        }
    }
    for (m, &w) in out_wide.iter().enumerate() {
        if w {
            let o = format_ident!("__o{}", m);
            prelude.extend(quote!(let #o: &mut [f32] = &mut #o[..__cols];));
        }
    }
    quote! {
        #[inline(always)]
        move |__in: &[::rtx_core::fused::RowIn<'_>; #n],
         __cols: usize,
         __out: &mut [&mut [f32]; #m],
         __scratch: &mut [f32]| {
            let [#(#in_names),*] = __in;
            let [#(#out_names),*] = __out;
            #prelude
            #stmts
        }
    }
}
