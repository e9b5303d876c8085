//! The operator on the local cluster: operands appear for an empty GPUCluster, status tells which
//! operand waits, spec edits add and prune operands, hand edits are undone, an idle operator
//! writes nothing, and deletion drains claim consumers before the plugin.

use std::path::Path;
use std::time::{Duration, Instant};

use api::GPUCluster;
use api::contract::{labels as l, objects as o};
use e2e::{Env, Process, eventually, install_crd, metric, set_spec, step};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "gpu-operator";
const METRICS: &str = "127.0.0.1:18082";
const LABELER_METRICS: &str = "127.0.0.1:18083";
const STANDBY_METRICS: &str = "127.0.0.1:18084";
const THIRD_METRICS: &str = "127.0.0.1:18085";

async fn names<K>(api: &Api<K>) -> anyhow::Result<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=gpu-operator"))
        .await?;
    let mut names: Vec<String> = list.items.iter().map(|o| o.name_any()).collect();
    names.sort();
    Ok(names)
}

fn start(env: &Env) -> anyhow::Result<(Process, Process)> {
    let operator = env.spawn(
        "gpu-operator",
        "gpu-operator",
        &[
            ("OPERATOR_NAMESPACE", NS),
            ("HTTP_ENDPOINT", METRICS),
            ("POD_NAME", "operator-e2e"),
        ],
    )?;
    let labeler = env.spawn(
        "node-labeler",
        "node-labeler-for-operator",
        &[
            ("HTTP_ENDPOINT", LABELER_METRICS),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler-e2e"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "dra"),
        ],
    )?;
    Ok((operator, labeler))
}

/// The cluster-side objects the scenario reads and writes.
struct Apis {
    client: kube::Client,
    namespaces: Api<Namespace>,
    gcs: Api<GPUCluster>,
    daemonsets: Api<DaemonSet>,
    deployments: Api<Deployment>,
    classes: Api<DeviceClass>,
    templates: Api<ResourceClaimTemplate>,
    services: Api<Service>,
}

impl Apis {
    fn new(client: &kube::Client) -> Self {
        Apis {
            client: client.clone(),
            namespaces: Api::all(client.clone()),
            gcs: Api::all(client.clone()),
            daemonsets: Api::namespaced(client.clone(), NS),
            deployments: Api::namespaced(client.clone(), NS),
            classes: Api::all(client.clone()),
            templates: Api::namespaced(client.clone(), NS),
            services: Api::namespaced(client.clone(), NS),
        }
    }
}

fn replica(env: &Env, log: &str, metrics: &str, pod: &str) -> anyhow::Result<Process> {
    env.spawn(
        "gpu-operator",
        log,
        &[
            ("OPERATOR_NAMESPACE", NS),
            ("HTTP_ENDPOINT", metrics),
            ("POD_NAME", pod),
        ],
    )
}

/// One scenario in named steps, each a behaviour a cluster admin would notice; a failure names
/// its step and shows the log of the replica that should have acted.
#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn operator_on_the_local_cluster() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    prepare_namespace(&client).await?;
    let (operator, _labeler) = start(&env)?;
    // A second replica: it must stay idle while the first holds the Lease.
    let standby = replica(
        &env,
        "gpu-operator-standby",
        STANDBY_METRICS,
        "operator-e2e-standby",
    )?;
    let apis = Apis::new(&client);
    let first = operator.log_path.clone();
    let second = standby.log_path.clone();
    let logs: &[&Path] = &[&first, &second];

    step(
        "an empty GPUCluster gets every default operand",
        logs,
        every_default_operand(&apis),
    )
    .await?;
    step(
        "status names the operands that wait",
        logs,
        status_names_waiting_operands(&apis),
    )
    .await?;
    step(
        "hand edits and deletions are undone",
        logs,
        hand_edits_undone(&apis),
    )
    .await?;
    step(
        "spec edits add and prune operands",
        logs,
        spec_edits_add_and_prune(&apis),
    )
    .await?;
    step(
        "status names a missing PriorityClass",
        logs,
        missing_priority_class(&apis),
    )
    .await?;
    step(
        "an idle operator writes nothing and keeps a webhook's fields",
        logs,
        idle_writes_nothing(&apis),
    )
    .await?;
    let (leader, standby) = step(
        "the replica without the Lease does nothing",
        logs,
        who_leads(&apis, operator, standby),
    )
    .await?;
    let rss = leader.rss_kib().unwrap_or_default();
    let stopping = step(
        "a standby takes over from a dead leader",
        logs,
        standby_takes_over(&apis, leader, standby),
    )
    .await?;
    let third = replica(
        &env,
        "gpu-operator-third",
        THIRD_METRICS,
        "operator-e2e-third",
    )?;
    let logs: &[&Path] = &[&stopping.log_path.clone(), &third.log_path.clone()];
    step(
        "a SIGTERMed leader releases the Lease",
        logs,
        sigterm_releases_the_lease(&apis, stopping),
    )
    .await?;
    step(
        "deletion drains claim consumers before the plugin",
        logs,
        deletion_drains_consumers_first(&apis),
    )
    .await?;
    eprintln!("operator: RSS of the first leader while idle: {rss} KiB");
    Ok(())
}

