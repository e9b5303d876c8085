//! `nvidia-smi` of the local cluster's fake driver installs (`hack/fake-driver-root` puts it in the
//! driver root's `usr/bin`, from where the plugins' CDI specs mount it into GPU containers, as a real
//! driver's is), so any image, the guide's or a plain one, can list its GPUs.
//!
//! Like the real tool it loads `libnvidia-ml.so.1` through the dynamic loader's search path, so it
//! sees what the container runtime injected through CDI and nothing else, and prints what NVML
//! reports. Supported: `-L` / `--list-gpus` (`GPU 0: <name> (UUID: GPU-...)`, one line a GPU) and no
//! argument (a short summary). An NVML failure is reported like the real tool does, exit status 9.

use nvml_wrapper::Nvml;
use std::ffi::OsStr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let list_only = match args.as_slice() {
        [] => false,
        [a] if a == "-L" || a == "--list-gpus" => true,
        _ => {
            eprintln!("nvidia-smi (stand-in): only -L/--list-gpus is supported, got {args:?}");
            return ExitCode::from(2);
        }
    };
    match run(list_only) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {e}"
            );
            ExitCode::from(9)
        }
    }
}

fn run(list_only: bool) -> Result<(), nvml_wrapper::error::NvmlError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new("libnvidia-ml.so.1"))
        .init()?;
    if !list_only {
        println!(
            "NVIDIA-SMI (stand-in)   Driver Version: {}   CUDA Version: {}",
            nvml.sys_driver_version()?,
            cuda_version(nvml.sys_cuda_driver_version()?)
        );
    }
    for index in 0..nvml.device_count()? {
        let device = nvml.device_by_index(index)?;
        println!("GPU {index}: {} (UUID: {})", device.name()?, device.uuid()?);
    }
    Ok(())
}

/// NVML's CUDA driver version (`12060`) as nvidia-smi prints it (`12.6`).
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cuda_version_reads_like_nvidia_smi() {
        assert_eq!(super::cuda_version(12060), "12.6");
        assert_eq!(super::cuda_version(13000), "13.0");
    }
}
