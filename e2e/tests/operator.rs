//! The operator on the local cluster: operands appear for an empty GPUCluster, status tells which
//! operand waits, spec edits add and prune operands, hand edits are undone, an idle operator
//! writes nothing, and deletion drains claim consumers before the plugin.

use std::time::{Duration, Instant};

use anyhow::Context;
use api::GPUCluster;
use api::contract::{labels as l, objects as o};
use e2e::{Env, Process, eventually, install_crd, metric, set_spec};
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

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn operator_on_the_local_cluster() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
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
    let (operator, _labeler) = start(&env)?;
    // A second replica: it must stay idle while the first holds the Lease.
    let standby = env.spawn(
        "gpu-operator",
        "gpu-operator-standby",
        &[
            ("OPERATOR_NAMESPACE", NS),
            ("HTTP_ENDPOINT", STANDBY_METRICS),
            ("POD_NAME", "operator-e2e-standby"),
        ],
    )?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let services: Api<Service> = Api::namespaced(client.clone(), NS);

    let created = Instant::now();
    set_spec(&gcs, json!({})).await?;
    let all_there = eventually(Duration::from_secs(60), "every default operand", || async {
        let ds = names(&daemonsets).await?;
        let classes = names(&classes).await?;
        Ok((ds.len() == 5 && classes.len() == 5).then_some((ds, classes)))
    })
    .await
    .with_context(|| operator.log_tail())?;
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
    assert_eq!(names(&deployments).await?, [o::COMPUTE_DOMAIN_CONTROLLER]);
    assert_eq!(
        names(&templates).await?,
        [o::DCGM_EXPORTER_CLAIM_TEMPLATE, o::VALIDATOR_CLAIM_TEMPLATE]
    );
    assert_eq!(names(&services).await?, [o::DCGM_EXPORTER_DAEMONSET]);
    assert_eq!(
        names(&Api::<ValidatingAdmissionPolicy>::all(client.clone())).await?,
        [o::RESOURCESLICE_POLICY]
    );
    assert_eq!(
        names(&Api::<ValidatingAdmissionPolicyBinding>::all(
            client.clone()
        ))
        .await?,
        [o::RESOURCESLICE_POLICY]
    );
    let ns = namespaces.get(NS).await?;
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

    // No plugin prepares claims here, so the claim consumers are held back: status must say so.
    let gc = eventually(
        Duration::from_secs(60),
        "status naming the operands that wait",
        || async {
            let gc = gcs.get("gpu-cluster").await?;
            let status = gc.status.clone().unwrap_or_default();
            let validator = status
                .operands
                .iter()
                .find(|op| op.name == o::VALIDATOR_DAEMONSET);
            Ok(validator.filter(|v| v.desired > 0 && !v.ready).map(|_| gc))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
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

    // Hand edits and deletions are undone.
    daemonsets
        .delete(o::VALIDATOR_DAEMONSET, &DeleteParams::default())
        .await?;
    classes
        .delete(o::DEVICE_CLASS_MIG, &DeleteParams::default())
        .await?;
    deployments
        .patch(o::COMPUTE_DOMAIN_CONTROLLER, &PatchParams::default(),
               &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "compute-domain-controller", "image": "evil:latest"}]}}}})))
        .await?;
    eventually(
        Duration::from_secs(30),
        "deleted and edited operands restored",
        || async {
            let ds_back = daemonsets
                .get_opt(o::VALIDATOR_DAEMONSET)
                .await?
                .is_some_and(|d| d.metadata.deletion_timestamp.is_none());
            let class_back = classes.get_opt(o::DEVICE_CLASS_MIG).await?.is_some();
            let d = deployments.get(o::COMPUTE_DOMAIN_CONTROLLER).await?;
            let image = d
                .spec
                .and_then(|s| s.template.spec)
                .map(|p| p.containers[0].image.clone().unwrap_or_default());
            Ok((ds_back && class_back && image.as_deref() != Some("evil:latest")).then_some(()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;

    // Spec edits add and prune operands.
    set_spec(
        &gcs,
        json!({"dcgmExporter": {"enabled": false}, "dcgm": {"enabled": true},
                          "devicePlugin": {"enabled": false},
                          "draDriver": {"computeDomains": {"enabled": false}}}),
    )
    .await?;
    eventually(
        Duration::from_secs(30),
        "exporter and device plugin pruned, DCGM added, ComputeDomains gone",
        || async {
            let ds = names(&daemonsets).await?;
            let plugin = daemonsets.get(o::KUBELET_PLUGIN_DAEMONSET).await?;
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
                ] && names(&deployments).await?.is_empty()
                    && names(&classes).await?.len() == 3
                    && names(&templates).await?
                        == [o::DCGM_CLAIM_TEMPLATE, o::VALIDATOR_CLAIM_TEMPLATE]
                    && names(&services).await? == [o::DCGM_DAEMONSET]
                    && containers == 1;
            Ok(ok.then_some(()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    set_spec(&gcs, json!({})).await?;
    eventually(Duration::from_secs(30), "defaults back", || async {
        Ok(
            (names(&daemonsets).await?.len() == 5 && names(&classes).await?.len() == 5)
                .then_some(()),
        )
    })
    .await?;

    // A PriorityClass that does not exist: the DaemonSet controller cannot create the operands'
    // pods, and the status says why (its FailedCreate Events), not only how many pods are missing.
    let ready_condition = || async {
        let gc = gcs.get("gpu-cluster").await?;
        let status = gc.status.unwrap_or_default();
        Ok::<_, anyhow::Error>(status.conditions.into_iter().find(|c| c.type_ == "Ready"))
    };
    set_spec(
        &gcs,
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
    .await
    .with_context(|| operator.log_tail())?;
    eprintln!("operator: {}", blocked.message);
    set_spec(&gcs, json!({})).await?;
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
    .await
    .with_context(|| operator.log_tail())?;

    // Idle: no writes of any kind from either replica, even after a mutating webhook (played by
    // another field manager) added a sidecar and an env var to the plugin's pods: those fields are
    // not the operator's, so it leaves them.
    let webhook = PatchParams {
        field_manager: Some("e2e-webhook".into()),
        ..PatchParams::default()
    };
    daemonsets
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
    let plugin = daemonsets.get(o::KUBELET_PLUGIN_DAEMONSET).await?;
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

    // Leader election: whichever replica holds the Lease did all the work, the other none; when the
    // leader dies the other takes over.
    let lease = Api::<Lease>::namespaced(client.clone(), NS)
        .get("gpu-operator")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    let (mut leader, standby, standby_metrics) = match holder.as_str() {
        "operator-e2e" => (operator, standby, STANDBY_METRICS),
        "operator-e2e-standby" => (standby, operator, METRICS),
        other => anyhow::bail!("unexpected lease holder {other:?}"),
    };
    assert_eq!(
        metric(standby_metrics, "gpu_operator_reconciles_total").await?,
        0.0,
        "the replica without the Lease reconciled"
    );
    let rss = leader.rss_kib().unwrap_or_default();
    leader.kill();
    daemonsets
        .delete(o::VALIDATOR_DAEMONSET, &DeleteParams::default())
        .await?;
    let takeover = Instant::now();
    eventually(
        Duration::from_secs(60),
        "the standby to take over and restore the operand",
        || async {
            let restored = daemonsets
                .get_opt(o::VALIDATOR_DAEMONSET)
                .await?
                .is_some_and(|d| d.metadata.deletion_timestamp.is_none());
            Ok(restored.then_some(()))
        },
    )
    .await
    .with_context(|| standby.log_tail())?;
    eprintln!(
        "operator: standby took over and restored an operand {:.1}s after the leader died",
        takeover.elapsed().as_secs_f64()
    );

    // A leader stopped the way the kubelet stops a pod (SIGTERM) releases the Lease, so a standby
    // takes over at once instead of waiting out the 15 s lease.
    let mut stopping = standby;
    let operator = env.spawn(
        "gpu-operator",
        "gpu-operator-third",
        &[
            ("OPERATOR_NAMESPACE", NS),
            ("HTTP_ENDPOINT", THIRD_METRICS),
            ("POD_NAME", "operator-e2e-third"),
        ],
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holder = || async {
        let lease = Api::<Lease>::namespaced(client.clone(), NS)
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
    .await
    .with_context(|| operator.log_tail())?;
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

    // Deletion: consumers first, then the finalizer goes and nothing is left.
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    eventually(
        Duration::from_secs(60),
        "claim consumers gone while the plugin stays",
        || async {
            let ds = names(&daemonsets).await?;
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
    .await
    .with_context(|| operator.log_tail())?;
    eventually(
        Duration::from_secs(60),
        "no GPUCluster, operand or operand pod left",
        || async {
            let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
            let left = gcs.get_opt("gpu-cluster").await?.is_some()
                || !names(&daemonsets).await?.is_empty()
                || !names(&deployments).await?.is_empty()
                || !names(&classes).await?.is_empty()
                || !names(&templates).await?.is_empty()
                || !pods.list(&ListParams::default()).await?.items.is_empty();
            Ok((!left).then_some(()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    eprintln!("operator: RSS of the first leader while idle: {rss} KiB");
    Ok(())
}