async fn prepare_namespace(client: &kube::Client) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            NS,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
            ),
        )
        .await?;
    // The chart ships the operands' ServiceAccounts; here the test makes them, or the DaemonSet
    // controller could not create the operands' pods (and the status would say so).
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    for sa in [
        o::KUBELET_PLUGIN_SERVICE_ACCOUNT,
        o::COMPUTE_DOMAIN_CONTROLLER_SERVICE_ACCOUNT,
        o::VALIDATOR_SERVICE_ACCOUNT,
        o::DCGM_EXPORTER_SERVICE_ACCOUNT,
        o::DCGM_SERVICE_ACCOUNT,
        o::OPERATOR_VALIDATOR_SERVICE_ACCOUNT,
    ] {
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                             "metadata": {"name": sa, "namespace": NS}});
        accounts
            .patch(
                sa,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(account),
            )
            .await?;
    }
    Ok(())
}

async fn every_default_operand(apis: &Apis) -> anyhow::Result<()> {
    let created = Instant::now();
    set_spec(&apis.gcs, json!({})).await?;
    let all_there = eventually(Duration::from_secs(60), "every default operand", || async {
        let ds = names(&apis.daemonsets).await?;
        let classes = names(&apis.classes).await?;
        Ok((ds.len() == 5 && classes.len() == 6).then_some((ds, classes)))
    })
    .await?;
    assert_eq!(
        all_there.0,
        [
            o::DCGM_EXPORTER_DAEMONSET,
            o::DEVICE_PLUGIN_DAEMONSET,
            o::KUBELET_PLUGIN_DAEMONSET,
            o::VALIDATOR_DAEMONSET,
            o::OPERATOR_VALIDATOR_DAEMONSET,
        ]
    );
    assert_eq!(
        names(&apis.deployments).await?,
        [o::COMPUTE_DOMAIN_CONTROLLER]
    );
    assert_eq!(
        names(&apis.templates).await?,
        [o::DCGM_EXPORTER_CLAIM_TEMPLATE, o::VALIDATOR_CLAIM_TEMPLATE]
    );
    assert_eq!(names(&apis.services).await?, [o::DCGM_EXPORTER_DAEMONSET]);
    assert_eq!(
        names(&Api::<ValidatingAdmissionPolicy>::all(apis.client.clone())).await?,
        [o::PHYSICALGPU_POLICY, o::RESOURCESLICE_POLICY]
    );
    assert_eq!(
        names(&Api::<ValidatingAdmissionPolicyBinding>::all(
            apis.client.clone()
        ))
        .await?,
        [o::PHYSICALGPU_POLICY, o::RESOURCESLICE_POLICY]
    );
    let ns = apis.namespaces.get(NS).await?;
    assert_eq!(
        ns.labels()
            .get(l::ADMIN_ACCESS_NAMESPACE)
            .map(String::as_str),
        Some("true")
    );
    eprintln!(
        "operator: every operand created {:.1}s after the GPUCluster",
        created.elapsed().as_secs_f64()
    );
    Ok(())
}

