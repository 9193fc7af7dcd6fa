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
mod expand_struct;
mod internals;

use proc_macro::TokenStream;
use quote::{format_ident, quote};

/// Marks a model struct (fields are layers, parameters or nested models) or the impl that
/// holds its `graph!` block.
#[proc_macro_attribute]
pub fn model(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        let attr2: proc_macro2::TokenStream = attr.into();
        return syn::Error::new_spanned(attr2, "#[model] takes no arguments").to_compile_error().into();
    }
    let item2: proc_macro2::TokenStream = item.clone().into();
    if let Ok(s) = syn::parse::<syn::ItemStruct>(item.clone()) {
        return expand_struct::expand(s).unwrap_or_else(|e| e.to_compile_error()).into();
    }
    match syn::parse::<syn::ItemImpl>(item) {
        Ok(i) => {
            let Some(name) = self_type_name(&i) else {
                return syn::Error::new_spanned(&i.self_ty, "#[model] impl needs a plain struct type").to_compile_error().into();
            };
            let callback = format_ident!("__rtx_model_{}", name);
            quote!(#callback! { @impl { #i } }).into()
        }
        Err(_) => syn::Error::new_spanned(item2, "#[model] goes on a struct or on the impl that holds its graph! block").to_compile_error().into(),
    }
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
        Ok(i) => expand_graph::expand(i).unwrap_or_else(|e| e.to_compile_error()).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// `graph!` is read by `#[model]` on the enclosing impl; on its own it is an error.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    let input: proc_macro2::TokenStream = input.into();
    syn::Error::new_spanned(input, "graph! must be inside an impl marked #[model]\n\n= help: write `#[model] impl MyModel { graph! { .. } }`")
        .to_compile_error()
        .into()
}
