use rtx_backends::Layout;
use rtx_backends::cpu::{
    KernelError, concat, gather_rows, pad_narrow, pick_last, pick_last_grad, scatter_add_rows,
};

use crate::common::*;

#[test]
fn concat_matches_reference_on_each_axis() {
    let mut rng = Rng::new(70);
    for axis in 0..3 {
        let sizes = [2, 1, 3];
        let shapes: Vec<Vec<usize>> = sizes
            .iter()
            .map(|&s| {
                let mut shape = vec![4, 3, 5];
                shape[axis] = s;
                shape
            })
            .collect();
        let views = [View::Reversed, View::Contiguous, View::Narrowed];
        let inputs: Vec<(Vec<f32>, Layout)> = shapes
            .iter()
            .zip(views)
            .map(|(shape, view)| random_view(&mut rng, shape, view))
            .collect();
        let refs: Vec<(&[f32], &Layout)> = inputs.iter().map(|(d, l)| (d.as_slice(), l)).collect();
        let (got, shape) = concat(&refs, axis).unwrap();
        let mut want_shape = vec![4, 3, 5];
        want_shape[axis] = 6;
        assert_eq!(shape.as_slice(), &want_shape[..]);
        let values: Vec<Vec<f64>> = inputs.iter().map(|(d, l)| read(d, l)).collect();
        let want: Vec<f64> = (0..numel(&want_shape))
            .map(|linear| {
                let mut index = unravel(linear, &want_shape);
                let mut part = 0;
                while index[axis] >= sizes[part] {
                    index[axis] -= sizes[part];
                    part += 1;
                }
                values[part][ravel(&index, &shapes[part])]
            })
            .collect();
        assert_close(&got, &want, 0.0, 0.0, &format!("axis {axis}"));
    }
}

#[test]
fn pad_narrow_places_the_gradient() {
    let mut rng = Rng::new(71);
    for axis in 0..3 {
        let mut shape = vec![3, 4, 5];
        shape[axis] = 2;
        let (g, lg) = random_view(&mut rng, &shape, View::Reversed);
        let gv = read(&g, &lg);
        let (start, full_len) = (1, 4);
        let mut full_shape = shape.clone();
        full_shape[axis] = full_len;
        let want: Vec<f64> = (0..numel(&full_shape))
            .map(|linear| {
                let mut index = unravel(linear, &full_shape);
                if index[axis] < start || index[axis] >= start + 2 {
                    return 0.0;
                }
                index[axis] -= start;
                gv[ravel(&index, &shape)]
            })
            .collect();
        assert_close(
            &pad_narrow(&g, &lg, axis, start, full_len).unwrap(),
            &want,
            0.0,
            0.0,
            &format!("axis {axis}"),
        );
    }
}

#[test]
fn gather_rows_reads_any_table_layout() {
    let mut rng = Rng::new(72);
    let (vocab, dim) = (11, 6);
    let ids: Vec<i64> = (0..15).map(|_| rng.below(vocab) as i64).collect();
    for view in [View::Contiguous, View::Reversed, View::Narrowed] {
        let (table, lt) = random_view(&mut rng, &[vocab, dim], view);
        let tv = read(&table, &lt);
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&id| tv[id as usize * dim..(id as usize + 1) * dim].to_vec())
            .collect();
        assert_close(
            &gather_rows(&table, &lt, &ids).unwrap(),
            &want,
            0.0,
            0.0,
            &format!("{view:?}"),
        );
    }
}

#[test]
fn scatter_add_rows_sums_repeated_ids() {
    let mut rng = Rng::new(73);
    // The second size crosses the parallel threshold (bucketed path).
    for (count, vocab, dim) in [(20, 7, 5), (3000, 50, 16)] {
        let ids: Vec<i64> = (0..count).map(|_| rng.below(vocab) as i64).collect();
        let (g, lg) = random_view(&mut rng, &[count, dim], View::Reversed);
        let gv = read(&g, &lg);
        let mut want = vec![0.0; vocab * dim];
        for (i, &id) in ids.iter().enumerate() {
            for j in 0..dim {
                want[id as usize * dim + j] += gv[i * dim + j];
            }
        }
        assert_close(
            &scatter_add_rows(&g, &lg, &ids, vocab).unwrap(),
            &want,
            1e-5,
            1e-4,
            &format!("{count} ids"),
        );
    }
}

