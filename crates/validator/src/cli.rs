//! Command line: every flag is also an env var, with the upstream validator's names where they exist.

use api::contract::env;
use clap::{Args, Parser, Subcommand};
use gpu_discovery::driver_ready::DEFAULT_STATUS_DIR;
use gpu_discovery::root::{
    DEFAULT_DRIVER_INSTALL_DIR, DEFAULT_DRIVER_INSTALL_DIR_CTR_PATH, DEFAULT_HOST_ROOT,
};
use std::path::PathBuf;
use std::time::Duration;

/// Proves the NVIDIA driver is there (`driver`), that the DRA allocation path works (`workload`)
/// and that the device plugin serves the node (`plugin`).
#[derive(Debug, Parser)]
#[command(name = "dra-driver-validator", version)]
pub struct Cli {
    /// What to validate.
    #[command(subcommand)]
    pub command: Command,
    /// Options shared by both checks.
    #[command(flatten)]
    pub common: Common,
}

/// The two jobs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Find the driver (host root first, then the container driver root), check NVML from it,
    /// and write `driver-ready`.
    Driver(DriverArgs),
    /// Check that the GPUs injected into this container are the ones NVML shows, then report
    /// ready and stay up.
    Workload(WorkloadArgs),
    /// Wait until the device plugin offers GPUs on this node, run a pod there that asks for one
    /// (the `workload` check, once), then write `plugin-ready` and stay up.
    Plugin(PluginArgs),
}

/// Options shared by both checks.
#[derive(Debug, Args)]
pub struct Common {
    /// Directory for status files (`driver-ready`, `workload-ready`).
    #[arg(long, env = "OUTPUT_DIR", default_value = DEFAULT_STATUS_DIR, global = true)]
    pub output_dir: PathBuf,
    /// Keep retrying until the check passes (or the timeout ends), instead of failing at once
    /// (`--with-wait`, or `--with-wait=false`).
    #[arg(long, env = env::WITH_WAIT, default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true", global = true)]
    pub with_wait: bool,
    /// Seconds between retries.
    #[arg(long, env = "SLEEP_INTERVAL_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..), global = true)]
    pub sleep_interval_seconds: u64,
    /// Give up after this many seconds of retrying; 0 waits for ever.
    #[arg(long, env = "TIMEOUT_SECONDS", default_value_t = 0, global = true)]
    pub timeout_seconds: u64,
}

impl Common {
    /// Time between retries.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.sleep_interval_seconds)
    }

    /// Retry limit, if any.
    pub fn timeout(&self) -> Option<Duration> {
        (self.timeout_seconds > 0).then(|| Duration::from_secs(self.timeout_seconds))
    }
}

/// Where the driver may be.
#[derive(Debug, Args)]
pub struct DriverArgs {
    /// Where the host's `/` is mounted in this container.
    #[arg(long, env = env::HOST_ROOT, default_value = DEFAULT_HOST_ROOT)]
    pub host_root: PathBuf,
    /// Host path of a containerized driver's root.
    #[arg(long, env = env::DRIVER_INSTALL_DIR, default_value = DEFAULT_DRIVER_INSTALL_DIR)]
    pub driver_install_dir: PathBuf,
    /// Where that root is mounted in this container.
    #[arg(long, env = env::DRIVER_INSTALL_DIR_CTR_PATH, default_value = DEFAULT_DRIVER_INSTALL_DIR_CTR_PATH)]
    pub driver_install_dir_ctr_path: PathBuf,
    /// Initialise NVML without attaching GPUs (for GPUs bound to vfio-pci): check the driver
    /// version only.
    #[arg(long, env = "SKIP_GPU_INIT", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub skip_gpu_init: bool,
}

/// What the workload container was given.
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// GPUs injected into this container (`NVIDIA_VISIBLE_DEVICES` as CDI edits set it): UUIDs
    /// or indices, comma-separated.
    #[arg(long, env = "NVIDIA_VISIBLE_DEVICES")]
    pub visible_devices: String,
    /// Root under which the injected `libnvidia-ml.so.1` is found (the container's `/`).
    #[arg(long, env = "WORKLOAD_DRIVER_ROOT", default_value = "/")]
    pub driver_root: PathBuf,
    /// Exit once the check passed instead of staying up (a one-shot validation pod).
    #[arg(long, env = "EXIT_WHEN_READY", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub exit_when_ready: bool,
}

/// Where and how the device plugin is checked.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// This node.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Namespace of the validation pod (this pod's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// This pod's name and uid: the validation pod's owner, so it goes with this one.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// This pod's uid.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// The resource the validation pod asks one of; by default `nvidia.com/gpu`, or another
    /// `nvidia.com/` resource the node offers (a MIG profile, a shared GPU).
    #[arg(long, env = "RESOURCE_NAME")]
    pub resource: Option<String>,
    /// Image of the validation pod (this one's).
    #[arg(long, env = "VALIDATOR_IMAGE")]
    pub image: String,
    /// Its pull policy.
    #[arg(
        long,
        env = "VALIDATOR_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent"
    )]
    pub image_pull_policy: String,
    /// Its pull secrets, comma-separated.
    #[arg(long, env = "VALIDATOR_IMAGE_PULL_SECRETS", value_delimiter = ',')]
    pub image_pull_secrets: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::path::Path;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_contract_paths() {
        let cli = Cli::try_parse_from(["dra-driver-validator", "driver"]).unwrap();
        let Command::Driver(args) = cli.command else {
            panic!("driver expected")
        };
        assert_eq!(args.host_root, Path::new("/host"));
        assert_eq!(args.driver_install_dir, Path::new("/run/nvidia/driver"));
        assert_eq!(args.driver_install_dir_ctr_path, Path::new("/driver-root"));
        assert_eq!(cli.common.output_dir, Path::new("/run/nvidia/validations"));
        assert!(!cli.common.with_wait && cli.common.timeout().is_none());
        assert_eq!(cli.common.interval(), Duration::from_secs(5));
    }

    #[test]
    fn a_bad_value_is_refused_naming_it() {
        let err =
            Cli::try_parse_from(["v", "driver", "--sleep-interval-seconds", "0"]).unwrap_err();
        assert!(err.to_string().contains("sleep-interval-seconds"), "{err}");
        let err = Cli::try_parse_from(["v", "--with-wait=maybe", "driver"]).unwrap_err();
        assert!(err.to_string().contains("maybe"), "{err}");
    }

    #[test]
    fn flag_forms_of_the_booleans() {
        let cli = Cli::try_parse_from(["v", "--with-wait", "driver", "--skip-gpu-init"]).unwrap();
        let Command::Driver(args) = cli.command else {
            panic!("driver expected")
        };
        assert!(cli.common.with_wait && args.skip_gpu_init);
        let cli = Cli::try_parse_from(["v", "driver", "--with-wait=false"]).unwrap();
        assert!(!cli.common.with_wait);
    }
}
