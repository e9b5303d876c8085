//! On a cluster whose apiserver does not serve resource.k8s.io/v1, the GPUCluster says so in its
//! Error condition instead of failing silently. Brings up a small cluster of its own.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use api::GPUCluster;
use e2e::{Env, eventually, install_crd};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// A cluster started by `hack/cluster up` and stopped when dropped.
struct OwnCluster {
    dir: PathBuf,
    port_base: &'static str,
}

impl OwnCluster {
    fn script() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../hack/cluster")
    }

    fn run(&self, verb: &str, runtime_config: &str) -> anyhow::Result<()> {
        let out = Command::new(Self::script())
            .arg(verb)
            .env("CLUSTER_DIR", &self.dir)
            .env("PORT_BASE", self.port_base)
            .env("NODES", "1")
            .env("CPU_NODES", "0")
            .env("APISERVER_RUNTIME_CONFIG", runtime_config)
            // The Node authorizer cannot start without resource.k8s.io/v1.
            .env("APISERVER_AUTHORIZATION_MODE", "RBAC")
            .output()
            .with_context(|| format!("hack/cluster {verb}"))?;
        ensure!(
            out.status.success(),
            "hack/cluster {verb} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.run("down", "");
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn gpucluster_reports_a_cluster_without_the_dra_api() -> anyhow::Result<()> {
    let shared = Env::from_env()?;
    let cluster = OwnCluster {
        dir: shared.cluster_dir.join("no-dra-api"),
        port_base: "28100",
    };
    cluster.run(
        "up",
        "resource.k8s.io/v1=false,scheduling.k8s.io/v1alpha2=true",
    )?;
    let env = Env {
        kubeconfig: cluster.dir.join("kubeconfig"),
        cluster_dir: cluster.dir.clone(),
        ..shared
    };
    let client = env.client().await?;
    install_crd(&client).await?;
    let operator = env.spawn(
        "gpu-operator",
        "no-dra-api-operator",
        &[
            ("OPERATOR_NAMESPACE", "default"),
            ("HTTP_ENDPOINT", "127.0.0.1:18095"),
            ("LEADER_ELECT", "false"),
        ],
    )?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    gcs.patch("gpu-cluster", &PatchParams::apply("e2e"), &Patch::Apply(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"}, "spec": {}})))
        .await?;
    let error = eventually(
        Duration::from_secs(60),
        "an Error condition about the DRA API",
        || async {
            let gc = gcs.get("gpu-cluster").await?;
            let status = gc.status.unwrap_or_default();
            Ok(status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Error" && c.status == "True"))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    assert_eq!(error.reason, "DRAAPINotServed");
    assert!(
        error.message.contains("resource.k8s.io/v1") && error.message.contains("1.34"),
        "{}",
        error.message
    );
    let state = gcs.get("gpu-cluster").await?.status.and_then(|s| s.state);
    assert_eq!(state, Some(api::gpucluster::State::NotReady));
    Ok(())
}
