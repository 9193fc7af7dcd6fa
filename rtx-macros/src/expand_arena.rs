//! The `Slots` a compiled call starts from. A function whose shapes are all static (no
//! symbol, no generic dimension) gets its arena plan now: `rtx_ir::memory::arena_plan` runs at
//! expansion and its offsets are emitted as a `static` `rtx_core::planned::StaticPlan`, so the
//! call never plans at run time. Any other function plans on entry from its symbol values
//! (`rtx-core/src/planned.rs`, cached per values).

use proc_macro2::{Ident, TokenStream};
use quote::quote;
use rtx_ir::GraphFn;
use rtx_ir::graph::NodeId;
use std::collections::HashMap;

/// The compile-time arena plan of nodes `0..upto` of `ir` with results `roots`, as the body of
/// a function returning `&'static StaticPlan`; `None` when a shape is not static.
pub fn static_plan(ir: &GraphFn, upto: usize, roots: &[NodeId]) -> Option<TokenStream> {
    let upto = upto.min(ir.graph.len());
    // Checked first: planning a large symbolic graph only to find a symbol costs expansion time.
    let all_static = ir.graph.nodes[..upto]
        .iter()
        .all(|n| n.shape.iter().all(|d| d.as_known().is_some()));
    if !all_static {
        return None;
    }
    let steps = rtx_ir::fusion::plan(&ir.graph, upto, roots);
    let passes: Vec<bool> = steps.iter().map(|s| s.only_rounds()).collect();
    let plan = rtx_ir::memory::arena_plan(ir, &steps, roots, &HashMap::new(), &passes)?;
    let (buffer_of, offsets, lens) = (&plan.buffer_of, &plan.offsets, &plan.lens);
    Some(quote! {
        static __RTX_ARENA: ::rtx_core::planned::StaticPlan =
            ::rtx_core::planned::StaticPlan::new(&[#(#buffer_of),*], &[#(#offsets),*], &[#(#lens),*]);
        &__RTX_ARENA
    })
}

/// The `Slots` constructor of a call: from the static plan's accessor `plan_fn` when there is
/// one, else planned on entry.
pub fn slots_expr(
    plan_fn: Option<&Ident>,
    slots: usize,
    upto: usize,
    roots: &[NodeId],
    dims: &TokenStream,
) -> TokenStream {
    match plan_fn {
        Some(plan_fn) => quote! {
            ::rtx_core::slots::Slots::planned_static(#slots, __ctx.fusion(), Self::#plan_fn())
        },
        None => quote! {
            ::rtx_core::slots::Slots::planned(
                #slots, __ctx.fusion(), __f, #upto, &[#(#roots),*], #dims,
            )
        },
    }
}
