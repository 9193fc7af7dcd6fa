//! The body of a generated graph function: the kernel schedule of its nodes.
//!
//! Two schedules are emitted from one IR. The fused one follows `rtx_ir::fusion::plan`: each
//! pointwise group becomes a closure, specialized to its ops and constants, run by
//! `rtx_core::fused::fused` in one pass; every other node is one kernel call. The unfused one
//! is one call of `Slots::unfused`, which runs one kernel per node of the embedded IR, and is
//! what `RTX_FUSION=0` selects, so the two can be compared.
//! Neither runs a shape rule: the macro ran them at compile time, and the generated code
//! checks inputs and parameters once on entry. Output shapes are computed from the IR's
//! dimensions with the run-time values of the symbols.

// Pointwise groups, epilogues and the schedule itself live here; row groups, whose bodies
// are passes over a row rather than one expression per element, in `expand_rows.rs`.

use crate::expand_kernels::{BodyKey, Kernels, Signature};
use crate::expand_rows::rows;
use crate::expand_step_text::{StepText, list};
use crate::internals::ast::GraphFnDef;
use crate::internals::lower::ParamRef;
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};
use rtx_ir::fusion::{Instr, Operand, Pointwise, Step, plan, rounding_only};
use rtx_ir::{Atom, Dim, GraphFn, NodeId, Op};

