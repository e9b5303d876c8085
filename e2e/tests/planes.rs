//! Two planes in one cluster, on the local cluster: `DEFAULT_GPU_ALLOCATION_MODE=device-plugin`
//! sends new GPU nodes to the device-plugin plane once that plane is served; a ClusterPolicy
//! (the upstream CRD's stand-in in `e2e/testdata`) installed while the labeler and the operator run
//! is noticed by both: the labeler counts its plane as served, and the operator leaves that plane to
//! it (no device plugin of ours) and takes it back when the ClusterPolicy goes.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use api::GPUCluster;
use api::contract::{labels as l, objects as o};
use e2e::{
    Env, delete_cluster_policy, delete_nodes, eventually, fresh_namespace, install_cluster_policy,
    install_crd, kwok_gpu_node, metric, set_spec, uninstall_cluster_policy,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Node};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "e2e-planes";
const OPERATOR_METRICS: &str = "127.0.0.1:18086";
const LABELER_METRICS: &str = "127.0.0.1:18087";

/// The node's mode and deploy labels.
fn planes(node: &Node) -> (Option<String>, BTreeMap<String, String>) {
    let labels = node.labels();
    let deploy = labels
        .iter()
        .filter(|(k, _)| k.starts_with(l::DEPLOY_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (labels.get(l::ALLOCATION_MODE).cloned(), deploy)
}

async fn wait_for_mode(nodes: &Api<Node>, name: &str, mode: &str) -> anyhow::Result<Node> {
    eventually(
        Duration::from_secs(60),
        &format!("node {name} in {mode} mode with its plane's deploy labels"),
        || async {
            let node = nodes.get(name).await?;
            let (got, deploy) = planes(&node);
            let key = match mode {
                "dra" => l::DEPLOY_DRA_DRIVER,
                _ => l::DEPLOY_DEVICE_PLUGIN,
            };
            let done =
                got.as_deref() == Some(mode) && deploy.get(key).map(String::as_str) == Some("true");
            Ok(done.then_some(node))
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn cluster_policy_and_default_mode_on_the_local_cluster() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    uninstall_cluster_policy(&client).await?;
    fresh_namespace(&client, NS).await?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    // A run that failed half-way may have left its nodes; new ones are what this test is about.
    delete_nodes(&client, &["planes-a", "planes-b"]).await?;
    // Only the DRA plane is served at first: the GPUCluster's device plugin is off and no
    // ClusterPolicy exists.
    set_spec(&gcs, json!({"devicePlugin": {"enabled": false}})).await?;
    // A device-plugin config that is both written here and taken from a ConfigMap is refused by
    // the apiserver, with a message that names the fields.
    let both = json!({"devicePlugin": {"config": {"name": "mine", "default": "a100",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}}});
    let refused = set_spec(&gcs, both)
        .await
        .expect_err("config.name beside config.sharing");
    assert!(
        refused
            .to_string()
            .contains("devicePlugin.config.sharing or devicePlugin.config.name"),
        "{refused}"
    );

    let labeler = env.spawn(
        "node-labeler",
        "node-labeler-planes",
        &[
            ("HTTP_ENDPOINT", LABELER_METRICS),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler-planes"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "device-plugin"),
        ],
    )?;
    nodes
        .create(
            &PostParams::default(),
            &kwok_gpu_node("planes-a", "planes", 0),
        )
        .await?;
    wait_for_mode(&nodes, "planes-a", "dra")
        .await
        .with_context(|| labeler.log_tail())?;

    // A ClusterPolicy appears: both planes are served, and the default sends new nodes to the
    // device-plugin plane. planes-a keeps its mode.
    install_cluster_policy(&client).await?;
    eventually(
        Duration::from_secs(30),
        "the labeler to see the ClusterPolicy",
        || async {
            let present = metric(LABELER_METRICS, "node_labeler_cluster_policy_present").await?;
            Ok((present == 1.0).then_some(()))
        },
    )
    .await
    .with_context(|| labeler.log_tail())?;
    nodes
        .create(
            &PostParams::default(),
            &kwok_gpu_node("planes-b", "planes", 0),
        )
        .await?;
    let b = wait_for_mode(&nodes, "planes-b", "device-plugin")
        .await
        .with_context(|| labeler.log_tail())?;
    let (_, deploy) = planes(&b);
    for key in l::DEVICE_PLUGIN_PLANE_KEYS {
        assert_eq!(
            deploy.get(key).map(String::as_str),
            Some("true"),
            "{key} on planes-b: {deploy:?}"
        );
    }
    for key in [l::DEPLOY_DRA_DRIVER, l::DEPLOY_DRA_VALIDATOR] {
        assert!(
            !deploy.contains_key(key),
            "{key} on a device-plugin node: {deploy:?}"
        );
    }
    let (mode_a, _) = planes(&nodes.get("planes-a").await?);
    assert_eq!(
        mode_a.as_deref(),
        Some("dra"),
        "an existing node kept its mode"
    );

    // The operator, started while the ClusterPolicy exists, renders no device plugin of ours even
    // with spec.devicePlugin enabled.
    set_spec(&gcs, json!({})).await?;
    let operator = env.spawn(
        "gpu-operator",
        "gpu-operator-planes",
        &[
            ("OPERATOR_NAMESPACE", NS),
            ("HTTP_ENDPOINT", OPERATOR_METRICS),
            ("POD_NAME", "operator-planes"),
        ],
    )?;
    eventually(
        Duration::from_secs(60),
        "the first reconcile to apply the DRA plane and write status",
        || async {
            let plugin = daemonsets.get_opt(o::KUBELET_PLUGIN_DAEMONSET).await?;
            let status = gcs.get("gpu-cluster").await?.status;
            let reported = status.is_some_and(|s| !s.operands.is_empty());
            Ok((plugin.is_some() && reported).then_some(()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    assert!(
        daemonsets
            .get_opt(o::DEVICE_PLUGIN_DAEMONSET)
            .await?
            .is_none(),
        "our device plugin beside a ClusterPolicy"
    );

    // The ClusterPolicy goes: the device-plugin plane is ours again; it comes back: ours leaves.
    delete_cluster_policy(&client).await?;
    eventually(
        Duration::from_secs(60),
        "our device plugin once no ClusterPolicy serves the plane",
        || async {
            Ok(daemonsets
                .get_opt(o::DEVICE_PLUGIN_DAEMONSET)
                .await?
                .map(|_| ()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    install_cluster_policy(&client).await?;
    eventually(
        Duration::from_secs(60),
        "our device plugin pruned when a ClusterPolicy appears",
        || async {
            let gone = daemonsets
                .get_opt(o::DEVICE_PLUGIN_DAEMONSET)
                .await?
                .is_none();
            Ok(gone.then_some(()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;

    // A plane policy: a rule whose selector is malformed is refused naming the rule; a rule that
    // takes this test's nodes to DRA moves the one the labeler put on the device-plugin plane,
    // and a mode label set by hand wins over the rule.
    let bad = json!({"planePolicy": {"rules": [{"name": "bad-rule", "mode": "dra",
        "nodeSelector": {"matchExpressions": [{"key": "e2e", "operator": "In"}]}}]}});
    let refused = set_spec(&gcs, bad).await.expect_err("In without values");
    assert!(
        refused.to_string().contains("planePolicy rule bad-rule"),
        "{refused}"
    );
    // No validator runs on these nodes, so their hand-overs never finish: they must not queue.
    let rule = json!({"planePolicy": {"rules": [{"name": "planes-on-dra", "mode": "dra",
        "nodeSelector": {"matchLabels": {"e2e": "planes"}}}]},
        "migration": {"maxUnavailable": 100}});
    let pin = json!({"metadata": {"labels": {l::ALLOCATION_MODE: "device-plugin"}}});
    nodes
        .patch("planes-a", &PatchParams::default(), &Patch::Merge(&pin))
        .await?;
    set_spec(&gcs, rule).await?;
    let b = wait_for_mode(&nodes, "planes-b", "dra")
        .await
        .with_context(|| labeler.log_tail())?;
    assert_eq!(
        b.annotations()
            .get(api::contract::labels::CHOSEN_MODE)
            .map(String::as_str),
        Some("dra"),
        "the labeler records what it chose"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let a = nodes.get("planes-a").await?;
    assert_eq!(
        planes(&a).0.as_deref(),
        Some("device-plugin"),
        "a hand-set mode wins"
    );
    assert!(
        !a.annotations()
            .contains_key(api::contract::labels::CHOSEN_MODE)
    );

    // A node opted out is served by no plane: the labeler says why on the node, once, and the
    // GPUCluster names it.
    let opt_out = json!({"metadata": {"labels": {l::ENABLED: "false"}}});
    nodes
        .patch("planes-b", &PatchParams::default(), &Patch::Merge(&opt_out))
        .await?;
    let events: Api<Event> = Api::all(client.clone());
    eventually(
        Duration::from_secs(30),
        "a NoGPUPlane Event on planes-b",
        || async {
            let seen = e2e::events_on(&events, "planes-b").await?;
            Ok(seen
                .into_iter()
                .find(|(reason, message)| reason == "NoGPUPlane" && message.contains("opted out")))
        },
    )
    .await
    .with_context(|| labeler.log_tail())?;
    let unserved = eventually(
        Duration::from_secs(30),
        "GPUNodesUnserved naming planes-b",
        || async {
            let status = gcs.get("gpu-cluster").await?.status.unwrap_or_default();
            Ok(status.conditions.into_iter().find(|c| {
                c.type_ == "GPUNodesUnserved"
                    && c.status == "True"
                    && c.message.contains("node planes-b: opted out")
            }))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    eprintln!("GPUNodesUnserved: {}", unserved.message);

    // Clean up while the operator runs (its finalizer holds the GPUCluster until it drains).
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    eventually(Duration::from_secs(60), "the GPUCluster gone", || async {
        Ok(gcs.get_opt("gpu-cluster").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| operator.log_tail())?;
    uninstall_cluster_policy(&client).await?;
    for name in ["planes-a", "planes-b"] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::default())
        .await;
    Ok(())
}
