//! Start-up validation of the labeler's configuration.

use std::process::Command;

#[test]
fn bad_default_mode_stops_startup_naming_the_allowed_values() {
    let out = Command::new(env!("CARGO_BIN_EXE_node-labeler"))
        .env("DEFAULT_GPU_ALLOCATION_MODE", "DRA")
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"DRA\""), "{stderr}");
    assert!(
        stderr.contains("\"dra\"") && stderr.contains("\"device-plugin\""),
        "{stderr}"
    );
}
