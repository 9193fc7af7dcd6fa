use rtx_backends::cpu::dropout_mask;

#[test]
fn dropout_mask_has_the_right_values_and_rate() {
    assert!(dropout_mask(1000, 0.0, 7).iter().all(|&v| v == 1.0));
    assert!(dropout_mask(1000, 1.0, 7).iter().all(|&v| v == 0.0));
    let p = 0.3;
    let mask = dropout_mask(100_000, p, 42);
    let scale = 1.0 / (1.0 - p);
    assert!(mask.iter().all(|&v| v == 0.0 || v == scale));
    let dropped = mask.iter().filter(|&&v| v == 0.0).count() as f64 / mask.len() as f64;
    assert!((dropped - 0.3).abs() < 0.01, "drop rate {dropped}");
}

#[test]
fn dropout_mask_depends_on_seed_only() {
    let a = dropout_mask(50_000, 0.5, 1);
    assert_eq!(a, dropout_mask(50_000, 0.5, 1));
    let b = dropout_mask(50_000, 0.5, 2);
    let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64;
    assert!((agree - 0.5).abs() < 0.02, "nearby seeds agree on {agree}");
}
