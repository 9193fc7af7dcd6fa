//! `impl rtx_core::Model` for a model whose graph has the functions generic training code
//! calls, so training loops over any model need no trait written per model.

use crate::internals::ast::GraphDef;
use proc_macro2::TokenStream;
use quote::quote;

/// `impl rtx_core::Model` when the graph has the two functions generic training code calls:
/// `forward(x)` and a scalar `loss(x, y)`. The trait's methods call the inherent ones (which
/// path resolution prefers), so both spellings run the same compiled code.
pub fn emit_model_trait(
    graph: &GraphDef,
    generics: &syn::Generics,
    self_ty: &syn::Type,
) -> TokenStream {
    let has = |name: &str, inputs: usize, scalar: bool| {
        graph
            .fns
            .iter()
            .any(|f| f.name == name && f.inputs.len() == inputs && (!scalar || f.output.is_empty()))
    };
    if !(has("forward", 1, false) && has("loss", 2, true)) {
        return TokenStream::new();
    }
    let (impl_g, _, where_g) = generics.split_for_impl();
    quote! {
        impl #impl_g ::rtx_core::Model for #self_ty #where_g {
            fn forward(&self, x: &::rtx_core::Tensor) -> ::rtx_core::Result<::rtx_core::Tensor> {
                <#self_ty>::forward(self, x)
            }
            fn loss(&self, x: &::rtx_core::Tensor, y: &::rtx_core::Tensor) -> ::rtx_core::Result<::rtx_core::Tensor> {
                <#self_ty>::loss(self, x, y)
            }
            fn loss_and_grads(&self, ctx: &mut ::rtx_core::Ctx, x: &::rtx_core::Tensor, y: &::rtx_core::Tensor) -> ::rtx_core::Result<(::rtx_core::Tensor, ::rtx_core::Grads)> {
                <#self_ty>::loss_and_grads(self, ctx, x, y)
            }
        }
    }
}
