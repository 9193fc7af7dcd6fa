//! The steps of a schedule as Rust source text (see [`StepText`]).

use proc_macro2::TokenStream;
use rtx_ir::{Atom, Dim, GraphFn, NodeId};
use std::collections::HashMap;

/// The steps of a schedule as Rust source text, parsed into tokens once at the end: a
/// schedule is thousands of statements of integers and names, and building each token
/// through the compiler's proc-macro interface took most of a large model's expansion time.
/// Shapes are bound once each at the top (`let __shape3: [usize; 3] = [..];`).
#[derive(Default)]
pub struct StepText {
    shapes: HashMap<String, usize>,
    bindings: String,
    steps: String,
}

impl StepText {
    /// `&__shapeK`, the run-time shape of node `id`, bound on first use.
    pub fn shape(&mut self, ir: &GraphFn, id: NodeId) -> String {
        let dims: Vec<String> = ir.graph.node(id).shape.iter().map(dim_text).collect();
        let text = dims.join(", ");
        let next = self.shapes.len();
        let k = *self.shapes.entry(text.clone()).or_insert_with(|| {
            self.bindings.push_str(&format!(
                "let __shape{next}: [usize; {}] = [{text}];\n",
                dims.len()
            ));
            next
        });
        format!("&__shape{k}")
    }

    pub fn line(&mut self, step: String) {
        self.steps.push_str(&step);
        self.steps.push('\n');
    }

    /// The bindings and the steps as tokens. Text this file wrote always parses; if it
    /// ever did not, the error is reported where the model is, as an internal error.
    pub fn finish(self) -> TokenStream {
        let text = format!("{}{}", self.bindings, self.steps);
        text.parse().unwrap_or_else(|e| {
            syn::Error::new(
                proc_macro2::Span::call_site(),
                format!("internal error: a generated schedule does not parse ({e}); please report this with the model"),
            )
            .to_compile_error()
        })
    }
}

/// `3, 7, 9`: the items of an array literal.
pub fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `expand_schedule::dim_expr` as source text.
fn dim_text(d: &Dim) -> String {
    let terms: Vec<String> = d
        .terms()
        .map(|(atoms, coeff)| {
            let mut t = format!("({coeff}i64");
            for a in atoms {
                t.push_str(" * ");
                t.push_str(&atom_text(a));
            }
            t.push(')');
            t
        })
        .collect();
    if terms.is_empty() {
        return "0usize".to_string();
    }
    format!("((0i64 + {}) as usize)", terms.join(" + "))
}

fn atom_text(a: &Atom) -> String {
    match a {
        Atom::Sym(n) => format!("(__d_{n} as i64)"),
        Atom::Param(n) => format!("({n} as i64)"),
        Atom::FloorDiv(inner, k) => format!(
            "(({} as i64).div_euclid({}i64))",
            dim_text(inner),
            *k as i64
        ),
    }
}
