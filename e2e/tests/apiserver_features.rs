//! What the operator does on an apiserver that lacks part of DRA: without `resource.k8s.io/v1` the
//! GPUCluster says so in its Error condition; with DRA feature gates off it names each feature and
//! what does not work without it, and keeps what is served. Each test brings up a small cluster of
//! its own.

use std::time::Duration;

use anyhow::Context;
use api::GPUCluster;
use e2e::helm::OwnCluster;
use e2e::{Env, Process, eventually, install_crd};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// The operator on `cluster`, logging as `name` with its metrics on `metrics`, and the
/// `gpu-cluster` singleton applied with an empty spec.
async fn operator_with_gpu_cluster(
    cluster: &OwnCluster,
    shared: &Env,
    name: &str,
    metrics: &str,
) -> anyhow::Result<(Process, Api<GPUCluster>, kube::Client)> {
    let env = cluster.env(shared);
    let client = env.client().await?;
    install_crd(&client).await?;
    let operator = env.spawn(
        "gpu-operator",
        name,
        &[
            ("OPERATOR_NAMESPACE", "default"),
            ("HTTP_ENDPOINT", metrics),
            ("LEADER_ELECT", "false"),
        ],
    )?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    gcs.patch("gpu-cluster", &PatchParams::apply("e2e"), &Patch::Apply(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"}, "spec": {}})))
        .await?;
    Ok((operator, gcs, client))
}

/// The first condition of the GPUCluster that `wanted` accepts, within 60 s.
async fn condition(
    gcs: &Api<GPUCluster>,
    operator: &Process,
    what: &str,
    wanted: impl Fn(&Condition) -> bool,
) -> anyhow::Result<Condition> {
    eventually(Duration::from_secs(60), what, || async {
        let status = gcs.get("gpu-cluster").await?.status.unwrap_or_default();
        Ok(status.conditions.into_iter().find(|c| wanted(c)))
    })
    .await
    .with_context(|| operator.log_tail())
}

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn gpucluster_reports_a_cluster_without_the_dra_api() -> anyhow::Result<()> {
    let shared = Env::from_env()?;
    let cluster = OwnCluster::up(
        shared.cluster_dir.join("no-dra-api"),
        28100,
        "resource.k8s.io/v1=false,scheduling.k8s.io/v1beta1=true",
    )?;
    let (operator, gcs, _) =
        operator_with_gpu_cluster(&cluster, &shared, "no-dra-api-operator", "127.0.0.1:18095")
            .await?;
    let error = condition(
        &gcs,
        &operator,
        "an Error condition about the DRA API",
        |c| c.type_ == "Error" && c.status == "True",
    )
    .await?;
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

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn gpucluster_names_the_dra_features_the_apiserver_lacks() -> anyhow::Result<()> {
    let shared = Env::from_env()?;
    let cluster = OwnCluster::up_with_gates_off(
        shared.cluster_dir.join("gates-off"),
        28300,
        "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1beta1=true",
        // Gates 1.37 still lets an admin switch off (DRAExtendedResource is GA and locked on there);
        // DRADeviceTaintRules depends on DRADeviceTaints.
        "DRADeviceTaints,DRADeviceTaintRules,DRAConsumableCapacity",
    )?;
    let (operator, gcs, client) =
        operator_with_gpu_cluster(&cluster, &shared, "gates-off-operator", "127.0.0.1:18096")
            .await?;
    let features = condition(&gcs, &operator, "a DRAFeaturesServed condition", |c| {
        c.type_ == "DRAFeaturesServed"
    })
    .await?;
    eprintln!(
        "DRAFeaturesServed: {}: {}",
        features.reason, features.message
    );
    assert_eq!(features.status, "False");
    assert_eq!(features.reason, "FeaturesMissing");
    for named in [
        "DRADeviceTaints is off: a failing GPU cannot be tainted in its ResourceSlice",
        "DRAConsumableCapacity is off",
    ] {
        assert!(features.message.contains(named), "{}", features.message);
    }
    for served in [
        "DRAExtendedResource",
        "DRAPartitionableDevices",
        "DRADeviceBinding",
    ] {
        assert!(!features.message.contains(served), "{}", features.message);
    }
    // The class keeps the field the apiserver serves.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let gpu = eventually(
        Duration::from_secs(30),
        "the DeviceClass gpu.nvidia.com",
        || async { Ok(classes.get_opt("gpu.nvidia.com").await?) },
    )
    .await
    .with_context(|| operator.log_tail())?;
    assert_eq!(
        gpu.spec.extended_resource_name.as_deref(),
        Some("nvidia.com/gpu")
    );
    Ok(())
}
