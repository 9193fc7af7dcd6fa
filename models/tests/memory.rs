//! The compiled schedules of the models drop each intermediate after its last reader: the
//! planned peak of a training step is well below the sum of its intermediates.

use models::cnn::Cnn;
use models::mlp::Mlp;

#[test]
fn mlp_step_peak_is_below_the_sum_of_its_intermediates() {
    let ir = Mlp::graph().unwrap();
    let loss = ir.function("loss").unwrap();

    let report = loss.memory_report(&[("B", 256)]).unwrap();

    assert!(report.peak_bytes < report.total_bytes, "{report:?}");
}

#[test]
fn cnn_step_peak_is_below_the_sum_of_its_intermediates() {
    let ir = Cnn::graph().unwrap();
    let loss = ir.function("loss").unwrap();

    let report = loss.memory_report(&[("B", 32)]).unwrap();

    assert!(
        report.peak_bytes * 10 < report.total_bytes * 8,
        "{report:?}"
    );
}