/// No plugin prepares claims here, so the claim consumers are held back: status must say so.
async fn status_names_waiting_operands(apis: &Apis) -> anyhow::Result<()> {
    let gc = eventually(
        Duration::from_secs(60),
        "status naming the operands that wait",
        || async {
            let gc = apis.gcs.get("gpu-cluster").await?;
            let status = gc.status.clone().unwrap_or_default();
            let validator = status
                .operands
                .iter()
                .find(|op| op.name == o::VALIDATOR_DAEMONSET);
            Ok(validator.filter(|v| v.desired > 0 && !v.ready).map(|_| gc))
        },
    )
    .await?;
    let status = gc.status.unwrap();
    assert_eq!(status.state, Some(api::gpucluster::State::NotReady));
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "OperandNotReady");
    assert!(
        ready.message.contains(o::VALIDATOR_DAEMONSET),
        "{}",
        ready.message
    );
    assert!(
        status.nodes.as_ref().is_some_and(|n| n.gpu > 0),
        "{:?}",
        status.nodes
    );
    Ok(())
}

/// Hand edits and deletions are undone.
async fn hand_edits_undone(apis: &Apis) -> anyhow::Result<()> {
    apis.daemonsets
        .delete(o::VALIDATOR_DAEMONSET, &DeleteParams::default())
        .await?;
    apis.classes
        .delete(o::DEVICE_CLASS_MIG, &DeleteParams::default())
        .await?;
    apis.deployments
        .patch(o::COMPUTE_DOMAIN_CONTROLLER, &PatchParams::default(),
               &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "compute-domain-controller", "image": "evil:latest"}]}}}})))
        .await?;
    eventually(
        Duration::from_secs(30),
        "deleted and edited operands restored",
        || async {
            let ds_back = apis
                .daemonsets
                .get_opt(o::VALIDATOR_DAEMONSET)
                .await?
                .is_some_and(|d| d.metadata.deletion_timestamp.is_none());
            let class_back = apis.classes.get_opt(o::DEVICE_CLASS_MIG).await?.is_some();
            let d = apis.deployments.get(o::COMPUTE_DOMAIN_CONTROLLER).await?;
            let image = d
                .spec
                .and_then(|s| s.template.spec)
                .map(|p| p.containers[0].image.clone().unwrap_or_default());
            Ok((ds_back && class_back && image.as_deref() != Some("evil:latest")).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Spec edits add and prune operands.
async fn spec_edits_add_and_prune(apis: &Apis) -> anyhow::Result<()> {
    set_spec(
        &apis.gcs,
        json!({"dcgmExporter": {"enabled": false}, "dcgm": {"enabled": true},
                          "devicePlugin": {"enabled": false},
                          "draDriver": {"computeDomains": {"enabled": false}}}),
    )
    .await?;
    eventually(
        Duration::from_secs(30),
        "exporter and device plugin pruned, DCGM added, ComputeDomains gone",
        || async {
            let ds = names(&apis.daemonsets).await?;
            let plugin = apis.daemonsets.get(o::KUBELET_PLUGIN_DAEMONSET).await?;
            let containers = plugin
                .spec
                .and_then(|s| s.template.spec)
                .map(|p| p.containers.len())
                .unwrap_or(0);
            let ok =
                ds == [
                    o::DCGM_DAEMONSET,
                    o::KUBELET_PLUGIN_DAEMONSET,
                    o::VALIDATOR_DAEMONSET,
                ] && names(&apis.deployments).await?.is_empty()
                    && names(&apis.classes).await?.len() == 4
                    && names(&apis.templates).await?
                        == [o::DCGM_CLAIM_TEMPLATE, o::VALIDATOR_CLAIM_TEMPLATE]
                    && names(&apis.services).await? == [o::DCGM_DAEMONSET]
                    && containers == 1;
            Ok(ok.then_some(()))
        },
    )
    .await?;
    set_spec(&apis.gcs, json!({})).await?;
    eventually(Duration::from_secs(30), "defaults back", || async {
        Ok(
            (names(&apis.daemonsets).await?.len() == 5 && names(&apis.classes).await?.len() == 6)
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}

/// A PriorityClass that does not exist: the DaemonSet controller cannot create the operands'
/// pods, and the status says why (its FailedCreate Events), not only how many pods are missing.
async fn missing_priority_class(apis: &Apis) -> anyhow::Result<()> {
    let ready_condition = || async {
        let gc = apis.gcs.get("gpu-cluster").await?;
        let status = gc.status.unwrap_or_default();
        Ok::<_, anyhow::Error>(status.conditions.into_iter().find(|c| c.type_ == "Ready"))
    };
    set_spec(
        &apis.gcs,
        json!({"daemonsets": {"priorityClassName": "e2e-missing-class"}}),
    )
    .await?;
    let blocked = eventually(
        Duration::from_secs(90),
        "Ready=False naming the missing PriorityClass",
        || async {
            Ok(ready_condition().await?.filter(|c| {
                c.reason == "PodCreationFailed"
                    && c.message
                        .contains("no PriorityClass with name e2e-missing-class")
            }))
        },
    )
    .await?;
    eprintln!("operator: {}", blocked.message);
    set_spec(&apis.gcs, json!({})).await?;
    eventually(
        Duration::from_secs(90),
        "the pod-creation failure gone once the spec is fixed",
        || async {
            Ok(ready_condition()
                .await?
                .filter(|c| c.reason != "PodCreationFailed")
                .map(|_| ()))
        },
    )
    .await?;
    Ok(())
}

/// Idle: no writes of any kind from either replica, even after a mutating webhook (played by
/// another field manager) added a sidecar and an env var to the plugin's pods: those fields are
/// not the operator's, so it leaves them.
async fn idle_writes_nothing(apis: &Apis) -> anyhow::Result<()> {
    let webhook = PatchParams {
        field_manager: Some("e2e-webhook".into()),
        ..PatchParams::default()
    };
    apis.daemonsets
        .patch(
            o::KUBELET_PLUGIN_DAEMONSET,
            &webhook,
            &Patch::Strategic(json!({"spec": {"template": {"spec": {
            "containers": [{"name": "gpus", "env": [{"name": "INJECTED_BY_WEBHOOK", "value": "1"}]},
                           {"name": "mesh-proxy", "image": "mesh-proxy:1"}]}}}})),
        )
        .await?;
    let both = |name: &'static str| async move {
        Ok::<f64, anyhow::Error>(
            metric(METRICS, name).await? + metric(STANDBY_METRICS, name).await?,
        )
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counters = [
        "gpu_operator_applies_total",
        "gpu_operator_deletes_total",
        "gpu_operator_status_writes_total",
    ];
    let mut before = Vec::new();
    for c in counters {
        before.push(both(c).await?);
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    for (c, b) in counters.iter().zip(&before) {
        assert_eq!(both(c).await?, *b, "{c} changed while idle");
    }
    let plugin = apis.daemonsets.get(o::KUBELET_PLUGIN_DAEMONSET).await?;
    let containers = plugin
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers)
        .unwrap_or_default();
    assert!(
        containers.iter().any(|c| c.name == "mesh-proxy")
            && containers.iter().any(|c| c
                .env
                .iter()
                .flatten()
                .any(|e| e.name == "INJECTED_BY_WEBHOOK")),
        "the webhook's sidecar or env var was removed"
    );
    Ok(())
}

/// Which replica leads: the one holding the Lease; the other has not reconciled once.
async fn who_leads(
    apis: &Apis,
    first: Process,
    second: Process,
) -> anyhow::Result<(Process, Process)> {
    let lease = Api::<Lease>::namespaced(apis.client.clone(), NS)
        .get("gpu-operator")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    let (leader, standby, standby_metrics) = match holder.as_str() {
        "operator-e2e" => (first, second, STANDBY_METRICS),
        "operator-e2e-standby" => (second, first, METRICS),
        other => anyhow::bail!("unexpected lease holder {other:?}"),
    };
    assert_eq!(
        metric(standby_metrics, "gpu_operator_reconciles_total").await?,
        0.0,
        "the replica without the Lease reconciled"
    );
    Ok((leader, standby))
}

/// When the leader dies the standby takes over and restores a deleted operand.
async fn standby_takes_over(
    apis: &Apis,
    mut leader: Process,
    standby: Process,
) -> anyhow::Result<Process> {
    leader.kill();
    apis.daemonsets
        .delete(o::VALIDATOR_DAEMONSET, &DeleteParams::default())
        .await?;
    let takeover = Instant::now();
    eventually(
        Duration::from_secs(60),
        "the standby to take over and restore the operand",
        || async {
            let restored = apis
                .daemonsets
                .get_opt(o::VALIDATOR_DAEMONSET)
                .await?
                .is_some_and(|d| d.metadata.deletion_timestamp.is_none());
            Ok(restored.then_some(()))
        },
    )
    .await?;
    eprintln!(
        "operator: standby took over and restored an operand {:.1}s after the leader died",
        takeover.elapsed().as_secs_f64()
    );
    Ok(standby)
}

/// A leader stopped the way the kubelet stops a pod (SIGTERM) releases the Lease, so a standby
/// (the third replica, started just before) takes over at once instead of waiting out the 15 s
/// lease.
async fn sigterm_releases_the_lease(apis: &Apis, mut stopping: Process) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holder = || async {
        let lease = Api::<Lease>::namespaced(apis.client.clone(), NS)
            .get("gpu-operator")
            .await?;
        Ok::<_, anyhow::Error>(lease.spec.and_then(|s| s.holder_identity))
    };
    anyhow::ensure!(
        holder().await?.as_deref() != Some("operator-e2e-third"),
        "the new replica took a live Lease"
    );
    stopping.terminate()?;
    let stopped = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the third replica to take the released Lease",
        || async { Ok((holder().await?.as_deref() == Some("operator-e2e-third")).then_some(())) },
    )
    .await?;
    let handover = stopped.elapsed();
    eprintln!(
        "operator: a SIGTERMed leader's Lease taken over {:.1}s later",
        handover.as_secs_f64()
    );
    assert!(
        handover < Duration::from_secs(10),
        "handover took {handover:?}: the Lease was not released"
    );
    assert!(
        stopping.log_tail().contains("released the leader lease"),
        "{}",
        stopping.log_tail()
    );
    Ok(())
}

/// Deletion: consumers first, then the finalizer goes and nothing is left.
async fn deletion_drains_consumers_first(apis: &Apis) -> anyhow::Result<()> {
    apis.gcs
        .delete("gpu-cluster", &DeleteParams::default())
        .await?;
    eventually(
        Duration::from_secs(60),
        "claim consumers gone while the plugin stays",
        || async {
            let ds = names(&apis.daemonsets).await?;
            let consumers_left = ds.iter().any(|n| n != o::KUBELET_PLUGIN_DAEMONSET);
            if consumers_left {
                anyhow::ensure!(
                    ds.iter().any(|n| n == o::KUBELET_PLUGIN_DAEMONSET),
                    "the plugin went before the claim consumers: {ds:?}"
                );
            }
            Ok((!consumers_left).then_some(()))
        },
    )
    .await?;
    eventually(
        Duration::from_secs(60),
        "no GPUCluster, operand or operand pod left",
        || async {
            let pods: Api<Pod> = Api::namespaced(apis.client.clone(), NS);
            let left = apis.gcs.get_opt("gpu-cluster").await?.is_some()
                || !names(&apis.daemonsets).await?.is_empty()
                || !names(&apis.deployments).await?.is_empty()
                || !names(&apis.classes).await?.is_empty()
                || !names(&apis.templates).await?.is_empty()
                || !pods.list(&ListParams::default()).await?.items.is_empty();
            Ok((!left).then_some(()))
        },
    )
    .await?;
    Ok(())
}
