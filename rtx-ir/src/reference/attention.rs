//! Float64 reference of `Attention` and `AttentionGrad`: the weights of each slice computed
//! whole (a `[Tq, Tk]` matrix, which the fast kernel never stores), then plain sums.

use super::{Array, R, numel};

/// Slices, query rows, key rows, width and value width of attention operands, checked.
fn attention_dims(q: &Array, k: &Array, v: &Array, causal: bool) -> R<[usize; 5]> {
    let r = q.shape.len();
    let fits = r >= 2
        && k.shape.len() == r
        && v.shape.len() == r
        && q.shape[..r - 2] == k.shape[..r - 2]
        && k.shape[..r - 2] == v.shape[..r - 2]
        && q.shape[r - 1] == k.shape[r - 1]
        && k.shape[r - 2] == v.shape[r - 2]
        && (!causal || q.shape[r - 2] == k.shape[r - 2]);
    if !fits {
        return Err(format!(
            "attention operands q {:?}, k {:?}, v {:?} do not fit [.., Tq, D], [.., Tk, D], [.., Tk, Dv]",
            q.shape, k.shape, v.shape
        ));
    }
    let slices = numel(&q.shape[..r - 2])?;
    Ok([
        slices,
        q.shape[r - 2],
        k.shape[r - 2],
        q.shape[r - 1],
        v.shape[r - 1],
    ])
}

/// Softmax weights `[tq, tk]` of one slice (hidden keys get 0).
fn attention_weights(
    q: &[f64],
    k: &[f64],
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut w = vec![0.0; tq * tk];
    for i in 0..tq {
        let end = if causal { i + 1 } else { tk };
        let row = &mut w[i * tk..(i + 1) * tk];
        for j in 0..end {
            row[j] = (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * scale;
        }
        let max = row[..end].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row[..end]
            .iter_mut()
            .map(|x| {
                *x = (*x - max).exp();
                *x
            })
            .sum();
        row[..end].iter_mut().for_each(|x| *x /= total);
    }
    w
}

pub(super) fn attention(q: &Array, k: &Array, v: &Array, causal: bool) -> R<Array> {
    let [slices, tq, tk, d, dv] = attention_dims(q, k, v, causal)?;
    let mut shape = q.shape.clone();
    *shape.last_mut().unwrap_or(&mut 0) = dv;
    let mut data = vec![0.0; slices * tq * dv];
    for s in 0..slices {
        let (qs, ks) = (
            &q.data[s * tq * d..(s + 1) * tq * d],
            &k.data[s * tk * d..(s + 1) * tk * d],
        );
        let vs = &v.data[s * tk * dv..(s + 1) * tk * dv];
        let w = attention_weights(qs, ks, tq, tk, d, causal);
        for i in 0..tq {
            for c in 0..dv {
                data[(s * tq + i) * dv + c] = (0..tk).map(|j| w[i * tk + j] * vs[j * dv + c]).sum();
            }
        }
    }
    Ok(Array { shape, data })
}

/// `[3, ..q]`: the gradients of `attention` for q, k, v (one shape) given the output's `g`.
pub(super) fn attention_grad(q: &Array, k: &Array, v: &Array, g: &Array, causal: bool) -> R<Array> {
    let [slices, t, _, d, _] = attention_dims(q, k, v, causal)?;
    if q.shape != k.shape || k.shape != v.shape || g.shape != q.shape {
        return Err(format!(
            "attention_grad needs q, k, v and g of one shape, found {:?}, {:?}, {:?}, {:?}",
            q.shape, k.shape, v.shape, g.shape
        ));
    }
    let scale = 1.0 / (d as f64).sqrt();
    let part = slices * t * d;
    let mut shape = vec![3];
    shape.extend(&q.shape);
    let mut data = vec![0.0; 3 * part];
    for s in 0..slices {
        let range = s * t * d..(s + 1) * t * d;
        let (qs, ks) = (&q.data[range.clone()], &k.data[range.clone()]);
        let (vs, gs) = (&v.data[range.clone()], &g.data[range]);
        let w = attention_weights(qs, ks, t, t, d, causal);
        let o = s * t * d;
        for i in 0..t {
            // dW = g v^T; dS = W * (dW - sum_j W dW)
            let dw: Vec<f64> = (0..t)
                .map(|j| (0..d).map(|c| gs[i * d + c] * vs[j * d + c]).sum())
                .collect();
            let dot: f64 = (0..t).map(|j| w[i * t + j] * dw[j]).sum();
            for j in 0..t {
                let ds = w[i * t + j] * (dw[j] - dot) * scale;
                for c in 0..d {
                    data[o + i * d + c] += ds * ks[j * d + c];
                    data[part + o + j * d + c] += ds * qs[i * d + c];
                    data[2 * part + o + j * d + c] += w[i * t + j] * gs[i * d + c];
                }
            }
        }
    }
    Ok(Array { shape, data })
}
