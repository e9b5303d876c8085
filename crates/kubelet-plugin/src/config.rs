//! Command line and environment of `gpu-kubelet-plugin`; every flag is also an env var, with
//! the upstream plugin's names.

use api::contract::{env, paths};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `<kubelet root>/plugins_registry`.
fn default_registrar_dir() -> PathBuf {
    PathBuf::from(paths::DEFAULT_KUBELET_ROOT).join("plugins_registry")
}

/// `<kubelet root>/plugins`.
fn default_plugins_dir() -> PathBuf {
    PathBuf::from(paths::DEFAULT_KUBELET_ROOT).join("plugins")
}

/// The validator's `driver-ready` file.
pub fn default_driver_ready() -> PathBuf {
    PathBuf::from(paths::VALIDATIONS_DIR).join(paths::DRIVER_READY_FILE)
}

/// `gpu-kubelet-plugin`: publishes this node's GPUs as ResourceSlices and prepares them for
/// containers through CDI.
#[derive(Debug, Clone, Parser)]
#[command(name = "gpu-kubelet-plugin", version)]
pub struct Config {
    /// The node this plugin serves (pool name and slice owner).
    #[arg(long, env = env::NODE_NAME)]
    pub node_name: String,
    /// Host path of the driver install.
    #[arg(long, env = env::NVIDIA_DRIVER_ROOT, default_value = "/")]
    pub nvidia_driver_root: PathBuf,
    /// Where the host driver root is mounted in this container.
    #[arg(long = "container-driver-root", env = env::DRIVER_ROOT_CTR_PATH, default_value = paths::DRIVER_ROOT_CTR_PATH)]
    pub driver_root_ctr_path: PathBuf,
    /// Where CDI specs are written.
    #[arg(long, env = env::CDI_ROOT, default_value = paths::CDI_ROOT)]
    pub cdi_root: PathBuf,
    /// The kubelet's plugin registration directory.
    #[arg(long, env = env::KUBELET_REGISTRAR_DIRECTORY_PATH, default_value_os_t = default_registrar_dir())]
    pub kubelet_registrar_directory_path: PathBuf,
    /// The kubelet's plugins directory; the plugin's data dir is `<this>/gpu.nvidia.com`.
    #[arg(long, env = env::KUBELET_PLUGINS_DIRECTORY_PATH, default_value_os_t = default_plugins_dir())]
    pub kubelet_plugins_directory_path: PathBuf,
    /// TCP port of the gRPC liveness service; negative disables it.
    #[arg(long, env = env::HEALTHCHECK_PORT, default_value_t = -1, allow_negative_numbers = true)]
    pub healthcheck_port: i32,
    /// Address of `/metrics`, `/healthz`, `/readyz` (`:8080` or `host:port`); empty disables.
    #[arg(long, env = env::HTTP_ENDPOINT, default_value = "", value_parser = parse_endpoint)]
    pub http_endpoint: HttpEndpoint,
    /// The validator's `driver-ready` file; when present its roots override the flags above.
    #[arg(
        long,
        env = env::DRIVER_READY_FILE,
        default_value_os_t = default_driver_ready()
    )]
    pub driver_ready_file: PathBuf,
    /// The folder whose `proc/` the plugin reads MIG capabilities from (`proc/devices`,
    /// `proc/driver/nvidia/capabilities`): `/` in a pod, whose `/proc` tells the node kernel's.
    #[arg(long, env = env::PROCFS_ROOT, default_value = "/")]
    pub procfs_root: PathBuf,
    /// Where the node's sysfs is (the host root's `sys`, as the pod mounts it): each GPU's
    /// `resource.kubernetes.io/pcieRoot` comes from its link under `bus/pci/devices`.
    #[arg(long, env = env::SYSFS_ROOT, default_value = "/host/sys")]
    pub sysfs_root: PathBuf,
    /// Offer whole GPUs and MIG devices to several claims: `disabled`, `memory`, `unlimited` or a
    /// number of shares per device (the upstream driver's `--consumable-shares`).
    #[arg(long, env = env::CONSUMABLE_SHARES, default_value = "disabled")]
    pub consumable_shares: crate::consumable::ConsumableShares,
    /// Host directory of the MPS control daemons, mounted at the same path here: the per-GPU
    /// ones of GPU classes' shares (`<this>/<GPU UUID>`, started by an admin) and those the
    /// plugin runs for claims (`<this>/claim-<claim UID>`).
    #[arg(long, env = "MPS_ROOT", default_value = paths::MPS_ROOT)]
    pub mps_root: PathBuf,
    /// The plugin pod's namespace: claims' MPS control daemon pods go there.
    #[arg(long, env = env::POD_NAMESPACE)]
    pub pod_namespace: Option<String>,
    /// The image of claims' MPS control daemon pods (the plugin's own); without it and the
    /// namespace, claims asking for MPS are refused.
    #[arg(long, env = env::MPS_CONTROL_DAEMON_IMAGE)]
    pub mps_control_daemon_image: Option<String>,
    /// Pull policy of that image.
    #[arg(long, env = env::MPS_CONTROL_DAEMON_IMAGE_PULL_POLICY, default_value = "IfNotPresent")]
    pub mps_control_daemon_image_pull_policy: String,
    /// Source of the node's boot id (checkpoints from other boots are discarded).
    #[arg(long, env = "BOOT_ID_FILE", default_value = crate::checkpoint::BOOT_ID_PATH)]
    pub boot_id_file: PathBuf,
    /// Seconds between health probes of every GPU (what NVML events do not report, such as a
    /// GPU fallen off the bus).
    #[arg(long, env = "HEALTH_PROBE_INTERVAL", default_value = "5", value_parser = parse_seconds)]
    pub health_probe_interval: Duration,
    /// Seconds a GPU must be read fine after its last fault before its devices' taints go.
    #[arg(long, env = "HEALTH_RECOVERY_PERIOD", default_value = "60", value_parser = parse_seconds)]
    pub health_recovery_period: Duration,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: service::logging::LogFormat,
}

