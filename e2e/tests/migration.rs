//! Node-by-node hand-over between the planes, on the local cluster: two KWOK GPU nodes move from
//! the device-plugin plane to DRA one at a time while a Deployment with a PodDisruptionBudget keeps
//! a replica running; then back, where the device-plugin plane never becomes ready, so the first
//! node is rolled back and the rollout pauses.
//!
//! The test plays the kubelet: it marks pods on its nodes as prepared (KWOK then runs them), except
//! the validator pods of a plane it wants to fail. The validators are DaemonSets of the operator's
//! names selecting the deploy labels, as the operator renders them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use api::GPUCluster;
use api::contract::{labels as l, objects as o};
use api::handover::{Handover, Phase};
use e2e::{Env, delete_nodes, eventually, fresh_namespace, install_crd, kwok_gpu_node, set_spec};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "e2e-migration";
const NODES: [&str; 2] = ["migration-a", "migration-b"];
const LABELER_METRICS: &str = "127.0.0.1:18088";
const OPERATOR_NS: &str = "e2e-migration-operator";
const OPERATOR_METRICS: &str = "127.0.0.1:18089";
const PREPARED: &str = "minikubelet.gpu-operator-rs.dev/prepared";

/// A validator DaemonSet of the operator's name, on the nodes carrying `deploy_key`.
fn validator(name: &str, deploy_key: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": name, "app": l::VALIDATOR_APP}},
                "spec": {
                    "nodeSelector": {deploy_key: "true", "e2e": "migration"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "validator", "image": "validator"}]
                }
            }
        }
    }))
    .expect("a valid DaemonSet")
}

fn workload() -> (Deployment, PodDisruptionBudget) {
    let deployment = serde_json::from_value(json!({
        "metadata": {"name": "gpu-app", "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "gpu-app"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-app"}},
                "spec": {
                    "nodeSelector": {"e2e": "migration"},
                    "containers": [{"name": "app", "image": "app",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
                }
            }
        }
    }))
    .expect("a valid Deployment");
    let pdb = serde_json::from_value(json!({
        "metadata": {"name": "gpu-app", "namespace": NS},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "gpu-app"}}}
    }))
    .expect("a valid PodDisruptionBudget");
    (deployment, pdb)
}

