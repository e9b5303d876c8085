//! The command-line flags every node agent takes (each also an env var, with the upstream
//! names): where the driver is, where CDI specs go, the GPU health timings, the metrics endpoint
//! and the log format. A plugin's own `Config` flattens [`NodeFlags`] in.

use api::contract::{env, paths};
use clap::Args;
use gpu_discovery::{DriverPaths, DriverReady};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The validator's `driver-ready` file.
pub fn default_driver_ready() -> PathBuf {
    PathBuf::from(paths::VALIDATIONS_DIR).join(paths::DRIVER_READY_FILE)
}

/// Flags both node agents take.
#[derive(Debug, Clone, Args)]
pub struct NodeFlags {
    /// Host path of the driver install.
    #[arg(long, env = env::NVIDIA_DRIVER_ROOT, default_value = "/")]
    pub nvidia_driver_root: PathBuf,
    /// Where the host driver root is mounted in this container.
    #[arg(long = "container-driver-root", env = env::DRIVER_ROOT_CTR_PATH, default_value = paths::DRIVER_ROOT_CTR_PATH)]
    pub driver_root_ctr_path: PathBuf,
    /// The validator's `driver-ready` file; when present its roots override the flags above.
    #[arg(long, env = env::DRIVER_READY_FILE, default_value_os_t = default_driver_ready())]
    pub driver_ready_file: PathBuf,
    /// The folder whose `proc/` MIG capabilities are read from (`proc/devices`,
    /// `proc/driver/nvidia/capabilities`): `/` in a pod, whose `/proc` tells the node kernel's.
    #[arg(long, env = env::PROCFS_ROOT, default_value = "/")]
    pub procfs_root: PathBuf,
    /// Where CDI specs are written.
    #[arg(long, env = env::CDI_ROOT, default_value = paths::CDI_ROOT)]
    pub cdi_root: PathBuf,
    /// Seconds between health probes of every GPU (what NVML events do not report, such as a
    /// GPU fallen off the bus).
    #[arg(long, env = "HEALTH_PROBE_INTERVAL", default_value = "5", value_parser = parse_seconds)]
    pub health_probe_interval: Duration,
    /// Seconds a GPU must be read fine after its last fault before its devices are served
    /// again (offered to the kubelet again, or their taints removed).
    #[arg(long, env = "HEALTH_RECOVERY_PERIOD", default_value = "60", value_parser = parse_seconds)]
    pub health_recovery_period: Duration,
    /// Address of `/metrics`, `/healthz`, `/readyz` (`:8080` or `host:port`); empty disables.
    #[arg(long, env = env::HTTP_ENDPOINT, default_value = "", value_parser = parse_endpoint)]
    pub http_endpoint: HttpEndpoint,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: service::logging::LogFormat,
}

impl NodeFlags {
    /// The driver's roots: the validator's `driver-ready` file where it can be read, the flags
    /// otherwise (logged, since a node whose validator has not run yet is normal at start).
    pub fn driver_paths(&self) -> DriverPaths {
        let ready = DriverReady::read(&self.driver_ready_file)
            .inspect_err(|e| tracing::info!(file = %self.driver_ready_file.display(), error = %e, "no usable driver-ready file; using the flags"))
            .ok();
        DriverPaths::decide(
            &self.nvidia_driver_root,
            &self.driver_root_ctr_path,
            ready.as_ref().map(|r| &r.paths),
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Agent {
        #[command(flatten)]
        node: NodeFlags,
    }

    #[test]
    fn defaults_follow_the_contract() {
        let a = Agent::try_parse_from(["a"]).unwrap();
        assert_eq!(a.node.cdi_root, PathBuf::from("/var/run/cdi"));
        assert_eq!(
            a.node.driver_ready_file,
            PathBuf::from("/run/nvidia/validations/driver-ready")
        );
        assert_eq!(a.node.http_endpoint, HttpEndpoint(None));
        assert_eq!(a.node.health_probe_interval, Duration::from_secs(5));
    }

    #[test]
    fn seconds_must_be_positive_and_finite() {
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "inf", "NaN", "soon"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints_are_a_port_or_an_address() {
        assert_eq!(parse_endpoint(""), Ok(HttpEndpoint(None)));
        assert_eq!(
            parse_endpoint(":8080"),
            Ok(HttpEndpoint(Some("0.0.0.0:8080".parse().unwrap())))
        );
    }
}
