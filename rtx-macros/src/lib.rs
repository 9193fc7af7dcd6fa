//! rtx-macros: `#[model]` and `graph!`, the compiler front end of RustyTorch++.
//!
//! In the map of DESIGN.md this crate runs `rtx-ir` at compile time: it parses a model struct
//! and its `graph!` functions, infers every shape (errors point at the user's sub-expression),
//! derives the backward pass on the IR, rewrites and fuses it, and emits the Rust schedule
//! that runs it. `rtx-core` re-exports the macros, so users import only `rtx_core::prelude::*`.
//!
//! A macro sees one item, so `#[model]` on the struct emits a hidden `macro_rules!` callback
//! holding the struct's definition; `#[model]` on the impl expands to a call of that callback,
//! which comes back into `__model_impl!` with both items (nested models arrive the same way).

mod expand_arena;
mod expand_graph;
mod expand_kernels;
mod expand_model_trait;
mod expand_obligations;
mod expand_rows;
mod expand_schedule;
mod expand_stand_in;
mod expand_step_text;
mod expand_struct;
mod internals;
mod timing;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;

/// Marks a model struct (fields are layers, parameters or nested models) or the impl that
/// holds its `graph!` block.
#[proc_macro_attribute]
pub fn model(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        let attr2: proc_macro2::TokenStream = attr.into();
        return syn::Error::new_spanned(attr2, "#[model] takes no arguments")
            .to_compile_error()
            .into();
    }
    let item2: proc_macro2::TokenStream = item.clone().into();
    if let Ok(s) = syn::parse::<syn::ItemStruct>(item.clone()) {
        return expand_struct::expand(s)
            .unwrap_or_else(|e| e.to_compile_error())
            .into();
    }
    match syn::parse::<syn::ItemImpl>(item) {
        Ok(i) => {
            let Some(name) = self_type_name(&i) else {
                return syn::Error::new_spanned(
                    &i.self_ty,
                    "#[model] impl needs a plain struct type",
                )
                .to_compile_error()
                .into();
            };
            let callback = callback_ident("model", &name.to_string(), name.span());
            // The empty impl makes rustc report a misspelled type as "cannot find type", with
            // its did-you-mean, next to the unavoidable "cannot find macro" of the callback.
            let (impl_g, _, where_g) = i.generics.split_for_impl();
            let self_ty = &i.self_ty;
            quote!(#callback! { @impl { #i } } impl #impl_g #self_ty #where_g {}).into()
        }
        Err(_) => syn::Error::new_spanned(
            item2,
            "#[model] goes on a struct or on the impl that holds its graph! block",
        )
        .to_compile_error()
        .into(),
    }
}

/// The name of a model's hidden callback macros: `__rtx_model_Mlp_<hash>` (from the struct,
/// for its impl) and `__rtx_graph_Mlp_<hash>` (from the impl, for nesting models; they reach
/// it under the type's own name, see `graph_callback`). The hash of the type name keeps two
/// similar names apart, so rustc never suggests one for the other.
pub(crate) fn callback_ident(kind: &str, type_name: &str, span: proc_macro2::Span) -> syn::Ident {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in type_name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    syn::Ident::new(&format!("__rtx_{kind}_{type_name}_{h:016x}"), span)
}

