//! Gives the cdylib the soname of the real NVML so that it can stand in for it under any driver root.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
