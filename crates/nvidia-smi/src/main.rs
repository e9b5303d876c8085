//! `nvidia-smi` of the local cluster's fake driver installs (`hack/fake-driver-root` puts it in the
//! driver root's `usr/bin`, from where the plugins' CDI specs mount it into GPU containers and
//! the DRA plugin runs it to change a GPU's compute policy, as a real driver's is).
//!
//! Like the real tool it loads `libnvidia-ml.so.1` through the dynamic loader's search path, so it
//! sees what the container runtime injected through CDI and nothing else, and prints what NVML
//! reports. Supported: `-L` / `--list-gpus` (`GPU 0: <name> (UUID: GPU-...)`, one line a GPU), no
//! argument (a short summary), `-i <ids> -c <mode>` (compute mode), `compute-policy [-i <ids>]
//! --set-timeslice <0-3>` and `compute-policy [-i <ids>] -l` (the compute time-slice). `<ids>` are
//! indexes or UUIDs, comma-separated; without `-i` every GPU. An NVML failure is reported like the
//! real tool does, exit status 9; a bad command line exits 2.

mod args;
mod timeslice;

use args::Command;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match args::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nvidia-smi (stand-in): {e}");
            return ExitCode::from(2);
        }
    };
    match run(&command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Nvml(e)) => {
            println!(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {e}"
            );
            ExitCode::from(9)
        }
        Err(Failure::Other(e)) => {
            eprintln!("{e}");
            ExitCode::from(3)
        }
    }
}

enum Failure {
    Nvml(NvmlError),
    Other(String),
}

impl From<NvmlError> for Failure {
    fn from(e: NvmlError) -> Self {
        Self::Nvml(e)
    }
}

fn run(command: &Command) -> Result<(), Failure> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new("libnvidia-ml.so.1"))
        .init()?;
    match command {
        Command::Summary => {
            println!(
                "NVIDIA-SMI (stand-in)   Driver Version: {}   CUDA Version: {}",
                nvml.sys_driver_version()?,
                cuda_version(nvml.sys_cuda_driver_version()?)
            );
            list(&nvml)
        }
        Command::List => list(&nvml),
        Command::SetComputeMode { ids, mode } => {
            for device in devices(&nvml, ids)? {
                let mut device = device;
                device
                    .set_compute_mode(*mode)
                    .map_err(|e| Failure::Other(format!("setting the compute mode: {e}")))?;
                println!(
                    "Compute mode set to {} for GPU {}.",
                    args::compute_mode_name(*mode),
                    device.pci_info()?.bus_id
                );
            }
            Ok(())
        }
        Command::SetTimeslice { ids, value } => {
            for device in devices(&nvml, ids)? {
                timeslice::set(&device, *value).map_err(Failure::Other)?;
                println!(
                    "Timeslice set to {} for GPU {}.",
                    args::timeslice_name(*value),
                    device.uuid()?
                );
            }
            Ok(())
        }
        Command::ListPolicy { ids } => {
            for device in devices(&nvml, ids)? {
                let value = timeslice::get(&device).map_err(Failure::Other)?;
                println!(
                    "GPU {} ({}): Timeslice {}",
                    device.index()?,
                    device.uuid()?,
                    args::timeslice_name(value)
                );
            }
            Ok(())
        }
    }
}

fn list(nvml: &Nvml) -> Result<(), Failure> {
    for index in 0..nvml.device_count()? {
        let device = nvml.device_by_index(index)?;
        println!("GPU {index}: {} (UUID: {})", device.name()?, device.uuid()?);
    }
    Ok(())
}

/// The devices `ids` name (indexes or UUIDs), every GPU when none.
fn devices<'n>(nvml: &'n Nvml, ids: &[String]) -> Result<Vec<Device<'n>>, Failure> {
    if ids.is_empty() {
        return (0..nvml.device_count()?)
            .map(|i| nvml.device_by_index(i).map_err(Failure::Nvml))
            .collect();
    }
    ids.iter()
        .map(|id| {
            let found = match id.parse::<u32>() {
                Ok(index) => nvml.device_by_index(index),
                Err(_) => nvml.device_by_uuid(id.as_str()),
            };
            found.map_err(|e| Failure::Other(format!("No devices were found matching {id}: {e}")))
        })
        .collect()
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
