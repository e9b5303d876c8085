//! The whole DRA stack on the local cluster, as the install guide describes it: operator and
//! labeler running, one `gpu-kubelet-plugin` per fake GPU node (mock NVML, validated driver root),
//! the mini-kubelet doing the kubelet's DRA calls. Checks what a user would: `gpu-cluster` ready,
//! DeviceClasses and ResourceSlices, the guide's single-GPU pod allocated by the scheduler and
//! prepared by our plugin with a CDI spec on disk, CEL selection by product, a MIG claim, a plugin
//! killed and restarted under a prepared claim and killed in the middle of a prepare, and deletion
//! that leaves nothing behind. Every spec passes the runtimes' CDI library (`cdi-validate`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use api::GPUCluster;
use api::contract::objects as o;
use api::gpucluster::State;
use e2e::dra_node::DraNode;
use e2e::{Env, eventually, install_crd};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpu-operator";
const WORKLOADS: &str = "e2e-workloads";
const CDI_ANNOTATION: &str = "minikubelet.gpu-operator-rs.dev/cdi-devices";
/// (node, mock profile, GPUs): four different products, the last with MIG enabled.
const NODES: [(&str, &str, u32); 4] = [
    ("gpu-node-0", "h100-sxm5-80gb", 8),
    ("gpu-node-1", "a100-sxm4-80gb", 2),
    ("gpu-node-2", "l4", 4),
    ("gpu-node-3", "a100-sxm4-40gb-mig-mixed", 2),
];
/// The MIG node publishes only MIG devices, which the validator's and exporter's full-GPU claims
/// cannot use; an admin turns those operands off there, and the labeler honours that.
const MIG_NODE: &str = "gpu-node-3";

async fn apply(client: &kube::Client, ns: Option<&str>, value: Value) -> anyhow::Result<()> {
    let (group, version) = value["apiVersion"]
        .as_str()
        .unwrap()
        .rsplit_once('/')
        .unwrap_or(("", value["apiVersion"].as_str().unwrap()));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, value["kind"].as_str().unwrap());
    let ar = kube::api::ApiResource::from_gvk(&gvk);
    let api: Api<kube::api::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let name = value["metadata"]["name"].as_str().unwrap().to_owned();
    api.patch(
        &name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&value),
    )
    .await?;
    Ok(())
}

/// The guide's single-GPU template and pod, optionally with a CEL selector on the request.
fn workload(name: &str, selector: Option<&str>) -> (Value, Value) {
    let mut exactly =
        json!({"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}});
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"restartPolicy": "Never",
                 "tolerations": [{"operator": "Exists"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                 "containers": [{"name": "workload", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubi9",
                                 "command": ["nvidia-smi", "-L"], "resources": {"claims": [{"name": "gpu"}]}}]}});
    (template, pod)
}

/// Waits for the pod to run and returns (node, claim, CDI device IDs the kubelet got).
async fn running(
    pods: &Api<Pod>,
    claims: &Api<ResourceClaim>,
    name: &str,
) -> anyhow::Result<(String, ResourceClaim, Vec<String>)> {
    let pod = eventually(
        Duration::from_secs(90),
        &format!("pod {name} Running with CDI devices"),
        || async {
            let pod = pods.get(name).await?;
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let has_cdi = pod.annotations().contains_key(CDI_ANNOTATION);
            Ok((phase == "Running" && has_cdi).then_some(pod))
        },
    )
    .await?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let claim_name = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone())
        .context("pod has no generated claim")?;
    let claim = claims.get(&claim_name).await?;
    let cdi: BTreeMap<String, Vec<String>> =
        serde_json::from_str(&pod.annotations()[CDI_ANNOTATION])?;
    Ok((
        node,
        claim,
        cdi.get("workload").cloned().unwrap_or_default(),
    ))
}

/// Loads `node`'s CDI dir with the container runtimes' library; every one of `cdi_ids` must resolve.
fn runtime_accepts(
    env: &Env,
    nodes: &[DraNode],
    node: &str,
    cdi_ids: &[String],
) -> anyhow::Result<()> {
    let dra_node = nodes
        .iter()
        .find(|n| n.name == node)
        .with_context(|| format!("no plugin runs on {node}"))?;
    env.cdi_validate(&dra_node.cdi_root, cdi_ids)
}

fn allocated_devices(claim: &ResourceClaim) -> Vec<(String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.pool, r.device))
        .collect()
}

