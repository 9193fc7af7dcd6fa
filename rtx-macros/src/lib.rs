//! rtx-macros: `#[model]` and `graph!`, the compiler front end of RustyTorch++.
//!
//! In the map of DESIGN.md this crate runs `rtx-ir` at compile time: it parses a model struct
//! and its `graph!` functions, infers every shape (errors point at the user's sub-expression),
//! derives the backward pass on the IR and emits Rust that calls `rtx_core::ops::run_op` node
//! by node. `rtx-core` re-exports the macros, so users import only `rtx_core::prelude::*`.
//!
//! A macro sees one item, so `#[model]` on the struct emits a hidden `macro_rules!` callback
//! holding the struct's definition; `#[model]` on the impl expands to a call of that callback,
//! which comes back into `__model_impl!` with both items (nested models arrive the same way).

mod expand_graph;
mod expand_schedule;
mod expand_struct;
mod internals;

use proc_macro::TokenStream;
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

/// The name of a model's hidden callback macro: `__rtx_model_Mlp_<hash>` (struct side) or
/// `__rtx_graph_Mlp_<hash>` (impl side). The hash of the type name keeps the names of two
/// similar types far apart, so a misspelled type never draws rustc's "a macro with a similar
/// name exists" suggestion, which would propose the hidden macro as the fix.
pub(crate) fn callback_ident(kind: &str, type_name: &str, span: proc_macro2::Span) -> syn::Ident {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in type_name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    syn::Ident::new(&format!("__rtx_{kind}_{type_name}_{h:016x}"), span)
}

fn self_type_name(i: &syn::ItemImpl) -> Option<syn::Ident> {
    match &*i.self_ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.clone()),
        _ => None,
    }
}

/// Internal: the second stage of `#[model] impl`, reached through the struct's callback.
#[doc(hidden)]
#[proc_macro]
pub fn __model_impl(input: TokenStream) -> TokenStream {
    match syn::parse::<expand_graph::ImplInput>(input) {
        Ok(i) => expand_graph::expand(i)
            .unwrap_or_else(|e| e.to_compile_error())
            .into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// `graph!` is read by `#[model]` on the enclosing impl; on its own it is an error.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    let _ = input;
    // Spans the whole `graph! { .. }` invocation: the error is where graph! stands.
    syn::Error::new(proc_macro2::Span::call_site(), "graph! must be inside an impl marked #[model]\n\n= help: add `#[model]` on the line above the `impl` that holds this graph! block")
        .to_compile_error()
        .into()
}
