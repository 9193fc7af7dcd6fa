//! `#[model]` on an impl holding `graph!`: parse, check and differentiate every graph
//! function at compile time, then emit straight-line Rust for the forward pass and, for
//! scalar-valued functions, the forward+backward pass (`<name>_and_grads`).

use crate::expand_schedule::{self as schedule, dim_expr};
use crate::internals::ast::{ElemType, GraphDef, GraphFnDef, ModelStruct};
use crate::internals::ctxt::Ctxt;
use crate::internals::lower::{Lowerer, NestedModel, Obligation, ParamRef};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use rtx_ir::{Atom, Dim, GraphFn, IR_VERSION, ModelIr, Op};
use std::collections::HashMap;
use syn::parse::{Parse, ParseStream};

/// The input of `__model_impl!`: the struct, the impl, and the definitions of nested models
/// gathered so far by callbacks.
pub struct ImplInput {
    pub item_struct: syn::ItemStruct,
    pub item_impl: syn::ItemImpl,
    pub nested: Vec<NestedTokens>,
}

/// A nested model as delivered by its `__rtx_graph_*` callback.
#[derive(Clone)]
pub struct NestedTokens {
    pub item_struct: syn::ItemStruct,
    pub item_impl: syn::ItemImpl,
    pub nested: Vec<NestedTokens>,
    pub raw: TokenStream,
}

fn parse_sections(
    input: ParseStream,
) -> syn::Result<(
    Option<syn::ItemStruct>,
    Option<syn::ItemImpl>,
    Vec<NestedTokens>,
)> {
    let (mut s, mut i, mut n) = (None, None, Vec::new());
    while !input.is_empty() {
        input.parse::<syn::Token![@]>()?;
        let tag: syn::Ident = syn::ext::IdentExt::parse_any(input)?;
        let content;
        syn::braced!(content in input);
        match tag.to_string().as_str() {
            "struct" => s = Some(content.parse()?),
            "impl" => i = Some(content.parse()?),
            "nested" => {
                let raw: TokenStream = content.fork().parse()?;
                let (ns, ni, nn) = parse_sections(&content)?;
                let (Some(ns), Some(ni)) = (ns, ni) else {
                    return Err(syn::Error::new(
                        tag.span(),
                        "internal: nested model without struct or impl",
                    ));
                };
                n.push(NestedTokens {
                    item_struct: ns,
                    item_impl: ni,
                    nested: nn,
                    raw,
                });
            }
            _ => return Err(syn::Error::new(tag.span(), "internal: unknown section")),
        }
    }
    Ok((s, i, n))
}

impl Parse for ImplInput {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let (s, i, n) = parse_sections(input)?;
        match (s, i) {
            (Some(item_struct), Some(item_impl)) => Ok(ImplInput {
                item_struct,
                item_impl,
                nested: n,
            }),
            _ => Err(syn::Error::new(
                Span::call_site(),
                "internal: __model_impl! needs @struct and @impl",
            )),
        }
    }
}

/// Finds `graph! { .. }` in the impl and parses it; the other items pass through.
fn take_graph(item: &syn::ItemImpl, cx: &Ctxt) -> (Option<GraphDef>, Vec<syn::ImplItem>) {
    let mut graph = None;
    let mut rest = Vec::new();
    for it in &item.items {
        match it {
            syn::ImplItem::Macro(m) if m.mac.path.is_ident("graph") => {
                match syn::parse2::<GraphDef>(crate::internals::ast::where_as_raw_ident(
                    m.mac.tokens.clone(),
                )) {
                    Ok(g) if graph.is_none() => graph = Some(g),
                    Ok(_) => cx.error_spanned_by(&m.mac, "only one graph! block per #[model] impl"),
                    Err(e) => cx.syn_error(e),
                }
            }
            other => rest.push(other.clone()),
        }
    }
    (graph, rest)
}

fn collect_nested(
    list: &[NestedTokens],
    out: &mut HashMap<String, NestedModel>,
    raw: &mut Vec<TokenStream>,
) {
    for n in list {
        let cx = Ctxt::new();
        if let (Some(graph), _) = take_graph(&n.item_impl, &cx) {
            out.insert(
                n.item_struct.ident.to_string(),
                NestedModel {
                    item: n.item_struct.clone(),
                    graph,
                },
            );
        }
        raw.push(n.raw.clone());
        collect_nested(&n.nested, out, raw);
    }
}

