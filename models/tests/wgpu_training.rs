//! Compiled models on the wgpu backend (Mesa's llvmpipe in CI): the checks of
//! `device_training/` (the same `forward` and `loss_and_grads` methods, called with tensors
//! on the device, against the CPU on fresh random inputs; the digits MLP trained to 0.97),
//! and `RTX_PROFILE` on the device. Without an adapter each test prints that it was skipped
//! (`RTX_REQUIRE_WGPU=1` makes that a failure).
#![cfg(feature = "wgpu")]

mod device_training;

use device_training::random;
use models::mlp::Mlp;
use rtx_core::prelude::*;

fn device(test: &str) -> Option<Device> {
    match Device::wgpu() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("RTX_REQUIRE_WGPU").as_deref() != Ok("1") => {
            eprintln!("skipped: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_WGPU=1 but {e}"),
    }
}

device_training_tests!(device);

/// Profiles one forward pass of the MLP on the device and prints the table; run alone in a
/// child process by the test below, so no other test's calls land in the table.
#[test]
#[ignore = "run as a child process by profiling_a_call_on_wgpu_times_each_of_its_steps"]
fn profile_one_mlp_forward_pass_on_wgpu() {
    let Some(dev) = device("profile_one_mlp_forward_pass_on_wgpu") else {
        return;
    };
    let mut rng = Rng::new(12);
    let mut gpu = Mlp::init(4);
    gpu.to(&dev).unwrap();
    let x = random(&[16, 64], &mut rng).to(&dev).unwrap();
    rtx_core::profile::set_enabled(true);
    gpu.forward(&x).unwrap();
    rtx_core::profile::set_enabled(false);
    if let Some(table) = rtx_core::profile::report(1) {
        println!("{table}");
    }
}

#[test]
fn profiling_a_call_on_wgpu_times_each_of_its_steps() {
    let test = "profiling_a_call_on_wgpu_times_each_of_its_steps";
    if device(test).is_none() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "profile_one_mlp_forward_pass_on_wgpu",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    // The MLP's forward pass on the device: its GEMMs with their epilogues, by node.
    assert!(table.contains("profile:"), "no table: {table}");
    assert!(table.contains("matmul_fused fwd"), "{table}");
    assert!(table.contains("(forward)"), "{table}");
}
