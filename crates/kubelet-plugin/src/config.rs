//! Command line and environment of `gpu-kubelet-plugin`; every flag is also an env var, with
//! the upstream plugin's names.

use api::contract::{env, paths};
use clap::Parser;
use node_agent::flags::NodeFlags;
use std::path::PathBuf;

/// `<kubelet root>/plugins_registry`.
fn default_registrar_dir() -> PathBuf {
    PathBuf::from(paths::DEFAULT_KUBELET_ROOT).join("plugins_registry")
}

/// `<kubelet root>/plugins`.
fn default_plugins_dir() -> PathBuf {
    PathBuf::from(paths::DEFAULT_KUBELET_ROOT).join("plugins")
}

/// `gpu-kubelet-plugin`: publishes this node's GPUs as ResourceSlices and prepares them for
/// containers through CDI.
#[derive(Debug, Clone, Parser)]
#[command(name = "gpu-kubelet-plugin", version)]
pub struct Config {
    /// The node this plugin serves (pool name and slice owner).
    #[arg(long, env = env::NODE_NAME)]
    pub node_name: String,
    /// What every node agent takes: the driver's roots, CDI, health timings, metrics, logs.
    #[command(flatten)]
    pub node: NodeFlags,
    /// The kubelet's plugin registration directory.
    #[arg(long, env = env::KUBELET_REGISTRAR_DIRECTORY_PATH, default_value_os_t = default_registrar_dir())]
    pub kubelet_registrar_directory_path: PathBuf,
    /// The kubelet's plugins directory; the plugin's data dir is `<this>/gpu.nvidia.com`.
    #[arg(long, env = env::KUBELET_PLUGINS_DIRECTORY_PATH, default_value_os_t = default_plugins_dir())]
    pub kubelet_plugins_directory_path: PathBuf,
    /// TCP port of the gRPC liveness service; negative disables it.
    #[arg(long, env = env::HEALTHCHECK_PORT, default_value_t = -1, allow_negative_numbers = true)]
    pub healthcheck_port: i32,
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
    /// How MIG devices come to be: `static` (an admin makes them; the plugin publishes those it
    /// finds) or `dynamic` (the plugin publishes every partition a GPU supports and makes the one
    /// a claim is given when it is prepared). The upstream driver's feature gate
    /// `DynamicMIG=true` also asks for `dynamic`.
    #[arg(long, env = env::MIG_PARTITIONING, default_value = "static")]
    pub mig_partitioning: crate::partitions::Partitioning,
    /// Feature gates, as the upstream driver takes them (`DynamicMIG=true,...`); unknown gates
    /// are ignored.
    #[arg(long, env = env::FEATURE_GATES, default_value = "")]
    pub feature_gates: String,
    /// Source of the node's boot id (checkpoints from other boots are discarded).
    #[arg(long, env = "BOOT_ID_FILE", default_value = crate::checkpoint::BOOT_ID_PATH)]
    pub boot_id_file: PathBuf,
}

impl Config {
    /// The plugin's data directory.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_plugins_directory_path
            .join(api::contract::DRIVER_NAME)
    }

    /// The MIG partitioning in force: `dynamic` when asked for by the flag or by the
    /// `DynamicMIG` feature gate. A gate list that is not `Name=bool,...` is an error naming it.
    pub fn partitioning(&self) -> Result<crate::partitions::Partitioning, String> {
        let mut dynamic_gate = false;
        for gate in self
            .feature_gates
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty())
        {
            let (name, value) = gate
                .split_once('=')
                .ok_or_else(|| format!("feature gate {gate:?} is not Name=true or Name=false"))?;
            let on: bool = value
                .trim()
                .parse()
                .map_err(|_| format!("feature gate {gate:?} is not Name=true or Name=false"))?;
            if name.trim() == "DynamicMIG" {
                dynamic_gate = on;
            }
        }
        Ok(if dynamic_gate {
            crate::partitions::Partitioning::Dynamic
        } else {
            self.mig_partitioning
        })
    }

    /// The health port, if enabled.
    pub fn health_port(&self) -> Option<u16> {
        u16::try_from(self.healthcheck_port).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_agent::flags::HttpEndpoint;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::try_parse_from(["p", "--node-name", "n1"]).unwrap();
        assert_eq!(
            c.plugin_dir(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com")
        );
        assert_eq!(c.health_port(), None);
        assert_eq!(c.node.http_endpoint, HttpEndpoint(None));
        assert_eq!(c.node.cdi_root, PathBuf::from("/var/run/cdi"));
        assert_eq!(
            c.kubelet_registrar_directory_path,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        assert_eq!(
            c.node.driver_ready_file,
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
            c.node.http_endpoint,
            HttpEndpoint(Some("0.0.0.0:8080".parse().unwrap()))
        );
    }

    #[test]
    fn dynamic_mig_is_asked_for_by_the_flag_or_the_upstream_gate() {
        use crate::partitions::Partitioning;
        let parse = |args: &[&str]| {
            let mut all = vec!["p", "--node-name", "n"];
            all.extend(args);
            Config::try_parse_from(all).unwrap().partitioning()
        };
        assert_eq!(parse(&[]), Ok(Partitioning::Static));
        assert_eq!(
            parse(&["--mig-partitioning", "dynamic"]),
            Ok(Partitioning::Dynamic)
        );
        assert_eq!(
            parse(&["--feature-gates", "MPSSupport=true, DynamicMIG=true"]),
            Ok(Partitioning::Dynamic)
        );
        assert_eq!(
            parse(&["--feature-gates", "DynamicMIG=false"]),
            Ok(Partitioning::Static)
        );
        assert!(
            parse(&["--feature-gates", "DynamicMIG"])
                .unwrap_err()
                .contains("\"DynamicMIG\" is not Name=true")
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
