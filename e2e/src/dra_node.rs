//! A fake GPU node's DRA side, as the kubelet-plugin pod would run it: a driver root holding the
//! mock NVML, `dra-driver-validator driver` run once like the init container, then
//! `gpu-kubelet-plugin` serving the node's kubelet directories.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, ensure};
use gpu_discovery::testing::{FakeNode, install_inventory_mig_caps, mock_config};
use gpu_discovery::{InitMode, NvmlSession};

use crate::{Env, Process};

/// One fake node's driver root and running plugin.
#[derive(Debug)]
pub struct DraNode {
    /// Node name.
    pub name: String,
    /// Where CDI specs for this node's claims are written.
    pub cdi_root: PathBuf,
    /// The plugin process.
    pub plugin: Process,
    fake: FakeNode,
}

impl DraNode {
    /// Installs a mock driver serving `gpus` GPUs of `profile`, validates it and starts the plugin.
    pub fn start(env: &Env, node: &str, profile: &str, gpus: u32) -> anyhow::Result<DraNode> {
        let fake = FakeNode::new();
        let library = fake.install_host_driver(&mock_config(profile, gpus));
        // What the driver shows in /proc for the MIG devices the mock serves.
        let inventory = NvmlSession::open(&library, InitMode::Full)
            .and_then(|nvml| nvml.inventory())
            .with_context(|| format!("reading the mock GPUs of {node}"))?;
        install_inventory_mig_caps(&fake.host_root(), &inventory);
        let status_dir = fake.status_dir();
        let out = Command::new(env.bin_dir.join("dra-driver-validator"))
            .arg("driver")
            .env("HOST_ROOT", fake.host_root())
            .env("DRIVER_INSTALL_DIR_CTR_PATH", fake.driver_root())
            .env("OUTPUT_DIR", &status_dir)
            .output()
            .context("running dra-driver-validator")?;
        ensure!(
            out.status.success(),
            "driver validation failed on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cdi_root = fake.host_root().join("var/run/cdi");
        std::fs::create_dir_all(&cdi_root)?;
        let plugin = Self::spawn_plugin(env, node, &fake, &cdi_root)?;
        Ok(DraNode {
            name: node.to_owned(),
            cdi_root,
            plugin,
            fake,
        })
    }

    fn spawn_plugin(
        env: &Env,
        node: &str,
        fake: &FakeNode,
        cdi_root: &std::path::Path,
    ) -> anyhow::Result<Process> {
        let kubelet = env.kubelet_dir(node);
        let ready = fake.status_dir().join("driver-ready");
        let registrar = kubelet.join("plugins_registry");
        let plugins = kubelet.join("plugins");
        let boot_id = fake.host_root().join("boot_id");
        if !boot_id.exists() {
            std::fs::write(&boot_id, format!("{node}-boot-1\n"))?;
        }
        let vars = [
            ("NODE_NAME", node.to_owned()),
            ("DRIVER_READY_FILE", ready.display().to_string()),
            ("CDI_ROOT", cdi_root.display().to_string()),
            (
                "KUBELET_REGISTRAR_DIRECTORY_PATH",
                registrar.display().to_string(),
            ),
            (
                "KUBELET_PLUGINS_DIRECTORY_PATH",
                plugins.display().to_string(),
            ),
            ("BOOT_ID_FILE", boot_id.display().to_string()),
            ("PROCFS_ROOT", fake.host_root().display().to_string()),
        ];
        let envs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.spawn(
            "gpu-kubelet-plugin",
            &format!("gpu-kubelet-plugin-{node}"),
            &envs,
        )
    }

    /// Kills the plugin with SIGKILL and starts it again with the same directories.
    pub fn restart_plugin(&mut self, env: &Env) -> anyhow::Result<()> {
        self.plugin.kill();
        self.plugin = Self::spawn_plugin(env, &self.name, &self.fake, &self.cdi_root)?;
        Ok(())
    }
}