/// The macro `#[model]` on a struct leaves for its `#[model] impl` (in the same module), which
/// calls it with `@impl { .. }`; it answers with `on_impl`.
pub(crate) fn struct_callback(name: &syn::Ident, on_impl: TokenStream2) -> TokenStream2 {
    let model = callback_ident("model", &name.to_string(), name.span());
    quote! {
        #[doc(hidden)]
        #[allow(unused_macros)]
        macro_rules! #model {
            ($($rest:tt)*) => { #on_impl };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        pub(crate) use #model;
    }
}

/// The macro `#[model]` on an impl leaves for models that nest this one: it answers with
/// `on_request` (this model's definition, or `@broken { Name }`). It is exported under the
/// type's own name (macros and types live in different namespaces), so wherever the type is
/// in scope (defined there, imported with `use`, or named by a path) the nesting model reaches
/// it by the path it wrote for the field's type, and a misspelled type reads "cannot find
/// macro `Encodr`", never a hidden name.
pub(crate) fn graph_callback(name: &syn::Ident, on_request: TokenStream2) -> TokenStream2 {
    let graph = callback_ident("graph", &name.to_string(), name.span());
    quote! {
        #[doc(hidden)]
        #[allow(unused_macros)]
        macro_rules! #graph {
            ($($rest:tt)*) => { #on_request };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        pub(crate) use #graph as #name;
    }
}

pub(crate) fn self_type_name(i: &syn::ItemImpl) -> Option<syn::Ident> {
    match &*i.self_ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.clone()),
        _ => None,
    }
}

/// Internal: the second stage of `#[model] impl`, reached through the struct's callback.
#[doc(hidden)]
#[proc_macro]
pub fn __model_impl(input: TokenStream) -> TokenStream {
    let input: TokenStream2 = input.into();
    // Tokens that reached here through a callback's body (the struct's fields, a nested
    // model's definition) carry that callback's expansion, and rustc would end every error on
    // them with "this error originates in the macro `__rtx_graph_..`". The user's impl came
    // through as an argument and has none: give every token its resolution, keeping its place.
    let input = match syn::parse2::<expand_graph::ImplInput>(input.clone()) {
        Ok(parsed) => respan_sections(input, parsed.item_impl.impl_token.span),
        Err(_) => input,
    };
    match syn::parse2::<expand_graph::ImplInput>(input) {
        Ok(i) => expand_graph::expand(i)
            .unwrap_or_else(|e| e.to_compile_error())
            .into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The sections of `__model_impl!`'s input (`@struct { .. } @impl { .. } @nested { .. }`)
/// respanned by `respan`, except the user's impl: it arrived as a macro argument, with the
/// user's own resolution, which its methods keep.
fn respan_sections(tokens: TokenStream2, anchor: proc_macro2::Span) -> TokenStream2 {
    let mut tag = String::new();
    tokens
        .into_iter()
        .map(|tt| match &tt {
            proc_macro2::TokenTree::Ident(i) => {
                tag = i.to_string();
                tt
            }
            proc_macro2::TokenTree::Group(_) if tag != "impl" => respan_tree(tt, anchor),
            _ => tt,
        })
        .collect()
}

/// `tokens` with every span resolving like `anchor` but located where it was.
fn respan(tokens: TokenStream2, anchor: proc_macro2::Span) -> TokenStream2 {
    tokens
        .into_iter()
        .map(|tt| respan_tree(tt, anchor))
        .collect()
}

fn respan_tree(
    mut tt: proc_macro2::TokenTree,
    anchor: proc_macro2::Span,
) -> proc_macro2::TokenTree {
    if let proc_macro2::TokenTree::Group(g) = &tt {
        let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), anchor));
        group.set_span(anchor.located_at(g.span()));
        return proc_macro2::TokenTree::Group(group);
    }
    tt.set_span(anchor.located_at(tt.span()));
    tt
}

/// `graph!` is read by `#[model]` on the enclosing impl; on its own it is an error.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    // Spans the whole `graph! { .. }` invocation: the error is where graph! stands.
    let error = syn::Error::new(proc_macro2::Span::call_site(), "graph! must be inside an impl marked #[model]\n\n= help: add `#[model]` on the line above the `impl` that holds this graph! block")
        .to_compile_error();
    // The block stands among the impl's items: it still gives the type its graph methods, so
    // the code that calls them reports nothing more.
    let graph =
        syn::parse2::<internals::ast::GraphDef>(internals::ast::where_as_raw_ident(input.into()))
            .ok();
    let methods = expand_stand_in::stand_in_methods(graph.as_ref());
    quote!(#error #methods).into()
}
