//! `#[model]` on a struct: the `Module` impl (seeded init, parameter visitors) and the hidden
//! callback macro that hands the struct's definition to its `#[model] impl`.

use crate::internals::ast::ModelStruct;
use crate::internals::ctxt::Ctxt;
use proc_macro2::TokenStream;
use quote::quote;
use std::collections::HashMap;

pub fn expand(item: syn::ItemStruct) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let model = ModelStruct::from_item(&item, &HashMap::new(), &cx);
    let name = &item.ident;
    if let Err(e) = cx.check() {
        // Report the struct's errors only. A field-less stand-in keeps the type defined, with
        // its `Module` impl, and its callback tells the `#[model] impl` that the struct is
        // broken, so that expansion still gives the type its graph functions: the code that
        // calls them, and the models that nest this one, add no errors of their own.
        let errors = e.to_compile_error();
        let vis = &item.vis;
        let all_const = item
            .generics
            .params
            .iter()
            .all(|p| matches!(p, syn::GenericParam::Const(_)));
        let generics = if all_const {
            item.generics.clone()
        } else {
            syn::Generics::default()
        };
        let (impl_g, ty_g, where_g) = generics.split_for_impl();
        let callback = crate::struct_callback(
            name,
            quote!(::rtx_core::__model_impl! { @broken { #name } $($rest)* }),
        );
        return Ok(quote! {
            #errors
            #[allow(dead_code)]
            #vis struct #name #generics {}
            #[allow(unused_variables)]
            impl #impl_g ::rtx_core::Module for #name #ty_g #where_g {
                fn init_with(rng: &mut ::rtx_core::Rng) -> Self {
                    Self {}
                }
                fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &::rtx_core::Tensor)) {}
                fn visit_params_mut<'__a>(&'__a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'__a mut ::rtx_core::Tensor)) {}
            }
            #callback
        });
    }
    let (impl_g, ty_g, where_g) = item.generics.split_for_impl();
    let fields: Vec<&syn::Ident> = model.fields.iter().map(|f| &f.name).collect();
    let tys: Vec<&syn::Type> = model.fields.iter().map(|f| &f.ty).collect();
    let names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
    let accessors: Vec<syn::Ident> = fields
        .iter()
        .map(|f| quote::format_ident!("__rtx_field_{}", f))
        .collect();
    let callback = crate::struct_callback(
        name,
        quote!(::rtx_core::__model_impl! { @struct { #item } $($rest)* }),
    );
    Ok(quote! {
        #item

        // Read access to every field for models that nest this one from another module
        // (their generated code reads the parameters of this model's layers).
        #[allow(private_interfaces, dead_code, non_snake_case)]
        impl #impl_g #name #ty_g #where_g {
            #(
                #[doc(hidden)]
                #[inline(always)]
                pub fn #accessors(&self) -> &#tys {
                    &self.#fields
                }
            )*
        }

        impl #impl_g ::rtx_core::Module for #name #ty_g #where_g {
            fn init_with(rng: &mut ::rtx_core::Rng) -> Self {
                Self { #( #fields: <#tys as ::rtx_core::Module>::init_with(rng), )* }
            }
            fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &::rtx_core::Tensor)) {
                #( ::rtx_core::with_name(prefix, #names, |name| ::rtx_core::Module::visit_params(&self.#fields, name, f)); )*
            }
            fn visit_params_mut<'__a>(&'__a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'__a mut ::rtx_core::Tensor)) {
                #( ::rtx_core::with_name(prefix, #names, |name| ::rtx_core::Module::visit_params_mut(&mut self.#fields, name, f)); )*
            }
        }

        // The struct's definition, for the `#[model] impl` that holds its graph: a macro
        // sees one item, so the impl's expansion calls back here to read the fields.
        #callback
    })
}
