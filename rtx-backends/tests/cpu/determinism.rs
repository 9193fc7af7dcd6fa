//! Bit-identical results whatever the rayon thread count.

use rtx_backends::cpu::{
    ConvAlgorithm, ReduceOp, conv2d, conv2d_grad_input_with, conv2d_grad_weight,
    conv2d_grad_weight_with, conv2d_with, dropout_mask, map_rows, matmul, pick_last_grad, reduce,
    scatter_add_rows,
};

use crate::common::*;

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn kernels_are_bit_identical_across_thread_counts() {
    let mut rng = Rng::new(80);
    let (a, la) = random_contiguous(&mut rng, &[3, 130, 200]);
    let (b, lb) = random_view(&mut rng, &[200, 300], View::Reversed);
    let (x, lx) = random_contiguous(&mut rng, &[300, 400]);
    let (img, limg) = random_contiguous(&mut rng, &[16, 4, 16, 16]);
    let (w, lw) = random_contiguous(&mut rng, &[8, 4, 3, 3]);
    let (g, lg) = random_contiguous(&mut rng, &[16, 8, 16, 16]);
    let ids: Vec<i64> = (0..4000).map(|_| rng.below(30) as i64).collect();
    let (rows, lrows) = random_contiguous(&mut rng, &[4000, 10]);
    let labels: Vec<i64> = (0..300).map(|_| rng.below(400) as i64).collect();

    let implicit = ConvAlgorithm::Implicit;
    let run_all = || -> Vec<Vec<u32>> {
        vec![
            bits(&matmul(&a, &la, &b, &lb).unwrap().0),
            // The dot-product path: few columns of a transposed weight, rows split in pieces.
            bits(
                &matmul(
                    &x,
                    &lx,
                    &x[..2000],
                    &rtx_backends::Layout::contiguous(&[5, 400]).permute(&[1, 0]),
                )
                .unwrap()
                .0,
            ),
            bits(&reduce(ReduceOp::Sum, &x, &lx, &[0], false).unwrap().0),
            bits(&reduce(ReduceOp::Sum, &x, &lx, &[0, 1], false).unwrap().0),
            bits(
                &reduce(ReduceOp::Mean, &x, &lx.permute(&[1, 0]), &[1], true)
                    .unwrap()
                    .0,
            ),
            bits(
                &map_rows(
                    [(&x[..], &lx)],
                    &lx.shape,
                    [true],
                    [false],
                    |ins, cols, outs, _| {
                        let [o] = outs;
                        o[0] = (0..cols).map(|j| ins[0].at(j).exp()).sum();
                    },
                )
                .unwrap()[0],
            ),
            bits(
                &pick_last_grad(
                    &x[..300],
                    &rtx_backends::Layout::contiguous(&[300]),
                    &labels,
                    &[300, 400],
                )
                .unwrap(),
            ),
            bits(&conv2d(&img, &limg, &w, &lw, [1, 1], [1, 1]).unwrap().0),
            bits(&conv2d_grad_weight(&img, &limg, &g, &lg, &lw.shape, [1, 1], [1, 1]).unwrap()),
            // The implicit GEMM: blocks of the column matrix built per task.
            bits(
                &conv2d_with(implicit, &img, &limg, &w, &lw, [1, 1], [1, 1])
                    .unwrap()
                    .0,
            ),
            bits(
                &conv2d_grad_input_with(implicit, &g, &lg, &w, &lw, &limg.shape, [1, 1], [1, 1])
                    .unwrap(),
            ),
            bits(
                &conv2d_grad_weight_with(implicit, &img, &limg, &g, &lg, &lw.shape, [1, 1], [1, 1])
                    .unwrap(),
            ),
            bits(&scatter_add_rows(&rows, &lrows, &ids, 30).unwrap()),
            bits(&dropout_mask(100_000, 0.25, 9).unwrap()),
        ]
    };
    let one = in_pool(1, run_all);
    let two = in_pool(2, run_all);
    let three = in_pool(3, run_all);
    for (i, ((x1, x2), x3)) in one.iter().zip(&two).zip(&three).enumerate() {
        assert_eq!(x1, x2, "kernel {i}: 1 vs 2 threads");
        assert_eq!(x1, x3, "kernel {i}: 1 vs 3 threads");
    }
}