/// Plays the kubelet of `on` (the test's nodes) for the test's namespace: marks its pods prepared
/// so KWOK runs them, but leaves the validator pods of `broken` planes pending. (The operator's own
/// pods, in another namespace, stay pending: this test is about the labeler and the status.)
async fn kubelet(
    client: kube::Client,
    on: &'static [&'static str],
    broken_dra: Arc<AtomicBool>,
    broken_dp: Arc<AtomicBool>,
) {
    let pods: Api<Pod> = Api::namespaced(client, NS);
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for pod in list.items {
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                if !node.is_some_and(|n| on.contains(&n.as_str()))
                    || pod.annotations().contains_key(PREPARED)
                {
                    continue;
                }
                let owner = pod
                    .owner_references()
                    .first()
                    .map(|o| o.name.clone())
                    .unwrap_or_default();
                let broken = (owner == o::VALIDATOR_DAEMONSET && broken_dra.load(Ordering::SeqCst))
                    || (owner == o::OPERATOR_VALIDATOR_DAEMONSET
                        && broken_dp.load(Ordering::SeqCst));
                if broken {
                    continue;
                }
                let body = json!({"metadata": {"annotations": {PREPARED: "true"}}});
                let _ = pods
                    .patch(
                        &pod.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&body),
                    )
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What every sample of the test's nodes and pods must show, whatever the step.
#[derive(Debug, Default)]
struct Watch {
    samples: usize,
    max_in_progress: usize,
    max_in_status: usize,
    min_running: Option<usize>,
    violations: Vec<String>,
}

async fn sample(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    gcs: &Api<GPUCluster>,
    watch: &mut Watch,
) -> anyhow::Result<()> {
    let listed = gcs
        .get("gpu-cluster")
        .await?
        .status
        .and_then(|s| s.migration)
        .map_or(0, |m| m.in_progress.len());
    watch.max_in_status = watch.max_in_status.max(listed);
    let mut in_progress = 0;
    for name in NODES {
        let node = nodes.get(name).await?;
        let labels = node.labels();
        let on = |k: &str| labels.get(k).is_some_and(|v| !v.is_empty());
        if on(l::DEPLOY_DRA_DRIVER) && on(l::DEPLOY_DEVICE_PLUGIN) {
            watch
                .violations
                .push(format!("{name} carries both planes' plugins: {labels:?}"));
        }
        if let Some(stack) = labels.get(l::GPU_STACK) {
            let key = match stack.as_str() {
                "dra" => l::DEPLOY_DRA_DRIVER,
                _ => l::DEPLOY_DEVICE_PLUGIN,
            };
            if !on(key) {
                watch
                    .violations
                    .push(format!("{name} says gpu-stack={stack} without {key}"));
            }
        }
        in_progress += usize::from(
            node.annotations()
                .get(l::HANDOVER)
                .and_then(|v| Handover::parse(v))
                .is_some_and(|h| h.phase.in_progress()),
        );
    }
    let running = pods
        .list(&ListParams::default().labels("app=gpu-app"))
        .await?
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .count();
    watch.samples += 1;
    watch.max_in_progress = watch.max_in_progress.max(in_progress);
    watch.min_running = Some(watch.min_running.map_or(running, |m| m.min(running)));
    Ok(())
}

/// The node's plane once its hand-over is over: mode, plugin label and readiness labels agree.
async fn settled_on(nodes: &Api<Node>, name: &str, mode: &str) -> anyhow::Result<Option<Node>> {
    let node = nodes.get(name).await?;
    let labels = node.labels();
    let plugin = match mode {
        "dra" => l::DEPLOY_DRA_DRIVER,
        _ => l::DEPLOY_DEVICE_PLUGIN,
    };
    let done = labels.get(l::ALLOCATION_MODE).map(String::as_str) == Some(mode)
        && labels.get(plugin).map(String::as_str) == Some("true")
        && labels.get(l::GPU_STACK).map(String::as_str) == Some(mode)
        && labels.get(l::GPU_SETUP_COMPLETE).map(String::as_str) == Some("true")
        && !node.annotations().contains_key(l::HANDOVER)
        && node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true);
    Ok(done.then_some(node))
}

/// Waits until each of `names` is settled on `mode` (see [`settled_on`]), naming the node and
/// showing the labeler's log when one is not within a minute.
async fn all_settled_on(
    nodes: &Api<Node>,
    names: &[&str],
    mode: &str,
    labeler: &e2e::Process,
) -> anyhow::Result<()> {
    for name in names {
        eventually(
            Duration::from_secs(60),
            &format!("{name} ready on the {mode} plane"),
            || settled_on(nodes, name, mode),
        )
        .await
        .with_context(|| labeler.log_tail())?;
    }
    Ok(())
}

fn has_event(seen: &[(String, String)], reason: &str, text: &str) -> bool {
    seen.iter().any(|(r, m)| r == reason && m.contains(text))
}

