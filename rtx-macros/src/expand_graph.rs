//! `#[model]` on an impl holding `graph!`: parse, check and differentiate every graph
//! function at compile time, then emit straight-line Rust for the forward pass and, for
//! scalar-valued functions, the forward+backward pass (`<name>_and_grads`).
//!
//! The forward and `*_and_grads` functions are one quote each over the same entry checks
//! and bindings, which read best next to them; the schedules they embed live in
//! expand_schedule.rs, the parsing of the macro's input in internals/impl_input.rs.

use crate::expand_kernels::Kernels;
use crate::expand_schedule::{self as schedule, dim_expr};
use crate::internals::ast::{ElemType, GraphDef, GraphFnDef, ModelStruct};
use crate::internals::ctxt::Ctxt;
pub use crate::internals::impl_input::ImplInput;
use crate::internals::impl_input::{collect_nested, take_graph};
use crate::internals::lower::{Lowerer, NestedModel, Obligation, ParamRef};
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use rtx_ir::{Atom, GraphFn, IR_VERSION, ModelIr, Op};
use std::collections::HashMap;

pub fn expand(input: ImplInput) -> syn::Result<TokenStream> {
    let started = std::time::Instant::now();
    let mut nested = HashMap::new();
    let mut nested_raw = Vec::new();
    collect_nested(&input.nested, &mut nested, &mut nested_raw);

    let cx = Ctxt::new();
    let Some(item_struct) = &input.item_struct else {
        // The struct's expansion failed and reported why: still give the type its graph
        // functions, so the program that calls them reports nothing more.
        let (graph, rest) = take_graph(&input.item_impl, &cx);
        let errors = cx.check().err().map(|e| e.to_compile_error());
        return Ok(crate::expand_stand_in::stand_in(
            &input.item_impl,
            graph.as_ref(),
            &rest,
            errors,
        ));
    };
    let model = ModelStruct::from_item(item_struct, &HashMap::new(), &cx);

    // A nested model whose definition has not arrived yet: ask its callback for it, passing
    // everything along; its expansion calls this macro again.
    if let Some(missing) = model
        .fields
        .iter()
        .find_map(|f| match f.kind.nested_path() {
            Some((type_name, path)) if !nested.contains_key(type_name) => Some(path.clone()),
            _ => None,
        })
    {
        let mut path = missing;
        // The nested type's path names its graph callback too (`crate::enc::Encoder!`).
        if let Some(last) = path.segments.last_mut() {
            last.arguments = syn::PathArguments::None;
        }
        let (s, i) = (item_struct, &input.item_impl);
        let nested_sections = input.nested.iter().map(|n| {
            let raw = &n.raw;
            quote!(@nested { #raw })
        });
        return Ok(quote! { #path! { @struct { #s } @impl { #i } #(#nested_sections)* } });
    }

    let (graph, rest) = take_graph(&input.item_impl, &cx);
    let Some(graph) = graph else {
        // A graph! block that failed to parse has reported its error; saying it is missing
        // would be a second, false one.
        let has_block = input
            .item_impl
            .items
            .iter()
            .any(|it| matches!(it, syn::ImplItem::Macro(m) if m.mac.path.is_ident("graph")));
        if !has_block {
            cx.error_spanned_by(&input.item_impl.self_ty, "a #[model] impl needs a `graph! { fn forward<B>(&self, x: [B, ..]) -> [..] { .. } }` block");
        }
        let errors = cx.check().err().map(|e| e.to_compile_error());
        return Ok(crate::expand_stand_in::stand_in(
            &input.item_impl,
            None,
            &rest,
            errors,
        ));
    };

    let mut fns_ir = Vec::new();
    let mut methods = Vec::new();
    let mut obligations = Vec::new();
    let mut all_lowered = true;
    let mut silent = Vec::new();
    let mut kernels = Kernels::default();
    for (fi, f) in graph.fns.iter().enumerate() {
        let (lowered, broken_nested) = lower_fn(&cx, &model, &graph, f, &nested);
        if let Some((ir, params, obl)) = lowered {
            methods.push(crate::timing::phase("emit", || {
                emit_fn(&mut kernels, &model, f, fi, &ir, &params)
            }));
            fns_ir.push(ir);
            obligations.extend(obl);
        } else {
            all_lowered = false;
            if !broken_nested {
                silent.push(f);
            }
        }
    }
    // A function fails silently only when it reads a nested model that failed and reported
    // why. Anything else would compile a stand-in with no error: never let that happen.
    if !cx.has_errors() {
        for f in silent {
            cx.error_spanned_by(&f.name, format!("internal error: `{}` could not be compiled, but no error says why; please report this with the model", f.name));
        }
    }
    let obligation_checks = crate::expand_obligations::emit_obligations(&model, &obligations);
    let errors = cx.check().err().map(|e| e.to_compile_error());
    if errors.is_some() || !all_lowered {
        return Ok(crate::expand_stand_in::stand_in(
            &input.item_impl,
            Some(&graph),
            &rest,
            errors,
        ));
    }

    let ir = ModelIr {
        version: IR_VERSION,
        model: model.name.to_string(),
        functions: fns_ir,
    };
    report_expansion_time(&ir, kernels.len(), started);
    let json = ir
        .to_json()
        .map_err(|e| syn::Error::new(Span::call_site(), e))?;
    let item_impl = &input.item_impl;
    let (impl_g, _, where_g) = item_impl.generics.split_for_impl();
    let self_ty = &item_impl.self_ty;
    let attrs = &item_impl.attrs;
    let name = &model.name;
    let s = item_struct;
    let nested_sections = nested_raw.iter().map(|raw| quote!(@nested { #raw }));
    let callback = crate::graph_callback(
        name,
        quote!(
            ::rtx_core::__model_impl! { @nested { @struct { #s } @impl { #item_impl } #(#nested_sections)* } $($rest)* }
        ),
    );
    let kernel_items = kernels.items();
    let model_trait =
        crate::expand_model_trait::emit_model_trait(&graph, &item_impl.generics, self_ty);
    Ok(quote! {
        #(#attrs)*
        impl #impl_g #self_ty #where_g {
            #(#rest)*

            /// The graph IR the compiler built for this model: every graph function, forward
            /// and derived backward nodes, as it was checked at compile time.
            pub fn graph() -> ::rtx_core::Result<::rtx_core::ir::ModelIr> {
                Ok(Self::__rtx_ir()?.clone())
            }

            #[doc(hidden)]
            fn __rtx_ir() -> ::rtx_core::Result<&'static ::rtx_core::ir::ModelIr> {
                static IR: ::std::sync::OnceLock<::std::result::Result<::rtx_core::ir::ModelIr, ::std::string::String>> = ::std::sync::OnceLock::new();
                IR.get_or_init(|| ::rtx_core::ir::ModelIr::from_json(#json))
                    .as_ref()
                    .map_err(|e| ::rtx_core::RtxError::Invalid(e.clone()))
            }

            /// The relations over this model's generic parameters that its graph needs
            /// (`C*H*W == FLAT`, windows that fit): evaluated when the model is instantiated
            /// with concrete values, so a wrong instance fails to build.
            #[doc(hidden)]
            #[allow(clippy::all)]
            const RTX_SHAPE_CHECKS: () = { #obligation_checks };

            #(#methods)*

            #(#kernel_items)*
        }

        #model_trait

        // This model's definition for models that nest it.
        #callback
    })
}

/// With `RTX_EXPANSION_TIME` set, prints how long the compiler took on this model (parse,
/// shape checks, lowering, autodiff, fusion planning, code generation; rustc's own work on
/// the output is not included).
fn report_expansion_time(ir: &ModelIr, kernels: usize, started: std::time::Instant) {
    let phases = crate::timing::take_summary();
    if std::env::var_os("RTX_EXPANSION_TIME").is_none() {
        return;
    }
    let nodes: usize = ir.functions.iter().map(|f| f.graph.len()).sum();
    eprintln!(
        "rtx: expanded model `{}` in {:.1} ms ({} graph functions, {nodes} IR nodes, {kernels} distinct fused kernels; {phases})",
        ir.model,
        started.elapsed().as_secs_f64() * 1e3,
        ir.functions.len()
    );
}

fn lower_fn(
    cx: &Ctxt,
    model: &ModelStruct,
    graph: &GraphDef,
    f: &GraphFnDef,
    nested: &HashMap<String, Option<NestedModel>>,
) -> (Option<LoweredFn>, bool) {
    let mut lw = Lowerer::new(cx, nested);
    let lowered = lower_fn_with(&mut lw, cx, model, graph, f);
    (lowered, lw.broken_nested)
}

/// A graph function's IR, the parameters it reads and its instantiation checks.
type LoweredFn = (GraphFn, Vec<ParamRef>, Vec<Obligation>);

fn lower_fn_with(
    lw: &mut Lowerer,
    cx: &Ctxt,
    model: &ModelStruct,
    graph: &GraphDef,
    f: &GraphFnDef,
) -> Option<LoweredFn> {
    let out = crate::timing::phase("lower", || lw.lower_fn(model, graph, f))?;
    let forward_len = lw.graph.len();
    let mut ir = GraphFn {
        name: f.name.to_string(),
        symbols: f.symbols.iter().map(|s| s.to_string()).collect(),
        graph: std::mem::take(&mut lw.graph),
        output: out,
        forward_len,
        grads: Vec::new(),
    };
    if ir.graph.node(out).shape.is_empty() {
        // Gradients for the parameters, and for the inputs marked `#[grad]`; nothing else.
        let mut wrt = Vec::new();
        for (id, node) in ir.graph.nodes.iter().enumerate() {
            match &node.op {
                Op::Param { .. } => wrt.push(id),
                Op::Input { index, .. } if f.inputs.get(*index).is_some_and(|i| i.grad) => {
                    if node.dtype != rtx_ir::DType::F32 {
                        cx.error_spanned_by(
                            &f.inputs[*index].name,
                            "`#[grad]` on an integer input: integers have no gradient",
                        );
                        return None;
                    }
                    wrt.push(id);
                }
                _ => {}
            }
        }
        match crate::timing::phase("autodiff", || {
            rtx_ir::differentiate(&mut ir.graph, out, &wrt)
        }) {
            Ok(g) => ir.grads = g,
            Err(e) => {
                cx.error_spanned_by(&f.name, format!("cannot differentiate `{}`: {e}", f.name));
                return None;
            }
        }
    }
    crate::timing::phase("dce", || ir.remove_dead_nodes());
    // Algebraic rewrites and CSE over forward and backward together. They cannot fail on a
    // graph that passed its shape rules; if they ever do, the unrewritten graph is kept, which
    // computes the same values.
    crate::timing::phase("rewrite", || {
        let mut rewritten = ir.clone();
        if rtx_ir::rewrite::simplify(&mut rewritten, rtx_ir::rewrite::Limits::default()).is_ok() {
            rewritten.remove_dead_nodes();
            ir = rewritten;
        }
    });
    Some((
        ir,
        std::mem::take(&mut lw.params),
        std::mem::take(&mut lw.obligations),
    ))
}

/// Binds each input's symbolic dims and checks the rest, in declaration order.
fn emit_bindings(model: &ModelStruct, f: &GraphFnDef, ir: &GraphFn) -> TokenStream {
    let ctx_name = format!("{}::{}", model.name, f.name);
    let mut bound: Vec<String> = Vec::new();
    let mut out = TokenStream::new();
    for inp in &f.inputs {
        let node = ir
            .graph
            .nodes
            .iter()
            .find(|n| matches!(&n.op, Op::Input { name, .. } if inp.name == name.as_str()));
        let Some(node) = node else { continue };
        let arg = &inp.name;
        let arg_name = arg.to_string();
        let declared = rtx_ir::fmt_shape(&node.shape);
        let rank = node.shape.len();
        let dtype = if inp.dtype == ElemType::I64 {
            quote!(::rtx_core::DType::I64)
        } else {
            quote!(::rtx_core::DType::F32)
        };
        out.extend(quote! { __b.arg(#arg_name, #arg, #declared, #rank, #dtype)?; });
        for (axis, d) in node.shape.iter().enumerate() {
            match d.as_single_atom() {
                Some(Atom::Sym(s)) if !bound.contains(s) => {
                    let id = format_ident!("__d_{}", s);
                    out.extend(quote! { let #id: usize = __b.bind(#arg_name, #arg, #declared, #axis, #s)?; });
                    bound.push(s.clone());
                }
                // A repeated symbol re-checks against its binding, naming the argument that bound it.
                Some(Atom::Sym(s)) => {
                    out.extend(quote! { __b.bind(#arg_name, #arg, #declared, #axis, #s)?; });
                }
                _ => {
                    let e = dim_expr(d);
                    out.extend(quote! { __b.expect(#arg_name, #arg, #declared, #axis, #e)?; });
                }
            }
        }
    }
    quote! {
        let mut __b = ::rtx_core::bind::Binder::new(#ctx_name);
        #out
    }
}

fn emit_fn(
    kernels: &mut Kernels,
    model: &ModelStruct,
    f: &GraphFnDef,
    fi: usize,
    ir: &GraphFn,
    params: &[ParamRef],
) -> TokenStream {
    let name = &f.name;
    let with = format_ident!("{}_with", name);
    let args: Vec<&syn::Ident> = f.inputs.iter().map(|i| &i.name).collect();
    let bindings = emit_bindings(model, f, ir);
    // Spanned at the function's name: rustc's "erroneous constant" note points there.
    let check = quote_spanned!(f.name.span()=> let () = Self::RTX_SHAPE_CHECKS;);
    let param_checks = schedule::param_checks(ir, params);
    let out = ir.output;
    let slots = ir.graph.len();
    let largest = schedule::largest_value_expr(ir);
    let forward_roots = [ir.output];
    let forward_len = ir.forward_len;
    let fwd_dims = schedule::dims_expr(ir, ir.forward_len);
    let fwd_fused =
        schedule::schedule(kernels, ir, ir.forward_len, &forward_roots, params, f, true);
    let fwd_plain = schedule::schedule(
        kernels,
        ir,
        ir.forward_len,
        &forward_roots,
        params,
        f,
        false,
    );
    let fwd_arena = format_ident!("__rtx_arena_{}", with);
    let fwd_static = crate::expand_arena::static_plan(ir, forward_len, &forward_roots);
    let fwd_slots = crate::expand_arena::slots_expr(
        fwd_static.as_ref().map(|_| &fwd_arena),
        slots,
        forward_len,
        &forward_roots,
        &fwd_dims,
    );
    let doc = format!(
        "Graph function `{}` in eval mode (dropout off). Checked at compile time: {}.",
        name,
        signature_text(f, ir)
    );
    let doc_with =
        format!("Graph function `{name}` with an explicit context (train mode turns dropout on).");
    let user_docs = &f.docs;
    let mut ts = quote! {
        #(#user_docs)*
        #[doc = ""]
        #[doc = #doc]
        pub fn #name(&self, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<::rtx_core::Tensor> {
            #check
            self.#with(&mut ::rtx_core::Ctx::eval(), #(#args),*)
        }

        #[doc = #doc_with]
        #[allow(unused_variables, non_snake_case, clippy::all)]
        pub fn #with(&self, __ctx: &mut ::rtx_core::Ctx, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<::rtx_core::Tensor> {
            #check
            #bindings
            #param_checks
            if let Some(__r) = ::rtx_core::gpu::forward_on(self, &Self::__rtx_ir()?.functions[#fi], __ctx, &[#(#args),*]) {
                return __r;
            }
            let __largest: usize = #largest;
            ::rtx_core::parallel::run(__largest, move || {
                let __f = &Self::__rtx_ir()?.functions[#fi];
                let __ops = &__f.graph.nodes;
                let __cast = __ctx.rounding();
                let mut __s = #fwd_slots;
                __s.describe(__f, "forward");
                if __ctx.fusion() {
                    #fwd_fused
                } else {
                    #fwd_plain
                }
                __s.finish()?;
                __s.take(#out)
            })
        }
    };
    if let Some(body) = fwd_static {
        ts.extend(static_plan_fn(&fwd_arena, &with, body));
    }
    if ir.graph.node(ir.output).shape.is_empty() {
        let and_grads = format_ident!("{}_and_grads", name);
        let mut roots = vec![ir.output];
        roots.extend(ir.grads.iter().filter_map(|g| g.grad));
        let all_fused = schedule::schedule(kernels, ir, ir.graph.len(), &roots, params, f, true);
        let all_plain = schedule::schedule(kernels, ir, ir.graph.len(), &roots, params, f, false);
        let all_dims = schedule::dims_expr(ir, ir.graph.len());
        let all_arena = format_ident!("__rtx_arena_{}", and_grads);
        let all_static = crate::expand_arena::static_plan(ir, ir.graph.len(), &roots);
        let all_slots = crate::expand_arena::slots_expr(
            all_static.as_ref().map(|_| &all_arena),
            slots,
            slots,
            &roots,
            &all_dims,
        );
        if let Some(body) = all_static {
            ts.extend(static_plan_fn(&all_arena, &and_grads, body));
        }
        let pushes: Vec<TokenStream> = ir
            .grads
            .iter()
            .filter_map(|g| {
                let name = match &ir.graph.node(g.leaf).op {
                    Op::Param { name, .. } | Op::Input { name, .. } => name,
                    _ => return None,
                };
                let leaf = g.leaf;
                Some(match g.grad {
                    Some(id) => quote!((#name, Some(#id), #leaf)),
                    None => quote!((#name, None, #leaf)),
                })
            })
            .collect();
        let doc = format!(
            "`{name}` and its gradient with respect to every parameter it reads, by the backward pass derived at compile time ({} forward and {} backward nodes).",
            ir.forward_len,
            ir.graph.len() - ir.forward_len
        );
        ts.extend(quote! {
            #[doc = #doc]
            #[allow(unused_variables, non_snake_case, clippy::all)]
            pub fn #and_grads(&self, __ctx: &mut ::rtx_core::Ctx, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<(::rtx_core::Tensor, ::rtx_core::Grads)> {
                #check
                #bindings
                #param_checks
                if let Some(__r) = ::rtx_core::gpu::and_grads_on(self, &Self::__rtx_ir()?.functions[#fi], __ctx, &[#(#args),*]) {
                    return __r;
                }
                let __largest: usize = #largest;
                ::rtx_core::parallel::run(__largest, move || {
                    let __f = &Self::__rtx_ir()?.functions[#fi];
                let __ops = &__f.graph.nodes;
                    let __cast = __ctx.rounding();
                    let mut __s = #all_slots;
                    __s.describe(__f, "and_grads");
                    if __ctx.fusion() {
                        #all_fused
                    } else {
                        #all_plain
                    }
                    __s.finish()?;
                    let __grads = __s.grads(&[#(#pushes),*])?;
                    Ok((__s.take(#out)?, __grads))
                })
            }
        });
    }
    ts
}

/// The accessor of a function's compile-time arena plan, `fn_name`'s.
fn static_plan_fn(plan_fn: &syn::Ident, fn_name: &syn::Ident, body: TokenStream) -> TokenStream {
    let doc =
        format!("The arena plan of `{fn_name}`, fixed at compile time: its shapes are all static.");
    quote! {
        #[doc = #doc]
        #[doc(hidden)]
        pub fn #plan_fn() -> &'static ::rtx_core::planned::StaticPlan {
            #body
        }
    }
}

fn signature_text(f: &GraphFnDef, ir: &GraphFn) -> String {
    let ins: Vec<String> = ir
        .graph
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Input { name, shape, .. } => Some(format!("{name}: {}", rtx_ir::fmt_shape(shape))),
            _ => None,
        })
        .collect();
    format!(
        "({}) -> {}",
        ins.join(", "),
        rtx_ir::fmt_shape(&ir.graph.node(ir.output).shape)
    )
    .replace("self", &f.name.to_string())
}
