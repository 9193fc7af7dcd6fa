//! What a model whose expansion failed still expands to, next to its errors: the stand-in
//! that keeps calling code and nesting models from adding errors of their own.

use crate::internals::ast::GraphDef;
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

/// What a model whose expansion failed still defines, next to its errors: the impl's own
/// items, every graph function's methods with the signatures they would have (bodies that
/// never run: the crate does not build), `graph()`, and a callback that tells models nesting
/// it that it is broken. Calling code and nesting models then type-check, so the user sees
/// only the real errors, never "no method named `forward`" or a hidden macro's name.
pub fn stand_in(
    item_impl: &syn::ItemImpl,
    graph: Option<&GraphDef>,
    rest: &[syn::ImplItem],
    errors: Option<TokenStream>,
) -> TokenStream {
    let (impl_g, _, where_g) = item_impl.generics.split_for_impl();
    let self_ty = &item_impl.self_ty;
    let attrs = &item_impl.attrs;
    let methods = stand_in_methods(graph);
    let callback = crate::self_type_name(item_impl)
        .map(|name| {
            crate::graph_callback(
                &name,
                quote!(::rtx_core::__model_impl! { @nested { @broken { #name } } $($rest)* }),
            )
        })
        .unwrap_or_default();
    quote! {
        #errors
        #(#attrs)*
        #[allow(unused_variables, dead_code, clippy::all)]
        impl #impl_g #self_ty #where_g {
            #(#rest)*

            pub fn graph() -> ::rtx_core::Result<::rtx_core::ir::ModelIr> {
                ::core::unreachable!()
            }

            #methods
        }
        #callback
    }
}

/// Every graph function's methods with the signatures they would have, and bodies that never
/// run (the crate does not build): `forward`, `forward_with` and, for a scalar result,
/// `forward_and_grads`.
pub fn stand_in_methods(graph: Option<&GraphDef>) -> TokenStream {
    let mut methods = TokenStream::new();
    for f in graph.map(|g| g.fns.as_slice()).unwrap_or_default() {
        let name = &f.name;
        let with = format_ident!("{}_with", name);
        let args: Vec<&syn::Ident> = f.inputs.iter().map(|i| &i.name).collect();
        methods.extend(quote! {
            #[allow(unused_variables)]
            pub fn #name(&self, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<::rtx_core::Tensor> {
                ::core::unreachable!()
            }
            #[allow(unused_variables)]
            pub fn #with(&self, __ctx: &mut ::rtx_core::Ctx, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<::rtx_core::Tensor> {
                ::core::unreachable!()
            }
        });
        if f.output.is_empty() {
            let and_grads = format_ident!("{}_and_grads", name);
            methods.extend(quote! {
                #[allow(unused_variables)]
                pub fn #and_grads(&self, __ctx: &mut ::rtx_core::Ctx, #(#args: &::rtx_core::Tensor),*) -> ::rtx_core::Result<(::rtx_core::Tensor, ::rtx_core::Grads)> {
                    ::core::unreachable!()
                }
            });
        }
    }
    methods
}
