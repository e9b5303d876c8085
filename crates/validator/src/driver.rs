//! `driver`: find the driver, prove NVML works from it, write `driver-ready`.

use crate::cli::{Common, DriverArgs};
use crate::retry::{CommandError, Policy, retry};
use gpu_discovery::driver_ready::FILE_NAME;
use gpu_discovery::{
    DriverRoot, InitMode, NvmlError, NvmlSession, ProbeError, ProbeSettings, root,
};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// Neither root has NVML.
    #[error(transparent)]
    NoDriver(#[from] ProbeError),
    /// NVML from the found root does not work.
    #[error("driver found in {root} ({location:?} driver), but {source}")]
    Nvml {
        /// The driver root as this container sees it.
        root: PathBuf,
        /// Host or container driver.
        location: gpu_discovery::DriverLocation,
        /// The NVML error.
        source: Box<NvmlError>,
    },
    /// NVML works but sees no GPU.
    #[error("driver found in {root}, but NVML from {library} reports no GPUs")]
    NoGpus {
        /// The driver root as this container sees it.
        root: PathBuf,
        /// The library.
        library: PathBuf,
    },
}

/// Why the `driver` command failed.
pub type DriverError = CommandError<AttemptError>;

/// What a passing check found.
#[derive(Debug)]
pub struct Validated {
    /// The driver.
    pub root: DriverRoot,
    /// Its version.
    pub driver_version: String,
    /// GPUs NVML sees (`None` with GPU init skipped).
    pub gpus: Option<u32>,
}

/// One attempt: probe, then open NVML from the found root and read the version (and count).
pub fn validate(settings: &ProbeSettings, mode: InitMode) -> Result<Validated, AttemptError> {
    let found = root::probe(settings)?;
    let nvml_err = |source| AttemptError::Nvml {
        root: found.paths.driver_root_ctr.clone(),
        location: found.location,
        source: Box::new(source),
    };
    let session = NvmlSession::open(&found.nvml_library, mode).map_err(nvml_err)?;
    let driver_version = session.driver_version().map_err(nvml_err)?;
    let gpus = match mode {
        InitMode::NoGpus => None,
        InitMode::Full => match session.device_count().map_err(nvml_err)? {
            0 => {
                return Err(AttemptError::NoGpus {
                    root: found.paths.driver_root_ctr.clone(),
                    library: found.nvml_library.clone(),
                });
            }
            n => Some(n),
        },
    };
    drop(session);
    Ok(Validated {
        root: found,
        driver_version,
        gpus,
    })
}

/// The `driver` command.
pub async fn run<F: Future<Output = ()>>(
    common: &Common,
    args: &DriverArgs,
    shutdown: Pin<&mut F>,
) -> Result<Validated, DriverError> {
    let settings = ProbeSettings {
        host_root: args.host_root.clone(),
        driver_install_dir: args.driver_install_dir.clone(),
        driver_install_dir_ctr_path: args.driver_install_dir_ctr_path.clone(),
    };
    let mode = if args.skip_gpu_init {
        InitMode::NoGpus
    } else {
        InitMode::Full
    };
    let policy = Policy {
        with_wait: common.with_wait,
        interval: common.interval(),
        timeout: common.timeout(),
    };
    let validated = retry(policy, shutdown, || validate(&settings, mode)).await?;
    let path = common.output_dir.join(FILE_NAME);
    gpu_discovery::DriverReady::from(&validated.root)
        .write(&path)
        .map_err(|source| DriverError::Write { path, source })?;
    Ok(validated)
}