#[tokio::test]
async fn dra_stack_end_to_end() -> anyhow::Result<()> {
    let Some(env) = Env::from_env("dra_stack_end_to_end") else {
        return Ok(());
    };
    let client = env.client().await?;
    install_crd(&client).await?;
    for ns in [NS, WORKLOADS] {
        apply(
            &client,
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
    }
    // The chart ships the operands' ServiceAccounts; without it, the test makes them.
    for sa in [
        o::KUBELET_PLUGIN_SERVICE_ACCOUNT,
        o::COMPUTE_DOMAIN_CONTROLLER_SERVICE_ACCOUNT,
        o::VALIDATOR_SERVICE_ACCOUNT,
        o::DCGM_EXPORTER_SERVICE_ACCOUNT,
        o::DCGM_SERVICE_ACCOUNT,
    ] {
        apply(&client, Some(NS), json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": NS}})).await?;
    }
    let nodes_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes_api
        .patch(MIG_NODE, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {
            "nvidia.com/gpu.deploy.dra-validator": "false", "nvidia.com/gpu.deploy.dcgm-exporter-dra": "false"}}})))
        .await?;
    let _labeler = env.spawn(
        "node-labeler",
        "stack-node-labeler",
        &[
            ("HTTP_ENDPOINT", "127.0.0.1:18091"),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "dra"),
        ],
    )?;
    let operator = env.spawn(
        "gpu-operator",
        "stack-gpu-operator",
        &[
            ("HTTP_ENDPOINT", "127.0.0.1:18092"),
            ("OPERATOR_NAMESPACE", NS),
            ("POD_NAME", "operator"),
        ],
    )?;
    let mut nodes = Vec::new();
    for (node, profile, gpus) in NODES {
        nodes.push(DraNode::start(&env, node, profile, gpus)?);
    }

    // 1. The guide's "Validate Installation".
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    let created = Instant::now();
    apply(&client, None, json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"}, "spec": {}})).await?;
    let gc = eventually(
        Duration::from_secs(120),
        "kubectl get gpucluster to show ready",
        || async {
            let gc = gcs.get("gpu-cluster").await?;
            Ok((gc.status.as_ref().and_then(|s| s.state) == Some(State::Ready)).then_some(gc))
        },
    )
    .await
    .with_context(|| format!("operator log:\n{}", operator.log_tail()))?;
    eprintln!(
        "stack: gpu-cluster ready {:.1}s after it was created",
        created.elapsed().as_secs_f64()
    );
    let status = gc.status.unwrap();
    let counts = status.nodes.unwrap();
    assert_eq!(
        (counts.gpu, counts.dra, counts.ready_dra),
        (4, 4, 4),
        "node counts"
    );
    assert!(
        status.operands.iter().all(|o| o.ready),
        "{:?}",
        status.operands
    );
    let mut classes: Vec<String> = Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    classes.sort();
    assert_eq!(
        classes,
        [
            "compute-domain-daemon.nvidia.com",
            "compute-domain-default-channel.nvidia.com",
            "gpu.nvidia.com",
            "mig.nvidia.com",
            "vfio.gpu.nvidia.com"
        ]
    );
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for (node, _, gpus) in NODES {
        let devices: usize = slices
            .items
            .iter()
            .filter(|s| {
                s.spec.node_name.as_deref() == Some(node) && s.spec.driver == "gpu.nvidia.com"
            })
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        assert!(
            devices >= gpus as usize,
            "{node}: {devices} devices published, want at least {gpus}"
        );
    }

    // 2. The guide's single-GPU pod: allocated, prepared, CDI spec on disk; deleting it unprepares.
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), WORKLOADS);
    let (template, pod) = workload("gpu-workload", None);
    apply(&client, Some(WORKLOADS), template).await?;
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?;
    let (node, claim, cdi_ids) = running(&pods, &claims, "gpu-workload").await?;
    let uid = claim.uid().unwrap();
    let devices = allocated_devices(&claim);
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].0, node, "pool is the node");
    assert_eq!(
        cdi_ids,
        [format!("k8s.gpu.nvidia.com/claim={uid}-{}", devices[0].1)]
    );
    let dra_node = nodes.iter().find(|n| n.name == node).unwrap();
    let spec_file = dra_node
        .cdi_root
        .join(format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"));
    assert!(
        spec_file.exists(),
        "{} missing; have {:?}",
        spec_file.display(),
        dra_node.cdi_specs()
    );
    let spec_text = std::fs::read_to_string(&spec_file)?;
    assert!(
        spec_text.contains(&format!("{uid}-{}", devices[0].1)),
        "{spec_text}"
    );
    env.cdi_validate(&dra_node.cdi_root, &cdi_ids)?;

    // 5. The exporter's admin-access claim holds every GPU of the node, the workload's included.
    let operand_claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let exporter_has_it = operand_claims
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|c| {
            c.name_any().starts_with("nvidia-dcgm-exporter-dra")
                && allocated_devices(c).contains(&devices[0])
                && c.status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .and_then(|a| a.devices.as_ref())
                    .and_then(|d| d.results.as_ref())
                    .is_some_and(|r| r.iter().all(|r| r.admin_access == Some(true)))
        });
    assert!(
        exporter_has_it,
        "no admin-access exporter claim shares {:?}",
        devices[0]
    );

    // 6. Kill the plugin under the prepared claim: slices come back, the claim stays prepared.
    let idx = nodes.iter().position(|n| n.name == node).unwrap();
    nodes[idx].restart_plugin(&env)?;
    eventually(
        Duration::from_secs(60),
        "the restarted plugin's slices",
        || async {
            let list = Api::<ResourceSlice>::all(client.clone())
                .list(&ListParams::default())
                .await?;
            Ok(list
                .items
                .iter()
                .any(|s| s.spec.node_name.as_deref() == Some(node.as_str()))
                .then_some(()))
        },
    )
    .await?;
    assert!(spec_file.exists(), "CDI spec lost across a plugin restart");

    pods.delete("gpu-workload", &DeleteParams::default())
        .await?;
    eventually(
        Duration::from_secs(90),
        "the claim unprepared and its CDI spec removed",
        || async { Ok((!spec_file.exists()).then_some(())) },
    )
    .await
    .with_context(|| nodes[idx].plugin.log_tail())?;

    // 3. CEL selection on the product name lands on the L4 node.
    let (template, pod) = workload(
        "l4-workload",
        Some("device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('l4')"),
    );
    apply(&client, Some(WORKLOADS), template).await?;
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?;
    let (node, _, ids) = running(&pods, &claims, "l4-workload").await?;
    runtime_accepts(&env, &nodes, &node, &ids)?;
    assert_eq!(node, "gpu-node-2");
    pods.delete("l4-workload", &DeleteParams::default()).await?;

    // ... and on memory capacity: at least 70 GiB rules out the L4 (24 GB).
    let (template, pod) = workload(
        "big-memory-workload",
        Some("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('70Gi')) >= 0"),
    );
    apply(&client, Some(WORKLOADS), template).await?;
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?;
    let (node, _, ids) = running(&pods, &claims, "big-memory-workload").await?;
    runtime_accepts(&env, &nodes, &node, &ids)?;
    assert!(
        ["gpu-node-0", "gpu-node-1"].contains(&node.as_str()),
        "landed on {node}"
    );
    pods.delete("big-memory-workload", &DeleteParams::default())
        .await?;

    // 4. A MIG device through mig.nvidia.com, on the MIG node.
    let mig_template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-workload", "namespace": WORKLOADS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}});
    let (_, mut mig_pod) = workload("mig-workload", None);
    mig_pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!("mig-workload");
    apply(&client, Some(WORKLOADS), mig_template).await?;
    pods.create(&PostParams::default(), &serde_json::from_value(mig_pod)?)
        .await?;
    let (node, claim, cdi_ids) = running(&pods, &claims, "mig-workload").await?;
    assert_eq!(node, MIG_NODE);
    let device = &allocated_devices(&claim)[0].1;
    assert!(
        device.starts_with("gpu-") && device.contains("-mig-"),
        "{device}"
    );
    assert_eq!(cdi_ids.len(), 1);
    // The MIG device's spec carries its GPU- and compute-instance capability nodes.
    let mig_idx = nodes.iter().position(|n| n.name == node).unwrap();
    let mig_cdi_root = nodes[mig_idx].cdi_root.clone();
    let mig_spec = mig_cdi_root.join(format!(
        "k8s.gpu.nvidia.com-claim_{}.yaml",
        claim.uid().unwrap()
    ));
    let mig_spec_text = std::fs::read_to_string(&mig_spec)
        .with_context(|| format!("reading {}", mig_spec.display()))?;
    let caps = mig_spec_text.matches("/dev/nvidia-caps/nvidia-cap").count();
    assert!(
        caps >= 2 && mig_spec_text.contains("type: c"),
        "want GI and CI cap nodes in the MIG spec:\n{mig_spec_text}"
    );
    env.cdi_validate(&mig_cdi_root, &cdi_ids)?;

    // 8. The plugin SIGKILLed between PrepareStarted and PrepareCompleted of a second MIG claim:
    // at restart that claim is rolled back with no CDI file left, the completed one is kept, and
    // the kubelet's retry prepares the second claim.
    let mig_uid = claim.uid().unwrap();
    let saved_caps = nodes[mig_idx].stall_mig_caps()?;
    let (_, mut crash_pod) = workload("mig-crash", None);
    crash_pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!("mig-workload");
    pods.create(&PostParams::default(), &serde_json::from_value(crash_pod)?)
        .await?;
    let crash_uid = eventually(
        Duration::from_secs(60),
        "the second MIG claim checkpointed as PrepareStarted",
        || async {
            let list = claims.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .filter(|c| c.name_any().starts_with("mig-crash-"))
                .filter_map(ResourceExt::uid)
                .find(|uid| nodes[mig_idx].checkpointed(uid).as_deref() == Some("PrepareStarted")))
        },
    )
    .await
    .with_context(|| nodes[mig_idx].plugin.log_tail())?;
    nodes[mig_idx].plugin.kill();
    let crash_spec = mig_cdi_root.join(format!("k8s.gpu.nvidia.com-claim_{crash_uid}.yaml"));
    assert!(
        !crash_spec.exists(),
        "spec written while the prepare was held"
    );
    nodes[mig_idx].unstall_mig_caps(&saved_caps)?;
    nodes[mig_idx].restart_plugin(&env)?;
    let (_, crash_claim, crash_ids) = running(&pods, &claims, "mig-crash")
        .await
        .with_context(|| nodes[mig_idx].plugin.log_tail())?;
    assert_eq!(crash_claim.uid().as_deref(), Some(crash_uid.as_str()));
    let log = std::fs::read_to_string(&nodes[mig_idx].plugin.log_path)?;
    assert!(
        log.lines()
            .any(|l| l.contains("rolled back") && l.contains(&crash_uid)),
        "no rollback of {crash_uid} logged:\n{}",
        nodes[mig_idx].plugin.log_tail()
    );
    for uid in [&mig_uid, &crash_uid] {
        assert_eq!(
            nodes[mig_idx].checkpointed(uid).as_deref(),
            Some("PrepareCompleted"),
            "claim {uid}"
        );
    }
    let mut want_specs = vec![mig_spec.clone(), crash_spec.clone()];
    want_specs.sort();
    assert_eq!(
        nodes[mig_idx].cdi_specs(),
        want_specs,
        "CDI dir of {MIG_NODE}"
    );
    env.cdi_validate(&mig_cdi_root, &[cdi_ids.clone(), crash_ids].concat())?;
    pods.delete("mig-crash", &DeleteParams::default()).await?;
    pods.delete("mig-workload", &DeleteParams::default())
        .await?;
    eventually(
        Duration::from_secs(90),
        "both MIG claims unprepared",
        || async { Ok(nodes[mig_idx].cdi_specs().is_empty().then_some(())) },
    )
    .await
    .with_context(|| nodes[mig_idx].plugin.log_tail())?;

    // 7. Switching a node with a running GPU pod to device-plugin defers the plugin's label.
    let (template, pod) = workload(
        "switch-workload",
        Some("device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('h100')"),
    );
    apply(&client, Some(WORKLOADS), template).await?;
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?;
    let (node, _, ids) = running(&pods, &claims, "switch-workload").await?;
    runtime_accepts(&env, &nodes, &node, &ids)?;
    nodes_api
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
            "nvidia.com/gpu-operator.resource-allocation.mode": "device-plugin"}}})),
        )
        .await?;
    eventually(
        Duration::from_secs(30),
        "consumer labels gone, dra-driver kept",
        || async {
            let labels = nodes_api.get(&node).await?.labels().clone();
            anyhow::ensure!(
                labels
                    .get("nvidia.com/gpu.deploy.dra-driver")
                    .map(String::as_str)
                    == Some("true"),
                "dra-driver removed while a GPU pod runs"
            );
            Ok((!labels.contains_key("nvidia.com/gpu.deploy.dra-validator")).then_some(()))
        },
    )
    .await?;
    pods.delete("switch-workload", &DeleteParams::default())
        .await?;
    eventually(
        Duration::from_secs(75),
        "dra-driver removed after the pod left",
        || async {
            Ok((!nodes_api
                .get(&node)
                .await?
                .labels()
                .contains_key("nvidia.com/gpu.deploy.dra-driver"))
            .then_some(()))
        },
    )
    .await?;

    // Leave the nodes as we found them for the suite's other tests.
    nodes_api
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
            "nvidia.com/gpu-operator.resource-allocation.mode": "dra"}}})),
        )
        .await?;
    nodes_api
        .patch(MIG_NODE, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {
            "nvidia.com/gpu.deploy.dra-validator": null, "nvidia.com/gpu.deploy.dcgm-exporter-dra": null}}})))
        .await?;

    // 8. Deleting the GPUCluster drains consumers first and leaves no operand or pod behind.
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    eventually(
        Duration::from_secs(120),
        "the GPUCluster, its operands and their pods gone",
        || async {
            let operand_pods = Api::<Pod>::namespaced(client.clone(), NS)
                .list(&ListParams::default())
                .await?;
            let gone = gcs.get_opt("gpu-cluster").await?.is_none() && operand_pods.items.is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await
    .with_context(|| operator.log_tail())?;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(WORKLOADS, &DeleteParams::default())
        .await;
    Ok(())
}
