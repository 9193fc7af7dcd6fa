//! `RTX_PROFILE=1` (`rtx_core::profile`): every step of a compiled call is timed and reported
//! under its node, with GEMM throughput. One test per process: the table is global.

use models::mlp::Mlp;
use rtx_core::prelude::*;
use rtx_core::profile;
use std::sync::Mutex;

/// Profiling is switched per process: the tests take turns.
static TURN: Mutex<()> = Mutex::new(());

#[test]
fn a_profiled_training_step_reports_each_gemm_with_its_node_and_throughput() {
    // Arrange
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    profile::set_enabled(true);
    profile::reset();
    let model = Mlp::init(1);
    let x = Tensor::from_vec(
        (0..32 * 64).map(|i| (i % 7) as f32 * 0.1).collect(),
        &[32, 64],
    )
    .unwrap();
    let y = Tensor::from_i64((0..32).map(|i| i % 10).collect(), &[32]).unwrap();

    // Act
    for _ in 0..3 {
        model.loss_and_grads(&mut Ctx::train(0), &x, &y).unwrap();
    }
    let report = profile::report(3).expect("steps were recorded");

    // Assert
    let gemm = report
        .lines()
        .find(|l| l.contains("fwd matmul") && l.contains("loss_and_grads"))
        .unwrap_or_else(|| panic!("no forward GEMM step in\n{report}"));
    let fields: Vec<&str> = gemm.split_whitespace().collect();
    assert_eq!(fields[2], "1", "one call per training step: {gemm}");
    assert!(
        fields[3].parse::<f64>().is_ok_and(|g| g > 0.0),
        "GFLOP/s: {gemm}"
    );
}

#[test]
fn with_profiling_off_nothing_is_recorded() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    profile::reset();
    let model = Mlp::init(1);
    let x = Tensor::from_vec(vec![0.5; 2 * 64], &[2, 64]).unwrap();
    profile::set_enabled(false);
    model.forward(&x).unwrap();
    let report = profile::report(1).unwrap_or_default();
    assert!(
        !report.lines().any(|l| l.contains("(forward)")),
        "a forward call was recorded with profiling off:\n{report}"
    );
}