pub fn expand(input: ImplInput) -> syn::Result<TokenStream> {
    let started = std::time::Instant::now();
    let mut nested = HashMap::new();
    let mut nested_raw = Vec::new();
    collect_nested(&input.nested, &mut nested, &mut nested_raw);

    let cx = Ctxt::new();
    let model = ModelStruct::from_item(&input.item_struct, &HashMap::new(), &cx);

    // A nested model whose definition has not arrived yet: ask its callback for it, passing
    // everything along; its expansion calls this macro again.
    if let Some(missing) = model.fields.iter().find_map(|f| match &f.kind {
        crate::internals::ast::FieldKind::Nested {
            type_name, path, ..
        } if !nested.contains_key(type_name) => Some((type_name.clone(), path.clone())),
        _ => None,
    }) {
        let (type_name, mut path) = missing;
        if let Some(last) = path.segments.last_mut() {
            last.ident = crate::callback_ident("graph", &type_name, last.ident.span());
            last.arguments = syn::PathArguments::None;
        }
        let (s, i) = (&input.item_struct, &input.item_impl);
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
        cx.check()?;
        return Ok(TokenStream::new());
    };

    let mut fns_ir = Vec::new();
    let mut methods = Vec::new();
    let mut obligations = Vec::new();
    for (fi, f) in graph.fns.iter().enumerate() {
        if let Some((ir, params, obl)) = lower_fn(&cx, &model, &graph, f, &nested) {
            methods.push(emit_fn(&model, f, fi, &ir, &params));
            fns_ir.push(ir);
            obligations.extend(obl);
        }
    }
    let obligation_checks = emit_obligations(&cx, &obligations);
    cx.check()?;

    let ir = ModelIr {
        version: IR_VERSION,
        model: model.name.to_string(),
        functions: fns_ir,
    };
    report_expansion_time(&ir, started);
    let json = ir
        .to_json()
        .map_err(|e| syn::Error::new(Span::call_site(), e))?;
    let item_impl = &input.item_impl;
    let (impl_g, _, where_g) = item_impl.generics.split_for_impl();
    let self_ty = &item_impl.self_ty;
    let attrs = &item_impl.attrs;
    let name = &model.name;
    let callback = crate::callback_ident("graph", &name.to_string(), name.span());
    let s = &input.item_struct;
    let nested_sections = nested_raw.iter().map(|raw| quote!(@nested { #raw }));
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

            #[doc(hidden)]
            #[allow(dead_code, clippy::all)]
            fn __rtx_shape_obligations() {
                #obligation_checks
            }

            #(#methods)*
        }

        // This model's definition for models that nest it (see `__rtx_model_*`).
        #[doc(hidden)]
        #[allow(unused_macros)]
        macro_rules! #callback {
            ($($rest:tt)*) => { ::rtx_core::__model_impl! { @nested { @struct { #s } @impl { #item_impl } #(#nested_sections)* } $($rest)* } };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        pub(crate) use #callback;
    })
}

/// With `RTX_EXPANSION_TIME` set, prints how long the compiler took on this model (parse,
/// shape checks, lowering, autodiff, fusion planning, code generation; rustc's own work on
/// the output is not included).
fn report_expansion_time(ir: &ModelIr, started: std::time::Instant) {
    if std::env::var_os("RTX_EXPANSION_TIME").is_none() {
        return;
    }
    let nodes: usize = ir.functions.iter().map(|f| f.graph.len()).sum();
    eprintln!(
        "rtx: expanded model `{}` in {:.1} ms ({} graph functions, {nodes} IR nodes)",
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
    nested: &HashMap<String, NestedModel>,
) -> Option<(GraphFn, Vec<ParamRef>, Vec<Obligation>)> {
    let mut lw = Lowerer::new(cx, nested);
    let out = lw.lower_fn(model, graph, f)?;
    let forward_len = lw.graph.len();
    let mut ir = GraphFn {
        name: f.name.to_string(),
        symbols: f.symbols.iter().map(|s| s.to_string()).collect(),
        graph: lw.graph,
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
        match rtx_ir::differentiate(&mut ir.graph, out, &wrt) {
            Ok(g) => ir.grads = g,
            Err(e) => {
                cx.error_spanned_by(&f.name, format!("cannot differentiate `{}`: {e}", f.name));
                return None;
            }
        }
    }
    ir.remove_dead_nodes();
    // Algebraic rewrites and CSE over forward and backward together. They cannot fail on a
    // graph that passed its shape rules; if they ever do, the unrewritten graph is kept, which
    // computes the same values.
    let mut rewritten = ir.clone();
    if rtx_ir::rewrite::simplify(&mut rewritten, rtx_ir::rewrite::Limits::default()).is_ok() {
        rewritten.remove_dead_nodes();
        ir = rewritten;
    }
    Some((ir, lw.params, lw.obligations))
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
    let param_checks = schedule::param_checks(ir, params);
    let out = format_ident!("__n{}", ir.output);
    let largest = schedule::largest_value_expr(ir);
    let forward_roots = [ir.output];
    let fwd_fused = schedule::schedule(ir, ir.forward_len, &forward_roots, params, f, true);
    let fwd_plain = schedule::schedule(ir, ir.forward_len, &forward_roots, params, f, false);
    let doc = format!(
        "Graph function `{}` in eval mode (dropout off). Checked at compile time: {}.",
        name,
        signature_text(f, ir)
    );
    let doc_with =
        format!("Graph function `{name}` with an explicit context (train mode turns dropout on).");
    let mut ts = quote! {
        #[doc = #doc]
        pub fn #name(&self, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<::rtx_core::Tensor> {
            self.#with(&mut ::rtx_core::Ctx::eval(), #(#args),*)
        }

        #[doc = #doc_with]
        #[allow(unused_variables, non_snake_case, clippy::all)]
        pub fn #with(&self, __ctx: &mut ::rtx_core::Ctx, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<::rtx_core::Tensor> {
            #bindings
            #param_checks
            let __largest: usize = #largest;
            ::rtx_core::parallel::run(__largest, move || {
                let __ops = &Self::__rtx_ir()?.functions[#fi].graph.nodes;
                if __ctx.fusion() {
                    #fwd_fused
                    Ok(#out.clone())
                } else {
                    #fwd_plain
                    Ok(#out.clone())
                }
            })
        }
    };
    if ir.graph.node(ir.output).shape.is_empty() {
        let and_grads = format_ident!("{}_and_grads", name);
        let mut roots = vec![ir.output];
        roots.extend(ir.grads.iter().filter_map(|g| g.grad));
        let all_fused = schedule::schedule(ir, ir.graph.len(), &roots, params, f, true);
        let all_plain = schedule::schedule(ir, ir.graph.len(), &roots, params, f, false);
        let pushes: Vec<TokenStream> = ir
            .grads
            .iter()
            .filter_map(|g| {
                let name = match &ir.graph.node(g.leaf).op {
                    Op::Param { name, .. } | Op::Input { name, .. } => name,
                    _ => return None,
                };
                let leaf = format_ident!("__n{}", g.leaf);
                Some(match g.grad {
                    Some(id) => {
                        let gv = format_ident!("__n{}", id);
                        quote!(__grads.push(#name, ::rtx_core::ops::materialize(#gv, #leaf.shape())?);)
                    }
                    None => quote!(__grads.push(#name, ::rtx_core::Tensor::zeros(#leaf.shape()));),
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
                #bindings
                #param_checks
                let __largest: usize = #largest;
                ::rtx_core::parallel::run(__largest, move || {
                    let __ops = &Self::__rtx_ir()?.functions[#fi].graph.nodes;
                    let mut __grads = ::rtx_core::Grads::new();
                    if __ctx.fusion() {
                        #all_fused
                        #(#pushes)*
                        Ok((#out.clone(), __grads))
                    } else {
                        #all_plain
                        #(#pushes)*
                        Ok((#out.clone(), __grads))
                    }
                })
            }
        });
    }
    ts
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

/// Each generic-dimension equality becomes a `DimEq` check that rustc runs at `cargo check`:
/// `<DimCheck as DimEq<{ FOUND }, { EXPECTED }>>::check();`. The path of `DimCheck` starts at
/// the first token of the user's expression and ends at its last, so rustc underlines the
/// whole sub-expression; each pair of dimensions is checked once (the first place it arose).
fn emit_obligations(cx: &Ctxt, obligations: &[Obligation]) -> TokenStream {
    let mut out = TokenStream::new();
    let mut seen: Vec<(String, String)> = Vec::new();
    for o in obligations {
        let (f, e) = (o.found.to_string(), o.expected.to_string());
        if seen
            .iter()
            .any(|(a, b)| (*a == f && *b == e) || (*a == e && *b == f))
        {
            continue;
        }
        seen.push((f, e));
        let (Some(found), Some(expected)) = (single(&o.found), single(&o.expected)) else {
            cx.error_spanned_by(
                &o.tokens,
                format!(
                    "shape mismatch: cannot prove at compile time that dimension `{}` equals `{}` for every value of the generic parameters\n\n= help: use a single const generic (or a literal) for dimensions that must be equal",
                    o.found, o.expected
                ),
            );
            continue;
        };
        let mut toks = o.tokens.clone().into_iter();
        let first = toks
            .next()
            .map(|t| t.span())
            .unwrap_or_else(Span::call_site);
        let last = toks.last().map(|t| t.span()).unwrap_or(first);
        let check = format_ident!("DimCheck", span = last);
        out.extend(quote_spanned! {first=>
            <::rtx_core::shapes:: #check as ::rtx_core::shapes::DimEq<{ #found }, { #expected }>>::check();
        });
    }
    out
}

fn single(d: &Dim) -> Option<TokenStream> {
    if let Some(n) = d.as_known() {
        return Some(proc_macro2::Literal::usize_unsuffixed(n).to_token_stream());
    }
    match d.as_single_atom() {
        Some(Atom::Param(p)) => {
            let id = format_ident!("{}", p);
            Some(quote!(#id))
        }
        _ => None,
    }
}