/// A device-plugin node whose one GPU pod a PodDisruptionBudget never lets go.
const STUCK: &str = "drain-stuck";

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn a_drain_blocked_past_the_deadline_gives_up_naming_the_pods() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    fresh_namespace(&client, NS).await?;
    fresh_namespace(&client, OPERATOR_NS).await?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let events: Api<Event> = Api::all(client.clone());
    delete_nodes(&client, &[STUCK]).await?;
    let policy = |mode: &str| {
        json!({
            "planePolicy": {"rules": [{"name": "stuck", "mode": mode,
                                       "nodeSelector": {"matchLabels": {"e2e": "migration"}}}]},
            "migration": {"maxUnavailable": 1, "progressDeadlineSeconds": 8, "drain": "evict"},
        })
    };
    set_spec(&gcs, policy("device-plugin")).await?;
    let validator = validator(
        o::OPERATOR_VALIDATOR_DAEMONSET,
        l::DEPLOY_OPERATOR_VALIDATOR,
    );
    let pp = PatchParams::apply("e2e-migration").force();
    Api::<DaemonSet>::namespaced(client.clone(), NS)
        .patch(&validator.name_any(), &pp, &Patch::Apply(&validator))
        .await?;
    let never = Arc::new(AtomicBool::new(false));
    let kubelet_task = tokio::spawn(kubelet(client.clone(), &[STUCK], never.clone(), never));
    let labeler = env.spawn(
        "node-labeler",
        "node-labeler-stuck",
        &[
            ("HTTP_ENDPOINT", LABELER_METRICS),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler-stuck"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "device-plugin"),
        ],
    )?;
    let operator = env.spawn(
        "gpu-operator",
        "gpu-operator-stuck",
        &[
            ("OPERATOR_NAMESPACE", OPERATOR_NS),
            ("HTTP_ENDPOINT", OPERATOR_METRICS),
            ("POD_NAME", "operator-stuck"),
        ],
    )?;
    nodes
        .create(
            &PostParams::default(),
            &kwok_gpu_node(STUCK, "migration", 1),
        )
        .await?;
    let result = async {
        all_settled_on(&nodes, &[STUCK], "device-plugin", &labeler).await?;
        // A pod holding the GPU, which its PodDisruptionBudget never lets be evicted.
        let held: Pod = serde_json::from_value(json!({
            "metadata": {"name": "held", "namespace": NS, "labels": {"app": "held"}},
            "spec": {"nodeName": STUCK, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "app", "image": "app",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))?;
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "held", "namespace": NS},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "held"}}}
        }))?;
        Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
            .patch("held", &pp, &Patch::Apply(&pdb))
            .await?;
        pods.create(&PostParams::default(), &held).await?;
        eventually(Duration::from_secs(60), "the held pod running", || async {
            let pod = pods.get("held").await?;
            Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
        })
        .await?;

        // To DRA: the drain never ends, so past the deadline the node gives up, uncordoned, on
        // the device-plugin plane, and both the Event and the GPUCluster name the pod.
        set_spec(&gcs, policy("dra")).await?;
        let record = eventually(
            Duration::from_secs(60),
            "the drain given up: rolled back, uncordoned, still on the device-plugin plane",
            || async {
                let node = nodes.get(STUCK).await?;
                let record = node
                    .annotations()
                    .get(l::HANDOVER)
                    .and_then(|v| Handover::parse(v))
                    .filter(|h| h.phase == Phase::RolledBack);
                let stayed = node.labels().get(l::GPU_STACK).map(String::as_str)
                    == Some("device-plugin")
                    && node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true);
                Ok(record.filter(|_| stayed))
            },
        )
        .await
        .with_context(|| labeler.log_tail())?;
        let reason = record.rollback.map(|r| r.reason).unwrap_or_default();
        let pod = format!("{NS}/held");
        anyhow::ensure!(
            reason.contains("still held device-plugin GPUs after 8s of draining")
                && reason.contains(&pod),
            "{reason}"
        );
        let seen = e2e::events_on(&events, STUCK).await?;
        anyhow::ensure!(
            has_event(&seen, "HandoverDrainTimedOut", &pod),
            "no HandoverDrainTimedOut naming {pod}: {seen:?}"
        );
        anyhow::ensure!(
            pods.get("held")
                .await?
                .metadata
                .deletion_timestamp
                .is_none(),
            "the held pod was not evicted"
        );
        eventually(
            Duration::from_secs(30),
            "MigrationPaused naming the pod",
            || async {
                let status = gcs.get("gpu-cluster").await?.status.unwrap_or_default();
                Ok(status
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "MigrationPaused" && c.status == "True")
                    .filter(|c| c.message.contains(&pod)))
            },
        )
        .await
        .with_context(|| operator.log_tail())?;
        anyhow::Ok(())
    }
    .await;
    kubelet_task.abort();
    let _ = pods.delete("held", &DeleteParams::default()).await;
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    eventually(Duration::from_secs(60), "the GPUCluster gone", || async {
        Ok(gcs.get_opt("gpu-cluster").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| operator.log_tail())?;
    delete_nodes(&client, &[STUCK]).await?;
    result
}

/// Device-plugin nodes that offer their GPUs as MIG devices or as renamed time-slicing replicas.
const OFFERING: [&str; 2] = ["offers-mig", "offers-shared"];

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn device_plugin_nodes_offering_mig_devices_or_shared_replicas_become_ready()
-> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    fresh_namespace(&client, NS).await?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    delete_nodes(&client, &OFFERING).await?;
    set_spec(
        &gcs,
        json!({"planePolicy": {"rules": [{"name": "offers", "mode": "device-plugin",
                "nodeSelector": {"matchLabels": {"e2e": "migration"}}}]}}),
    )
    .await?;
    let validator = validator(
        o::OPERATOR_VALIDATOR_DAEMONSET,
        l::DEPLOY_OPERATOR_VALIDATOR,
    );
    Api::<DaemonSet>::namespaced(client.clone(), NS)
        .patch(
            &validator.name_any(),
            &PatchParams::apply("e2e-migration").force(),
            &Patch::Apply(&validator),
        )
        .await?;
    let never = Arc::new(AtomicBool::new(false));
    let kubelet_task = tokio::spawn(kubelet(client.clone(), &OFFERING, never.clone(), never));
    let labeler = env.spawn(
        "node-labeler",
        "node-labeler-offers",
        &[
            ("HTTP_ENDPOINT", LABELER_METRICS),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler-offers"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "device-plugin"),
        ],
    )?;
    // One GPU each, as GPU feature discovery counts it: seven 1g.10gb MIG devices under the
    // `mixed` strategy (no nvidia.com/gpu at all), or two replicas of time-slicing renamed by
    // default to nvidia.com/gpu.shared.
    for (name, resource, count) in [
        (OFFERING[0], "nvidia.com/mig-1g.10gb", "7"),
        (OFFERING[1], "nvidia.com/gpu.shared", "2"),
    ] {
        let mut node = kwok_gpu_node(name, "migration", 0);
        node.labels_mut().insert(l::GPU_COUNT.into(), "1".into());
        let status = node.status.as_mut().expect("a status");
        for list in [&mut status.allocatable, &mut status.capacity] {
            list.get_or_insert_default().insert(
                resource.into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(count.into()),
            );
        }
        nodes.create(&PostParams::default(), &node).await?;
    }
    let result = all_settled_on(&nodes, &OFFERING, "device-plugin", &labeler).await;
    kubelet_task.abort();
    delete_nodes(&client, &OFFERING).await?;
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    result
}

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn nodes_move_one_at_a_time_and_a_failed_plane_is_rolled_back() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    fresh_namespace(&client, NS).await?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let events: Api<Event> = Api::all(client.clone());
    delete_nodes(&client, &NODES).await?;

    let policy = |mode: &str, deadline: u32| {
        json!({
            "planePolicy": {"rules": [{"name": "migration-nodes", "mode": mode,
                                       "nodeSelector": {"matchLabels": {"e2e": "migration"}}}]},
            "migration": {"maxUnavailable": 1, "progressDeadlineSeconds": deadline},
        })
    };
    set_spec(&gcs, policy("device-plugin", 15)).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    for ds in [
        validator(o::VALIDATOR_DAEMONSET, l::DEPLOY_DRA_VALIDATOR),
        validator(
            o::OPERATOR_VALIDATOR_DAEMONSET,
            l::DEPLOY_OPERATOR_VALIDATOR,
        ),
    ] {
        daemonsets
            .patch(
                &ds.name_any(),
                &PatchParams::apply("e2e-migration").force(),
                &Patch::Apply(&ds),
            )
            .await?;
    }
    let (broken_dra, broken_dp) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let kubelet_task = tokio::spawn(kubelet(
        client.clone(),
        &NODES,
        broken_dra.clone(),
        broken_dp.clone(),
    ));
    let labeler = env.spawn(
        "node-labeler",
        "node-labeler-migration",
        &[
            ("HTTP_ENDPOINT", LABELER_METRICS),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler-migration"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "device-plugin"),
        ],
    )?;
    fresh_namespace(&client, OPERATOR_NS).await?;
    let operator = env.spawn(
        "gpu-operator",
        "gpu-operator-migration",
        &[
            ("OPERATOR_NAMESPACE", OPERATOR_NS),
            ("HTTP_ENDPOINT", OPERATOR_METRICS),
            ("POD_NAME", "operator-migration"),
        ],
    )?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for name in NODES {
        nodes
            .create(&PostParams::default(), &kwok_gpu_node(name, "migration", 1))
            .await?;
        // The GPU a DRA plugin would publish there: the labeler sets the DRA readiness labels
        // only once the node's slices hold a device per GPU.
        let slice = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-gpu.nvidia.com")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"},
                                                               "uuid": {"string": format!("GPU-{name}")}}}]}}))?;
        let _ = slices
            .delete(&format!("{name}-gpu.nvidia.com"), &DeleteParams::default())
            .await;
        slices.create(&PostParams::default(), &slice).await?;
    }
    // Both nodes settle on the device-plugin plane; the readiness labels come with its validator.
    all_settled_on(&nodes, &NODES, "device-plugin", &labeler).await?;
    let (deployment, pdb) = workload();
    let pp = PatchParams::apply("e2e-migration").force();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .patch("gpu-app", &pp, &Patch::Apply(&pdb))
        .await?;
    Api::<Deployment>::namespaced(client.clone(), NS)
        .patch("gpu-app", &pp, &Patch::Apply(&deployment))
        .await?;
    eventually(
        Duration::from_secs(60),
        "2 gpu-app replicas running",
        || async {
            let running = pods
                .list(&ListParams::default().labels("app=gpu-app"))
                .await?
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            Ok((running == 2).then_some(()))
        },
    )
    .await?;

    // To DRA: one node at a time, the workload kept running by its PodDisruptionBudget.
    set_spec(&gcs, policy("dra", 15)).await?;
    let mut watch = Watch::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        sample(&nodes, &pods, &gcs, &mut watch).await?;
        let mut done = true;
        for name in NODES {
            done &= settled_on(&nodes, name, "dra").await?.is_some();
        }
        if done {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "both nodes on DRA within 120 s: {watch:?}\n{}",
            labeler.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(watch.violations.is_empty(), "{watch:?}");
    assert_eq!(watch.max_in_progress, 1, "one node at a time: {watch:?}");
    assert_eq!(
        watch.max_in_status, 1,
        "the GPUCluster status lists the node in progress: {watch:?}"
    );
    assert!(
        watch.min_running >= Some(1),
        "a replica ran throughout: {watch:?}"
    );
    for name in NODES {
        let seen = e2e::events_on(&events, name).await?;
        for reason in ["HandoverStarted", "PlaneSwitched", "HandoverComplete"] {
            assert!(has_event(&seen, reason, ""), "{reason} on {name}: {seen:?}");
        }
    }
    let evicted = e2e::metric(
        LABELER_METRICS,
        r#"node_labeler_evictions_total{result="evicted"}"#,
    )
    .await;
    assert!(
        evicted.as_ref().is_ok_and(|n| *n >= 2.0),
        "both replicas evicted once: {evicted:?}"
    );

    // Back to the device plugin, whose validator never passes: the first node goes back to DRA
    // after the deadline, and the other one does not start.
    broken_dp.store(true, Ordering::SeqCst);
    set_spec(&gcs, policy("device-plugin", 8)).await?;
    let (failed, rolled_back) = eventually(
        Duration::from_secs(90),
        "a node rolled back and settled on DRA",
        || async {
            for name in NODES {
                let node = nodes.get(name).await?;
                let record = node
                    .annotations()
                    .get(l::HANDOVER)
                    .and_then(|v| Handover::parse(v));
                if let Some(h) = record.filter(|h| h.phase == Phase::RolledBack)
                    && node.labels().get(l::GPU_STACK).map(String::as_str) == Some("dra")
                    && node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
                {
                    return Ok(Some((name, h)));
                }
            }
            Ok(None)
        },
    )
    .await
    .with_context(|| labeler.log_tail())?;
    assert_eq!(rolled_back.to, api::AllocationMode::Dra);
    let reason = rolled_back.rollback.map(|r| r.reason).unwrap_or_default();
    assert!(
        reason.contains("device-plugin plane was not ready within 8s"),
        "{reason}"
    );
    let seen = e2e::events_on(&events, failed).await?;
    assert!(
        has_event(&seen, "HandoverRolledBack", "going back to the dra plane"),
        "{seen:?}"
    );
    let other = NODES.into_iter().find(|n| *n != failed).expect("two nodes");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = nodes.get(other).await?;
    assert!(
        !waiting.annotations().contains_key(l::HANDOVER),
        "the rollout paused: {other} did not start"
    );
    assert_eq!(
        waiting
            .labels()
            .get(l::DEPLOY_DRA_DRIVER)
            .map(String::as_str),
        Some("true"),
        "{other} stayed on DRA"
    );
    eventually(
        Duration::from_secs(20),
        &format!("{other} queued behind the rollback"),
        || async {
            let seen = e2e::events_on(&events, other).await?;
            let text = format!("node {failed} was rolled back");
            Ok(has_event(&seen, "HandoverPaused", &text).then_some(()))
        },
    )
    .await?;

    // The GPUCluster says why the rollout stopped, naming the node.
    let paused = eventually(
        Duration::from_secs(30),
        "the MigrationPaused condition",
        || async {
            let status = gcs.get("gpu-cluster").await?.status.unwrap_or_default();
            let condition = status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "MigrationPaused" && c.status == "True");
            let listed = status
                .migration
                .is_some_and(|m| m.rolled_back.iter().any(|n| n.node == failed));
            Ok(condition.filter(|_| listed))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    assert_eq!(paused.reason, "ProgressDeadlineExceeded");
    assert!(
        paused.message.contains(&format!(
            "node {failed}: the device-plugin plane was not ready within 8s; it is on the dra \
             plane"
        )),
        "{}",
        paused.message
    );

    // The completion helper: a namespace's limit on device-plugin GPUs becomes the same limit on
    // gpu.nvidia.com devices, printed first, made with --apply.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), NS);
    quotas
        .patch(
            "gpus",
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpus", "namespace": NS},
                "spec": {"hard": {"requests.nvidia.com/gpu": "2", "pods": "10"}}})),
        )
        .await?;
    let migrate = |apply: bool| {
        let mut command = std::process::Command::new(env.bin_dir.join("gpu-operator"));
        command
            .args(["migrate", "quotas"])
            .env("KUBECONFIG", &env.kubeconfig);
        if apply {
            command.arg("--apply");
        }
        command.output()
    };
    let dry = migrate(false)?;
    let printed = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    // Every DeviceClass that hands out GPUs gets the limit: one left out would let its claims past.
    assert!(
        printed.contains(&format!("{NS}/gpus: requests.nvidia.com/gpu: 2 -> "))
            && printed.contains("gpu.nvidia.com.deviceclass.resource.k8s.io/devices")
            && printed.contains("mig.nvidia.com.deviceclass.resource.k8s.io/devices"),
        "{printed}"
    );
    let hard = |q: ResourceQuota| q.spec.and_then(|s| s.hard).unwrap_or_default();
    assert!(
        hard(quotas.get("gpus").await?).contains_key("requests.nvidia.com/gpu"),
        "printing changes nothing"
    );
    let applied = migrate(true)?;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let after = hard(quotas.get("gpus").await?);
    for class in ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"] {
        assert_eq!(
            after
                .get(&format!("{class}.deviceclass.resource.k8s.io/devices"))
                .map(|q| q.0.as_str()),
            Some("2"),
            "{class}: {after:?}"
        );
    }
    assert!(!after.contains_key("requests.nvidia.com/gpu"), "{after:?}");

    // Clean up while the operator runs: its finalizer holds the GPUCluster until it drains, and
    // the next test starts from no GPUCluster.
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    eventually(Duration::from_secs(60), "the GPUCluster gone", || async {
        Ok(gcs.get_opt("gpu-cluster").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| operator.log_tail())?;
    kubelet_task.abort();
    for name in NODES {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
        let _ = slices
            .delete(&format!("{name}-gpu.nvidia.com"), &DeleteParams::default())
            .await;
    }
    for ns in [NS, OPERATOR_NS] {
        let _ = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::default())
            .await;
    }
    Ok(())
}
