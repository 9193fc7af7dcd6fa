//! Float64 reference of `TopK`, `TopKIndices` and `TopKGrad`: each row fully sorted.

use super::{Array, R};

/// Each row's positions of its `k` largest values: largest first, NaN first of all, equal
/// values by position.
fn top_k_positions(x: &Array, k: usize) -> R<(usize, Vec<Vec<usize>>)> {
    let Some(&n) = x.shape.last() else {
        return Err("top_k needs a last axis, found a scalar".into());
    };
    if k == 0 || k > n {
        return Err(format!(
            "top_k: k = {k} must be between 1 and the last axis' {n}"
        ));
    }
    let order = |row: &[f64], a: usize, b: usize| {
        let (p, q) = (row[a], row[b]);
        match (p.is_nan(), q.is_nan()) {
            (true, true) => a.cmp(&b),
            (true, false) => std::cmp::Ordering::Less,
            (false, true) => std::cmp::Ordering::Greater,
            (false, false) => q
                .partial_cmp(&p)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b)),
        }
    };
    let rows = x
        .data
        .chunks(n.max(1))
        .map(|row| {
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by(|&a, &b| order(row, a, b));
            idx.truncate(k);
            idx
        })
        .collect();
    Ok((n, rows))
}

pub(super) fn top_k(x: &Array, k: usize, indices: bool) -> R<Array> {
    let (n, rows) = top_k_positions(x, k)?;
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap_or(&mut 0) = k;
    let data = rows
        .iter()
        .enumerate()
        .flat_map(|(r, idx)| {
            idx.iter()
                .map(move |&j| if indices { j as f64 } else { x.data[r * n + j] })
        })
        .collect();
    Ok(Array { shape, data })
}

pub(super) fn top_k_grad(x: &Array, g: &Array, k: usize) -> R<Array> {
    let (n, rows) = top_k_positions(x, k)?;
    if g.data.len() != rows.len() * k {
        return Err(format!(
            "top_k_grad: g {:?} does not fit top-{k} of {:?}",
            g.shape, x.shape
        ));
    }
    let mut data = vec![0.0; x.data.len()];
    for (r, idx) in rows.iter().enumerate() {
        for (i, &j) in idx.iter().enumerate() {
            data[r * n + j] = g.data[r * k + i];
        }
    }
    Ok(Array {
        shape: x.shape.clone(),
        data,
    })
}