/// A positive number of seconds, fractions allowed (`0.5`).
pub fn parse_seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{value:?} is not a positive number of seconds"))
}

/// The metrics endpoint; `None` when disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpEndpoint(pub Option<SocketAddr>);

/// `""` → none, `:8080` → all interfaces, else `host:port`.
pub fn parse_endpoint(value: &str) -> Result<HttpEndpoint, String> {
    if value.is_empty() {
        return Ok(HttpEndpoint(None));
    }
    let full = if value.starts_with(':') {
        format!("0.0.0.0{value}")
    } else {
        value.to_owned()
    };
    full.parse()
        .map(|a| HttpEndpoint(Some(a)))
        .map_err(|e| format!("{value:?} is not :port or host:port ({e})"))
}

impl Config {
    /// The plugin's data directory.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_plugins_directory_path
            .join(api::contract::DRIVER_NAME)
    }

    /// The health port, if enabled.
    pub fn health_port(&self) -> Option<u16> {
        u16::try_from(self.healthcheck_port).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::try_parse_from(["p", "--node-name", "n1"]).unwrap();
        assert_eq!(
            c.plugin_dir(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com")
        );
        assert_eq!(c.health_port(), None);
        assert_eq!(c.http_endpoint, HttpEndpoint(None));
        assert_eq!(c.cdi_root, PathBuf::from("/var/run/cdi"));
        assert_eq!(
            c.kubelet_registrar_directory_path,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        assert_eq!(
            c.driver_ready_file,
            PathBuf::from("/run/nvidia/validations/driver-ready")
        );
        let c = Config::try_parse_from([
            "p",
            "--node-name",
            "n1",
            "--healthcheck-port",
            "51516",
            "--http-endpoint",
            ":8080",
        ])
        .unwrap();
        assert_eq!(c.health_port(), Some(51516));
        assert_eq!(
            c.http_endpoint,
            HttpEndpoint(Some("0.0.0.0:8080".parse().unwrap()))
        );
    }

    #[test]
    fn a_bad_endpoint_names_the_value() {
        let err = Config::try_parse_from(["p", "--node-name", "n", "--http-endpoint", "nope"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"nope\" is not :port or host:port"), "{err}");
    }
}