#[test]
fn pick_last_reads_each_rows_index_through_any_view() {
    let mut rng = Rng::new(74);
    for view in [View::Contiguous, View::Reversed, View::Narrowed] {
        let (x, l) = random_view(&mut rng, &[3, 2, 5], view);
        let ids: Vec<i64> = (0..6).map(|_| rng.below(5) as i64).collect();
        let got = pick_last(&x, &l, &ids).unwrap();
        let values = read(&x, &l);
        let want: Vec<f64> = ids
            .iter()
            .enumerate()
            .map(|(r, &j)| values[r * 5 + j as usize])
            .collect();
        assert_close(&got, &want, 0.0, 0.0, "pick_last");
    }
}

#[test]
fn pick_last_grad_places_each_value_at_its_index() {
    let g = [1.5f32, -2.0, 3.0];
    let got = pick_last_grad(&g, &Layout::contiguous(&[3]), &[2, 0, 2], &[3, 4]).unwrap();
    let want = [0.0, 0.0, 1.5, 0.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0];
    assert_eq!(got, want);
}

#[test]
fn pick_last_refuses_an_index_outside_the_row() {
    let x = vec![0.0f32; 6];
    let l = Layout::contiguous(&[2, 3]);
    for bad in [3, -1] {
        let err = pick_last(&x, &l, &[0, bad]).unwrap_err();
        assert_eq!(
            err,
            KernelError::Index {
                kernel: "pick",
                position: 1,
                value: bad,
                limit: 3
            }
        );
        assert!(
            pick_last_grad(&[1.0, 1.0], &Layout::contiguous(&[2]), &[0, bad], &[2, 3]).is_err()
        );
    }
}

#[test]
fn kernels_refuse_a_layout_that_reads_past_its_buffer() {
    let x = vec![0.0f32; 5];
    let err = pick_last(&x, &Layout::contiguous(&[2, 3]), &[0, 0]).unwrap_err();
    assert!(matches!(err, KernelError::View { arg: "x", .. }), "{err}");
    assert!(err.to_string().contains("5 values"), "{err}");
}

#[test]
fn pick_last_refuses_a_count_of_indices_that_is_not_one_per_row() {
    let x = vec![0.0f32; 6];
    let err = pick_last(&x, &Layout::contiguous(&[2, 3]), &[0]).unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn gather_rows_refuses_an_id_outside_the_table() {
    let table = vec![0.0f32; 4 * 3];
    let err = gather_rows(&table, &Layout::contiguous(&[4, 3]), &[1, 4]).unwrap_err();
    assert_eq!(
        err,
        KernelError::Index {
            kernel: "gather_rows",
            position: 1,
            value: 4,
            limit: 4
        }
    );
}

#[test]
fn gather_rows_refuses_a_table_that_is_not_a_matrix() {
    let table = vec![0.0f32; 12];
    let err = gather_rows(&table, &Layout::contiguous(&[12]), &[0]).unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn scatter_add_rows_refuses_an_id_outside_the_vocabulary() {
    let g = vec![0.0f32; 2 * 3];
    let err = scatter_add_rows(&g, &Layout::contiguous(&[2, 3]), &[0, -1], 5).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Index {
                position: 1,
                value: -1,
                limit: 5,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn scatter_add_rows_refuses_a_gradient_with_another_row_count_than_ids() {
    let g = vec![0.0f32; 3 * 3];
    let err = scatter_add_rows(&g, &Layout::contiguous(&[3, 3]), &[0, 1], 5).unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn concat_refuses_parts_that_differ_off_the_axis() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 8]);
    let (la, lb) = (Layout::contiguous(&[2, 3]), Layout::contiguous(&[2, 4]));
    let err = concat(&[(&a[..], &la), (&b[..], &lb)], 0).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "concat",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn concat_refuses_an_axis_out_of_range() {
    let a = [0.0f32; 6];
    let l = Layout::contiguous(&[2, 3]);
    let err = concat(&[(&a[..], &l), (&a[..], &l)], 2).unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn concat_refuses_an_empty_list_of_parts() {
    let err = concat(&[], 0).unwrap_err();
    assert!(matches!(err, KernelError::Shapes { .. }), "{err}");
}

#[test]
fn pad_narrow_refuses_a_range_past_the_full_length() {
    let g = vec![0.0f32; 2 * 3];
    // Three values from 2 do not fit in 4.
    let err = pad_narrow(&g, &Layout::contiguous(&[2, 3]), 1, 2, 4).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Shapes {
                kernel: "pad_narrow",
                ..
            }
        ),
        "{err}"
    );
}
