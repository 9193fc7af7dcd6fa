//! The IR executor: runs a `GraphFn` node by node through `ops::run_op`, the same dispatch the
//! compiled code uses. It serves graphs loaded from JSON and checks compiled models against
//! their own IR in tests.

use crate::ctx::Ctx;
use crate::error::{Result, RtxError};
use crate::ops::run_op;
use crate::tensor::Tensor;
use rtx_ir::{Atom, Dim, GraphFn, Op};
use std::collections::HashMap;

/// Evaluates every node of `f` and returns all values (forward and backward).
/// `params` maps dotted names to tensors; `generics` gives the model's const generic values.
pub fn run_graph(
    f: &GraphFn,
    inputs: &[&Tensor],
    params: &dyn Fn(&str) -> Option<Tensor>,
    generics: &HashMap<String, i64>,
    ctx: &mut Ctx,
) -> Result<Vec<Tensor>> {
    let mut env = generics.clone();
    let mut values: Vec<Tensor> = Vec::with_capacity(f.graph.len());
    for node in &f.graph.nodes {
        let v = match &node.op {
            Op::Input {
                index, name, shape, ..
            } => {
                let t = *inputs.get(*index).ok_or_else(|| {
                    RtxError::Invalid(format!(
                        "graph `{}` needs input `{name}` (#{index})",
                        f.name
                    ))
                })?;
                bind(&mut env, name, shape, t)?;
                t.clone()
            }
            Op::Param { name, .. } => {
                params(name).ok_or_else(|| RtxError::Invalid(format!("no parameter `{name}`")))?
            }
            Op::Reshape { shape } => {
                let dims = shape
                    .iter()
                    .map(|d| eval(d, &env).map(Dim::known))
                    .collect::<Result<Vec<Dim>>>()?;
                run_op(&Op::Reshape { shape: dims }, &[&values[node.args[0]]], ctx)?
            }
            op => {
                let args: Vec<&Tensor> = node.args.iter().map(|&a| &values[a]).collect();
                run_op(op, &args, ctx)?
            }
        };
        values.push(v);
    }
    Ok(values)
}

fn eval(d: &Dim, env: &HashMap<String, i64>) -> Result<usize> {
    d.eval(env)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| {
            RtxError::Invalid(format!(
                "dimension `{d}` cannot be evaluated: a symbol or generic parameter has no value"
            ))
        })
}

/// Binds the input's bare symbols and checks its other dims.
fn bind(env: &mut HashMap<String, i64>, name: &str, shape: &[Dim], t: &Tensor) -> Result<()> {
    let mismatch = || RtxError::ShapeMismatch {
        context: format!("graph input `{name}`"),
        expected: rtx_ir::fmt_shape(shape),
        found: crate::tensor::fmt_dims(t.shape()),
    };
    if t.rank() != shape.len() {
        return Err(mismatch());
    }
    for (d, &n) in shape.iter().zip(t.shape()) {
        if let Some(Atom::Sym(s)) = d.as_single_atom()
            && !env.contains_key(s)
        {
            env.insert(s.clone(), n as i64);
            continue;
        }
        if eval(d, env)? != n {
            return Err(mismatch());
        }
    }
    Ok(())
}
