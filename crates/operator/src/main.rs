//! `gpu-operator` — not built yet; see the README's roadmap. It exits with an error so nothing mistakes it for a working binary.

fn main() -> std::process::ExitCode {
    eprintln!("gpu-operator: not implemented yet in this build of gpu-operator-rs");
    std::process::ExitCode::from(2)
}
