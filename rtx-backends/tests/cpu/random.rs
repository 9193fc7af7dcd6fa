use rtx_backends::cpu::{KernelError, dropout_mask};

#[test]
fn dropout_mask_has_the_right_values_and_rate() {
    assert!(
        dropout_mask(1000, 0.0, 7)
            .unwrap()
            .iter()
            .all(|&v| v == 1.0)
    );
    let p = 0.3;
    let mask = dropout_mask(100_000, p, 42).unwrap();
    let scale = 1.0 / (1.0 - p);
    assert!(mask.iter().all(|&v| v == 0.0 || v == scale));
    let dropped = mask.iter().filter(|&&v| v == 0.0).count() as f64 / mask.len() as f64;
    assert!((dropped - 0.3).abs() < 0.01, "drop rate {dropped}");
}

#[test]
fn dropout_mask_depends_on_seed_only() {
    let a = dropout_mask(50_000, 0.5, 1).unwrap();
    assert_eq!(a, dropout_mask(50_000, 0.5, 1).unwrap());
    let b = dropout_mask(50_000, 0.5, 2).unwrap();
    let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64;
    assert!((agree - 0.5).abs() < 0.02, "nearby seeds agree on {agree}");
}

#[test]
fn dropout_mask_refuses_a_probability_outside_zero_to_one() {
    for p in [1.0, 1.5, -0.1, f32::NAN, f32::INFINITY] {
        let err = dropout_mask(10, p, 7).unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::Argument {
                    kernel: "dropout_mask",
                    ..
                }
            ),
            "p = {p}: {err}"
        );
    }
}