/// `Dim` as a run-time `usize` expression over bound symbols (`__d_B`) and const generics.
/// `self.enc.__rtx_field_fc().weight` for the parameter at `["enc", "fc", "weight"]`: the
/// model's own field directly, a nested model's fields through the accessors `#[model]` gives
/// every struct (they may be private to another module), the layer's tensor directly (`pub`);
/// `["blocks", "2", "fc", "weight"]` indexes repeated blocks.
fn param_path(access: &[String]) -> TokenStream {
    let mut path = quote!(self);
    let last = access.len().saturating_sub(1);
    for (i, a) in access.iter().enumerate() {
        // One of repeated blocks: `self.blocks[2]`.
        if let Ok(index) = a.parse::<usize>() {
            let index = proc_macro2::Literal::usize_unsuffixed(index);
            path.extend(quote!([#index]));
        } else if i == 0 || i == last {
            let f = format_ident!("{}", a);
            path.extend(quote!(.#f));
        } else {
            let f = format_ident!("__rtx_field_{}", a);
            path.extend(quote!(.#f()));
        }
    }
    path
}

pub fn dim_expr(d: &Dim) -> TokenStream {
    let mut terms = Vec::new();
    for (atoms, coeff) in d.terms() {
        let factors = atoms.iter().map(atom_expr);
        terms.push(quote!((#coeff #(* #factors)*)));
    }
    if terms.is_empty() {
        return quote!(0usize);
    }
    quote!(((0i64 #(+ #terms)*) as usize))
}

fn atom_expr(a: &Atom) -> TokenStream {
    match a {
        Atom::Sym(n) => {
            let id = format_ident!("__d_{}", n);
            quote!((#id as i64))
        }
        Atom::Param(n) => {
            let id = format_ident!("{}", n);
            quote!((#id as i64))
        }
        Atom::FloorDiv(inner, k) => {
            let inner = dim_expr(inner);
            let k = *k as i64;
            quote!(((#inner as i64).div_euclid(#k)))
        }
    }
}

/// The number of elements of the function's largest value, as a run-time expression (a
/// maximum over its distinct shapes): it decides whether a call runs on rayon's pool
/// (`rtx_core::parallel::run`).
pub fn largest_value_expr(ir: &GraphFn) -> TokenStream {
    let mut seen = std::collections::BTreeSet::new();
    let mut sizes = Vec::new();
    for node in &ir.graph.nodes {
        if node.shape.is_empty() || !seen.insert(format!("{:?}", node.shape)) {
            continue;
        }
        let dims = node.shape.iter().map(dim_expr);
        sizes.push(quote!(1usize #(.saturating_mul(#dims))*));
    }
    quote!([0usize #(, #sizes)*].into_iter().max().unwrap_or(0))
}

/// Puts an input, a parameter (handles: the data is shared) or a constant into its slot.
fn leaf(ir: &GraphFn, id: NodeId, params: &[ParamRef], f: &GraphFnDef) -> TokenStream {
    match &ir.graph.node(id).op {
        Op::Input { index, .. } => match f.inputs.get(*index) {
            Some(input) => {
                let arg = &input.name;
                quote!(__s.leaf(#id, #arg);)
            }
            None => quote!(),
        },
        Op::Param { name, .. } => {
            let access = params
                .iter()
                .find(|p| p.name == *name)
                .map(|p| p.access.clone())
                .unwrap_or_default();
            let path = param_path(&access);
            quote!(__s.leaf(#id, &#path);)
        }
        Op::Const { value: c } => {
            let c = f32_literal(*c);
            quote!(__s.constant(#id, #c);)
        }
        _ => quote!(),
    }
}

fn is_leaf(op: &Op) -> bool {
    matches!(op, Op::Input { .. } | Op::Param { .. } | Op::Const { .. })
}

/// One node run by its kernel.
fn kernel(w: &mut StepText, ir: &GraphFn, id: NodeId) {
    let shape = w.shape(ir, id);
    let args = list(&ir.graph.node(id).args);
    w.line(format!(
        "__s.kernel(__ops, {id}, &[{args}], {shape}, __ctx);"
    ));
}

fn f32_literal(v: f64) -> TokenStream {
    let v = v as f32;
    if v.is_nan() {
        quote!(::core::primitive::f32::NAN)
    } else if v == f32::INFINITY {
        quote!(::core::primitive::f32::INFINITY)
    } else if v == f32::NEG_INFINITY {
        quote!(::core::primitive::f32::NEG_INFINITY)
    } else {
        let lit = Literal::f32_suffixed(v);
        quote!((#lit))
    }
}

pub(crate) fn operand(o: &Operand) -> TokenStream {
    match o {
        Operand::Input(i) => {
            let id = format_ident!("__i{}", i);
            quote!(#id)
        }
        Operand::Node(n) => {
            let id = format_ident!("__t{}", n);
            quote!(#id)
        }
        Operand::Const(c) => f32_literal(*c),
        // Only row groups use it; `row_operand` handles it there.
        Operand::RowLen => quote!((__cols as f32)),
    }
}

fn instr(i: &Instr, plain: bool) -> TokenStream {
    instr_with(i, plain, operand)
}

/// Whether a body rounds to the call's precision anywhere (then it gets a `Plain` version
/// without the roundings, for calls at f32: `rtx_core::fused::Kernel`).
pub(crate) fn rounds(i: &Instr) -> bool {
    matches!(i.op, Pointwise::Autocast | Pointwise::AutocastGrad)
}

/// `let __tN = scalar::op(args);`, with `operand` spelling each argument; with `plain`, a
/// rounding to the call's precision is `let __tN = x;` (the body for calls at f32).
pub(crate) fn instr_with(
    i: &Instr,
    plain: bool,
    operand: impl Fn(&Operand) -> TokenStream,
) -> TokenStream {
    let t = format_ident!("__t{}", i.node);
    let f = format_ident!("{}", i.op.name());
    let args: Vec<TokenStream> = i.args.iter().map(operand).collect();
    match i.op {
        Pointwise::Autocast | Pointwise::AutocastGrad if plain => {
            let x = &args[0];
            quote!(let #t = #x;)
        }
        // The call's rounding, read from the context once per call (`emit_fn`).
        Pointwise::Autocast | Pointwise::AutocastGrad => {
            let x = &args[0];
            quote!(let #t = ::rtx_core::fused::scalar::#f(#x, __cast);)
        }
        Pointwise::Pow(p) => {
            let p = f32_literal(p);
            let x = &args[0];
            quote!(let #t = ::rtx_core::fused::scalar::#f(#x, #p);)
        }
        _ => quote!(let #t = ::rtx_core::fused::scalar::#f(#(#args),*);),
    }
}

/// `#[inline(always)] move |[__i0, ..]: [f32; N]| { body; [outputs] }`: a pointwise group's
/// body as the closure its driver calls once per element. `move`, so that it holds the call's
/// rounding (`__cast`) by value and the driver can copy it next to its loop (a value read
/// through a reference there is reloaded every element, which keeps the loop scalar).
fn pointwise_closure(
    kernels: &mut Kernels,
    inputs: usize,
    body: &[Instr],
    outputs: &[NodeId],
) -> String {
    let signature = Signature::Pointwise {
        inputs,
        outputs: outputs.len(),
    };
    kernels.closure_keyed(signature, BodyKey::pointwise(body, outputs), || {
        let closure = |plain: bool| {
            let params = (0..inputs).map(|i| format_ident!("__i{}", i));
            let instrs = body.iter().map(|i| instr(i, plain));
            let results = outputs.iter().map(|&o| format_ident!("__t{}", o));
            quote! {
                #[inline(always)]
                move |[#(#params),*]: [f32; #inputs]| {
                    #(#instrs)*
                    [#(#results),*]
                }
            }
        };
        // A group of roundings only is passed on at f32 (`unless_f32`), so its body without
        // them would be compiled and never run.
        let plain = (body.iter().any(rounds) && !body.iter().all(rounds)).then(|| closure(true));
        (closure(false), plain)
    })
}

/// `step`, except that a group that only rounds passes its input on at f32 (moved when it
/// dies here).
fn unless_f32(
    body: &[Instr],
    inputs: &[NodeId],
    outputs: &[NodeId],
    moved: bool,
    step: String,
) -> String {
    if !rounding_only(body, inputs, outputs) {
        return step;
    }
    let (input, output) = (inputs[0], outputs[0]);
    format!(
        "if __cast.to == ::rtx_core::fused::scalar::HalfType::None {{ \
         __s.pass({input}, {output}, {moved}); }} else {{ {step} }}"
    )
}

/// A fusion group: one closure over the group's inputs, one pass over its shape.
fn fused(
    w: &mut StepText,
    kernels: &mut Kernels,
    ir: &GraphFn,
    shape_of: NodeId,
    inputs: &[NodeId],
    body: &[Instr],
    outputs: &[NodeId],
) {
    let closure = pointwise_closure(kernels, inputs.len(), body, outputs);
    let shape = w.shape(ir, shape_of);
    let (ins, outs) = (list(inputs), list(outputs));
    let step = format!("__s.fused([{ins}], [{outs}], {shape}, {closure});");
    w.line(unless_f32(body, inputs, outputs, false, step));
}

/// A fusion group that writes its first output over `donor`, an input no later step reads
/// (`Slots::fused_donating` checks at run time that its buffer is unshared).
#[allow(clippy::too_many_arguments)]
fn fused_in_place(
    w: &mut StepText,
    kernels: &mut Kernels,
    ir: &GraphFn,
    shape_of: NodeId,
    inputs: &[NodeId],
    donor: NodeId,
    body: &[Instr],
    outputs: &[NodeId],
) {
    let closure = pointwise_closure(kernels, inputs.len(), body, outputs);
    let shape = w.shape(ir, shape_of);
    let (ins, outs) = (list(inputs), list(outputs));
    let step = format!("__s.fused_donating([{ins}], {donor}, [{outs}], {shape}, {closure});");
    w.line(unless_f32(body, inputs, outputs, true, step));
}

/// A matmul with its pointwise epilogue: one closure over the product's element and the
/// group's other inputs, run on each block of the product.
/// A group of another shape than the product's (it read the product through a reshape) gets
/// its outputs in its own shape (`Slots::matmul_fused_as`).
fn matmul_epilogue(
    w: &mut StepText,
    kernels: &mut Kernels,
    ir: &GraphFn,
    (matmul, shape_of): (NodeId, NodeId),
    inputs: &[NodeId],
    body: &[Instr],
    outputs: &[NodeId],
) {
    let args = &ir.graph.node(matmul).args;
    let (a, b) = (args[0], args[1]);
    let closure = pointwise_closure(kernels, inputs.len(), body, outputs);
    let shape = w.shape(ir, matmul);
    let (extras, outs) = (list(&inputs[1..]), list(outputs));
    if ir.graph.node(shape_of).shape == ir.graph.node(matmul).shape {
        w.line(format!(
            "__s.matmul_fused({a}, {b}, [{extras}], [{outs}], {shape}, {closure});"
        ));
    } else {
        let group_shape = w.shape(ir, shape_of);
        w.line(format!(
            "__s.matmul_fused_as({a}, {b}, [{extras}], [{outs}], {shape}, {group_shape}, {closure});"
        ));
    }
}

/// A weight gradient and its bias gradient from one GEMM (`Step::MatMulRowSums`).
fn matmul_row_sums(w: &mut StepText, ir: &GraphFn, matmul: NodeId, sums: NodeId) {
    let args = &ir.graph.node(matmul).args;
    let (a, b) = (args[0], args[1]);
    let (product_shape, sums_shape) = (w.shape(ir, matmul), w.shape(ir, sums));
    w.line(format!(
        "__s.matmul_row_sums({a}, {b}, [{matmul}, {sums}], {product_shape}, {sums_shape});"
    ));
}

/// The schedule with fusion off: inputs and parameters put in their slots, then one call of
/// `Slots::unfused`, which runs every node by its own kernel from the function's IR (`__f`,
/// embedded in the model) with the values of the symbols and generic parameters its shapes
/// mention.
fn unfused(
    ir: &GraphFn,
    upto: usize,
    roots: &[NodeId],
    params: &[ParamRef],
    f: &GraphFnDef,
) -> TokenStream {
    let mut out = TokenStream::new();
    for (id, node) in ir.graph.nodes.iter().enumerate().take(upto) {
        if matches!(node.op, Op::Input { .. } | Op::Param { .. }) {
            out.extend(leaf(ir, id, params, f));
        }
    }
    let dims = dims_expr(ir, upto);
    out.extend(quote!(__s.unfused(__f, #upto, &[#(#roots),*], #dims, __ctx);));
    out
}

/// `&[(name, value), ..]` for every symbol and generic parameter the shapes of nodes
/// `0..upto` mention, evaluated in the generated function.
pub fn dims_expr(ir: &GraphFn, upto: usize) -> TokenStream {
    let mut names = std::collections::BTreeSet::new();
    for node in ir.graph.nodes.iter().take(upto) {
        for d in &node.shape {
            for a in d.atoms() {
                if let Atom::Sym(n) | Atom::Param(n) = &a {
                    names.insert((matches!(a, Atom::Sym(_)), n.clone()));
                }
            }
        }
    }
    let dims: Vec<TokenStream> = names
        .iter()
        .map(|(sym, n)| {
            let value = if *sym {
                atom_expr(&Atom::Sym(n.clone()))
            } else {
                atom_expr(&Atom::Param(n.clone()))
            };
            quote!((#n, #value))
        })
        .collect();
    quote!(&[#(#dims),*])
}

/// The statements computing nodes `0..upto` of `ir`, where `roots` must be materialized:
/// fused when `fuse` is true, one kernel per node otherwise. Every value lives in the call's
/// `__s: rtx_core::slots::Slots` under its node id, from the step that computes it to the
/// last one that reads it; `roots` stay.
pub fn schedule(
    kernels: &mut Kernels,
    ir: &GraphFn,
    upto: usize,
    roots: &[NodeId],
    params: &[ParamRef],
    f: &GraphFnDef,
    fuse: bool,
) -> TokenStream {
    crate::timing::phase(if fuse { "emit/fused" } else { "emit/unfused" }, || {
        schedule_inner(kernels, ir, upto, roots, params, f, fuse)
    })
}

fn schedule_inner(
    kernels: &mut Kernels,
    ir: &GraphFn,
    upto: usize,
    roots: &[NodeId],
    params: &[ParamRef],
    f: &GraphFnDef,
    fuse: bool,
) -> TokenStream {
    if !fuse {
        return unfused(ir, upto, roots, params, f);
    }
    let steps = crate::timing::phase("emit/plan", || plan(&ir.graph, upto, roots));
    // Leaves: inputs and parameters are borrowed; constants become tensors only where a
    // kernel or a result reads them (fused bodies inline them).
    let mut tensor_needed = vec![false; ir.graph.len()];
    for s in &steps {
        match s {
            Step::Kernel(id) => ir
                .graph
                .node(*id)
                .args
                .iter()
                .for_each(|&a| tensor_needed[a] = true),
            Step::Fused { inputs, .. } | Step::Rows { inputs, .. } => {
                inputs.iter().for_each(|&a| tensor_needed[a] = true)
            }
            Step::MatMulEpilogue { matmul, inputs, .. } => {
                for &a in ir.graph.node(*matmul).args.iter().chain(&inputs[1..]) {
                    tensor_needed[a] = true;
                }
            }
            Step::MatMulRowSums { matmul, sums } => {
                for &a in ir
                    .graph
                    .node(*matmul)
                    .args
                    .iter()
                    .chain(&ir.graph.node(*sums).args)
                {
                    tensor_needed[a] = true;
                }
            }
        }
    }
    for &r in roots {
        tensor_needed[r] = true;
    }
    let mut out = TokenStream::new();
    for (id, &needed) in tensor_needed.iter().enumerate().take(upto) {
        let op = &ir.graph.node(id).op;
        let wanted = !matches!(op, Op::Const { .. }) || needed;
        if is_leaf(op) && wanted {
            out.extend(leaf(ir, id, params, f));
        }
    }
    // Each intermediate is dropped after the last step that reads it, so its buffer goes back
    // to the cache for the next kernel of that size (`rtx_ir::memory`).
    let (deaths, donors) = crate::timing::phase("emit/liveness", || {
        let deaths = rtx_ir::memory::deaths(ir, &steps, roots);
        let donors = rtx_ir::memory::donors(ir, &steps, &deaths);
        (deaths, donors)
    });
    let mut w = StepText::default();
    for ((s, dead), &donated) in steps.iter().zip(&deaths).zip(&donors) {
        match s {
            Step::Kernel(id) => kernel(&mut w, ir, *id),
            Step::Fused {
                shape_of,
                inputs,
                body,
                outputs,
            } => match donated {
                Some(d) => fused_in_place(&mut w, kernels, ir, *shape_of, inputs, d, body, outputs),
                None => fused(&mut w, kernels, ir, *shape_of, inputs, body, outputs),
            },
            Step::Rows {
                shape_of,
                inputs,
                body,
                outputs,
            } => rows(kernels, ir, *shape_of, inputs, body, outputs, &mut w),
            Step::MatMulEpilogue {
                matmul,
                shape_of,
                inputs,
                body,
                outputs,
            } => matmul_epilogue(
                &mut w,
                kernels,
                ir,
                (*matmul, *shape_of),
                inputs,
                body,
                outputs,
            ),
            Step::MatMulRowSums { matmul, sums } => matmul_row_sums(&mut w, ir, *matmul, *sums),
        }
        let dead: Vec<NodeId> = dead
            .iter()
            .copied()
            .filter(|&v| Some(v) != donated)
            .collect();
        if !dead.is_empty() {
            w.line(format!("__s.free(&[{}]);", list(&dead)));
        }
    }
    out.extend(w.finish());
    out
}

/// Checks on entry that every parameter the function reads has its declared shape: weights
/// are public fields, and no kernel re-checks them.
pub fn param_checks(ir: &GraphFn, params: &[ParamRef]) -> TokenStream {
    let mut out = TokenStream::new();
    for node in &ir.graph.nodes {
        let Op::Param { name, shape } = &node.op else {
            continue;
        };
        let Some(p) = params.iter().find(|p| p.name == *name) else {
            continue;
        };
        let path = param_path(&p.access);
        let declared = rtx_ir::fmt_shape(shape);
        let dims = shape.iter().map(dim_expr);
        out.extend(quote! {
            __b.param(#name, &#path, #declared, &[#(#dims),*])?;
        });
    }
    out
}
