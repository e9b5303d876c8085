//! GPU classes on the local cluster: the apiserver refuses bad classes naming the field; a class
//! derives a DeviceClass and an extended resource per variant and reports what each matches;
//! `kubectl get gpuclass` shows the names; a Deployment moved from `nvidia.com/gpu: 1` to the
//! class's resource gets a claim made by the scheduler and runs, and so does a pod asking a MIG
//! variant; every card shows as a Ready PhysicalGPU naming the claims that use it; an idle class
//! and idle PhysicalGPUs are not written; a class being deleted keeps its DeviceClasses while
//! claims use them; two pods asking a shared variant share one GPU, which no whole-card pod gets
//! while its shares are out.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use api::GPUClass;
use api::gpuclass::CLASS_LABEL;
use api::physicalgpu::{NODE_LABEL, PhysicalGPU};
use e2e::dra_node::DraNode;
use e2e::{Env, Process, eventually, fresh_namespace, install_product_crds, step};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "e2e-gpu-classes";
const OPERATOR_NS: &str = "gpu-operator";
const METRICS: &str = "127.0.0.1:18088";
/// Whole A100s here, A100s in MIG mode (3g.20gb, 2g.10gb, 1g.5gb each) there.
const WHOLE_NODE: &str = "gpu-node-2";
const MIG_NODE: &str = "gpu-node-3";

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn gpu_classes_on_the_local_cluster() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_product_crds(&client).await?;
    let classes: Api<GPUClass> = Api::all(client.clone());
    remove_classes(&classes).await?;
    fresh_namespace(&client, NS).await?;
    fresh_namespace(&client, OPERATOR_NS).await?;

    step(
        "the apiserver refuses bad classes, naming the field",
        &[],
        bad_classes_are_refused(&classes),
    )
    .await?;

    let mut nodes = [
        DraNode::start(&env, WHOLE_NODE, "a100-sxm4-40gb", 2)?,
        DraNode::start(&env, MIG_NODE, "a100-sxm4-40gb-mig-mixed", 1)?,
    ];
    let operator = env.spawn(
        "gpu-operator",
        "gpu-operator-classes",
        &[
            ("OPERATOR_NAMESPACE", OPERATOR_NS),
            ("HTTP_ENDPOINT", METRICS),
            ("POD_NAME", "operator-classes-e2e"),
            ("LEADER_ELECT", "false"),
        ],
    )?;
    let logs = [
        operator.log_path.as_path(),
        nodes[0].plugin.log_path.as_path(),
        nodes[1].plugin.log_path.as_path(),
    ];
    let mut result = scenario(&env, &client, &classes, &operator, &logs).await;
    if result.is_ok() {
        let log = nodes[1].plugin.log_path.clone();
        result = step(
            "a stopped plugin leaves its node's PhysicalGPUs NotServed, not Ready",
            &[log.as_path()],
            stopped_plugin_unserves_its_gpus(client.clone(), &mut nodes[1]),
        )
        .await;
    }
    cleanup(&client, &classes, nodes).await;
    result
}

/// The plugin stops as the kubelet stops a pod (SIGTERM): before it exits, every PhysicalGPU of
/// its node says nothing serves it, so `kubectl get physicalgpu` never shows a card Ready that no
/// plugin offers.
async fn stopped_plugin_unserves_its_gpus(
    client: kube::Client,
    node: &mut DraNode,
) -> anyhow::Result<()> {
    node.plugin.terminate()?;
    let gpus: Api<PhysicalGPU> = Api::all(client);
    let on_node = ListParams::default().labels(&format!("{NODE_LABEL}={}", node.name));
    // The plugin wrote them on its way out: no wait beyond reading them.
    let listed = gpus.list(&on_node).await?.items;
    let rows: Vec<(String, String)> = listed
        .iter()
        .map(|gpu| {
            let status = gpu.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| format!("{}/{}", c.status, c.reason))
                .unwrap_or_default();
            (status.phase, ready)
        })
        .collect();
    ensure!(
        !rows.is_empty()
            && rows
                .iter()
                .all(|(phase, ready)| phase == "NotReady" && ready == "False/NotServed"),
        "PhysicalGPUs of {} after its plugin stopped (phase, Ready): {rows:?}",
        node.name
    );
    Ok(())
}

async fn scenario(
    env: &Env,
    client: &kube::Client,
    classes: &Api<GPUClass>,
    operator: &Process,
    logs: &[&std::path::Path],
) -> anyhow::Result<()> {
    step(
        "a class derives a DeviceClass and an extended resource per variant and counts matches",
        logs,
        class_reports_its_variants(client, classes),
    )
    .await?;
    step(
        "kubectl get gpuclass shows the extended resources",
        &[],
        kubectl_shows_the_resources(env),
    )
    .await?;
    step(
        "kubectl get physicalgpu -o wide lists every card of both nodes, Ready",
        logs,
        physical_gpus_listed(env, client),
    )
    .await?;
    step(
        "a Deployment moved from nvidia.com/gpu to the class's resource runs on a matching card",
        logs,
        moved_deployment_runs(client),
    )
    .await?;
    step(
        "a pod asking the MIG variant gets a 1g.5gb MIG device",
        logs,
        mig_variant_pod_runs(client),
    )
    .await?;
    step(
        "an idle class and idle PhysicalGPUs are not written",
        &[operator.log_path.as_path()],
        idle_class_is_not_written(client, classes),
    )
    .await?;
    step(
        "a deleted class keeps its DeviceClasses while claims use them",
        &[operator.log_path.as_path()],
        deletion_waits_for_claims(client, classes),
    )
    .await?;
    step(
        "two pods asking a shared variant share one GPU; a whole-card pod gets the other, never that one, even once the variant is removed while the shares are held",
        logs,
        shared_variant_shares_a_gpu(client, classes),
    )
    .await?;
    step(
        "a class naming another class's extended resource is refused, naming that class",
        &[operator.log_path.as_path()],
        taken_resource_is_refused(client, classes),
    )
    .await
}

fn a100_class() -> serde_json::Value {
    json!({
        "apiVersion": "gpu-operator-rs.dev/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "a100"},
        "spec": {
            "selector": {"matchLabels": {"gpu-operator-rs.dev/device": "a100-sxm4-40gb"}},
            "variants": {"whole": {}, "mig": {"profiles": ["1g.5gb", "3g.20gb"]}},
        },
    })
}

async fn bad_classes_are_refused(classes: &Api<GPUClass>) -> anyhow::Result<()> {
    let cases = [
        (
            json!({"selector": {}}),
            "spec.selector",
            "the selector is empty",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"}, "variants": {"mig": {"profiles": ["9g.1tb"]}}}),
            "spec.variants.mig.profiles",
            "not a MIG profile",
        ),
        (
            json!({"selector": {"matchLabels": {"vendor": "nvidia"}}}),
            "spec.selector.matchLabels",
            "only gpu-operator-rs.dev/device and gpu-operator-rs.dev/architecture select GPUs",
        ),
        (
            json!({"selector": {"minMemory": "lots"}}),
            "spec.selector.minMemory",
            "must be a positive quantity",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"}, "variants": {}}),
            "spec.variants",
            "no variant",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"},
                   "variants": {"whole": {"extendedResourceName": "nvidia.com/gpu"}}}),
            "spec.variants.whole.extendedResourceName",
            "nvidia.com/ and kubernetes.io/ names are taken",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"}, "variants": {"shared": {"memory": "48Gi"}}}),
            "spec.variants.shared.memory",
            "a share of 48Gi is larger than the card",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"}, "variants": {"shared": {"shares": 1}}}),
            "spec.variants.shared.shares",
            "a share as large as the card or larger",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"},
                   "variants": {"shared": {"shares": 4, "memory": "10Gi"}}}),
            "spec.variants.shared",
            "give shares (pods per card",
        ),
        (
            json!({"selector": {"minMemory": "40Gi"},
                   "variants": {"shared": {"shares": 4, "strategy": "Spatial"}}}),
            "spec.variants.shared.strategy",
            "Unsupported value",
        ),
    ];
    // Untyped, so values the Rust types cannot hold (an unknown strategy) reach the apiserver.
    let resource = ApiResource::erase::<GPUClass>(&());
    let untyped: Api<DynamicObject> = Api::all_with(classes.clone().into_client(), &resource);
    for (spec, field, words) in cases {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gpu-operator-rs.dev/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": "bad"}, "spec": spec,
        }))?;
        let err = untyped
            .create(&PostParams::default(), &object)
            .await
            .err()
            .with_context(|| format!("the apiserver took a class with {field} bad"))?;
        let message = err.to_string();
        ensure!(
            message.contains(field) && message.contains(words),
            "refusal of a bad {field} should name it and say {words:?}: {message}"
        );
    }
    let long: GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu-operator-rs.dev/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": "a-name-too-long-to-become-part-of-device-class-names"},
        "spec": {"selector": {"minMemory": "40Gi"}},
    }))?;
    let err = classes
        .create(&PostParams::default(), &long)
        .await
        .err()
        .context("the apiserver took a class name of 51 characters")?;
    ensure!(err.to_string().contains("at most 40 characters"), "{err}");
    Ok(())
}

async fn class_reports_its_variants(
    client: &kube::Client,
    classes: &Api<GPUClass>,
) -> anyhow::Result<()> {
    classes
        .patch(
            "a100",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(a100_class()),
        )
        .await?;
    let want = [("whole", 2, 1), ("mig-1g.5gb", 1, 1), ("mig-3g.20gb", 1, 1)];
    let status = eventually(
        Duration::from_secs(60),
        "GPUClass a100 to count 2 whole A100s and one 1g.5gb and one 3g.20gb partition",
        || async {
            let class = classes.get("a100").await?;
            let Some(status) = class.status else {
                return Ok(None);
            };
            let rows: Vec<(&str, i64, i64)> = status
                .variants
                .iter()
                .map(|v| (v.name.as_str(), v.devices, v.nodes))
                .collect();
            Ok((rows == want).then_some(status.clone()))
        },
    )
    .await?;
    ensure!(
        status.extended_resource_names
            == [
                "gpu-operator-rs.dev/a100",
                "gpu-operator-rs.dev/a100-mig-1g.5gb",
                "gpu-operator-rs.dev/a100-mig-3g.20gb"
            ],
        "{status:?}"
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .context("no Ready condition")?;
    ensure!(ready.status == "True", "{ready:?}");
    let derived: BTreeMap<String, Option<String>> = Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{CLASS_LABEL}=a100")))
        .await?
        .items
        .into_iter()
        .map(|c| (c.name_any(), c.spec.extended_resource_name))
        .collect();
    let mut named = status.device_class_names.clone();
    named.sort();
    ensure!(
        derived.keys().cloned().collect::<Vec<_>>() == named,
        "DeviceClasses {derived:?} are not the status's {named:?}"
    );
    Ok(())
}

async fn kubectl_shows_the_resources(env: &Env) -> anyhow::Result<()> {
    let out = Command::new(env.tools_dir.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .args(["get", "gpuclass", "a100"])
        .output()
        .context("running kubectl")?;
    let table = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success()
            && table.contains("RESOURCES")
            && table.contains("gpu-operator-rs.dev/a100-mig-1g.5gb"),
        "kubectl get gpuclass a100 printed:\n{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{table}");
    Ok(())
}

/// The pod's extended-resource claim, once the pod runs.
async fn running_with_claim(client: &kube::Client, pod: &Pod) -> anyhow::Result<ResourceClaim> {
    let name = pod.name_any();
    let status = pod.status.as_ref().context("no status")?;
    ensure!(
        status.phase.as_deref() == Some("Running"),
        "pod {name} is {:?}",
        status.phase
    );
    let claim = status
        .extended_resource_claim_status
        .as_ref()
        .map(|s| s.resource_claim_name.clone())
        .with_context(|| format!("pod {name} runs without an extended-resource claim"))?;
    Ok(Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(&claim)
        .await?)
}

/// The one allocated device of `claim`: (pool, device).
fn allocated(claim: &ResourceClaim) -> anyhow::Result<(String, String)> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default();
    ensure!(
        results.len() == 1,
        "claim {} has {results:?}",
        claim.name_any()
    );
    Ok((results[0].pool.clone(), results[0].device.clone()))
}

async fn moved_deployment_runs(client: &kube::Client) -> anyhow::Result<()> {
    // The guide's "after": the class's resource instead of nvidia.com/gpu, no node binding and
    // no ResourceClaim in the manifest.
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "moved", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "moved"}},
            "template": {
                "metadata": {"labels": {"app": "moved"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "cuda", "image": "busybox",
                        "resources": {"limits": {"gpu-operator-rs.dev/a100": "1"}},
                    }],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &deployment)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claim = eventually(
        Duration::from_secs(90),
        "the moved Deployment's pod to run with a claim the scheduler made",
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=moved"))
                .await?;
            let Some(pod) = list.items.first() else {
                return Ok(None);
            };
            Ok(running_with_claim(client, pod).await.ok())
        },
    )
    .await?;
    let (pool, device) = allocated(&claim)?;
    ensure!(
        pool == WHOLE_NODE && device.starts_with("gpu-") && !device.contains("mig"),
        "the moved pod got {pool}/{device}, not a whole A100 of {WHOLE_NODE}"
    );
    let consumer = format!("{NS}/{}", claim.name_any());
    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    eventually(
        Duration::from_secs(30),
        &format!("a PhysicalGPU of {WHOLE_NODE} to name {consumer} as its user"),
        || async {
            let used = gpus
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|g| {
                    g.status
                        .as_ref()
                        .is_some_and(|s| s.node == WHOLE_NODE && s.consumers.contains(&consumer))
                });
            Ok(used.then_some(()))
        },
    )
    .await?;
    let class = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref());
    let class = class
        .and_then(|r| r.first())
        .and_then(|r| r.exactly.as_ref())
        .map(|e| e.device_class_name.clone());
    ensure!(
        class.as_deref() == Some("a100.gpu-operator-rs.dev"),
        "the claim asks {class:?}"
    );
    Ok(())
}

async fn mig_variant_pod_runs(client: &kube::Client) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "small", "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda", "image": "busybox",
                "resources": {"limits": {"gpu-operator-rs.dev/a100-mig-1g.5gb": "1"}},
            }],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod).await?;
    let claim = eventually(
        Duration::from_secs(90),
        "the pod asking a100-mig-1g.5gb to run with a claim",
        || async {
            Ok(running_with_claim(client, &pods.get("small").await?)
                .await
                .ok())
        },
    )
    .await?;
    let (pool, device) = allocated(&claim)?;
    ensure!(
        pool == MIG_NODE && device.contains("mig-1g5gb"),
        "the MIG pod got {pool}/{device}, not a 1g.5gb partition of {MIG_NODE}"
    );
    Ok(())
}

async fn idle_class_is_not_written(
    client: &kube::Client,
    classes: &Api<GPUClass>,
) -> anyhow::Result<()> {
    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    let versions = || async {
        let mut all = vec![classes.get("a100").await?.resource_version()];
        for gpu in gpus.list(&ListParams::default()).await?.items {
            all.push(gpu.resource_version());
        }
        anyhow::Ok(all)
    };
    // The PhysicalGPUs settle first: the pods started above changed who uses them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = versions().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = versions().await?;
    ensure!(
        before == after,
        "GPUClass a100 or a PhysicalGPU was written while nothing changed: {before:?} -> {after:?}"
    );
    Ok(())
}

async fn physical_gpus_listed(env: &Env, client: &kube::Client) -> anyhow::Result<()> {
    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    let listed = eventually(
        Duration::from_secs(60),
        "3 PhysicalGPUs (2 on the whole-card node, 1 on the MIG node), all Ready",
        || async {
            let mut rows: Vec<(String, String, String, String)> = Vec::new();
            for node in [WHOLE_NODE, MIG_NODE] {
                let on_node = ListParams::default().labels(&format!("{NODE_LABEL}={node}"));
                for gpu in gpus.list(&on_node).await?.items {
                    let s = gpu.status.clone().unwrap_or_default();
                    rows.push((s.node, s.plane, s.mig_mode, s.phase));
                }
            }
            rows.sort();
            let want = [
                (WHOLE_NODE, "dra", "Disabled", "Ready"),
                (WHOLE_NODE, "dra", "Disabled", "Ready"),
                (MIG_NODE, "dra", "Enabled", "Ready"),
            ]
            .map(|(a, b, c, d)| (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned()));
            Ok((rows == want).then_some(rows))
        },
    )
    .await?;
    let out = Command::new(env.tools_dir.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .args(["get", "physicalgpu", "-o", "wide", "-l"])
        .arg(format!("{NODE_LABEL} in ({WHOLE_NODE},{MIG_NODE})"))
        .output()
        .context("running kubectl")?;
    let table = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success()
            && table.contains("NVIDIA A100-SXM4-40GB")
            && table.contains("UUID")
            && table.lines().filter(|l| l.contains(" Ready ")).count() == listed.len(),
        "kubectl get physicalgpu -o wide printed:\n{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{table}");
    Ok(())
}

async fn deletion_waits_for_claims(
    client: &kube::Client,
    classes: &Api<GPUClass>,
) -> anyhow::Result<()> {
    let device_classes: Api<DeviceClass> = Api::all(client.clone());
    let derived = ListParams::default().labels(&format!("{CLASS_LABEL}=a100"));
    classes.delete("a100", &DeleteParams::default()).await?;
    eventually(
        Duration::from_secs(30),
        "GPUClass a100 to say which claims keep its DeviceClasses",
        || async {
            let class = classes.get("a100").await?;
            let blocked = class
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.type_ == "Ready" && c.reason == "InUse" && c.message.contains(NS));
            Ok(blocked.then_some(()))
        },
    )
    .await?;
    let kept = device_classes.list(&derived).await?.items.len();
    ensure!(
        kept == 3,
        "{kept} of the 3 DeviceClasses are left while claims use them"
    );
    Api::<Deployment>::namespaced(client.clone(), NS)
        .delete("moved", &DeleteParams::foreground())
        .await?;
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    eventually(
        Duration::from_secs(90),
        "GPUClass a100 and its DeviceClasses to go once its claims did",
        || async {
            let gone = classes.get_opt("a100").await?.is_none()
                && device_classes.list(&derived).await?.items.is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await
}

/// A pod asking one of `resource`.
fn asking(name: &str, resource: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda", "image": "busybox",
                "resources": {"limits": {resource: "1"}},
            }],
        },
    }))?)
}

/// The one allocated result of a running pod's claim: (device, share id).
async fn running_on(
    client: &kube::Client,
    pods: &Api<Pod>,
    name: &str,
) -> anyhow::Result<(String, Option<String>)> {
    let what = format!("pod {name} to run with a claim the scheduler made");
    let claim = eventually(Duration::from_secs(90), &what, || async {
        Ok(running_with_claim(client, &pods.get(name).await?)
            .await
            .ok())
    })
    .await?;
    let (pool, device) = allocated(&claim)?;
    ensure!(
        pool == WHOLE_NODE,
        "pod {name} got {pool}/{device}, not a card of {WHOLE_NODE}"
    );
    let share = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .and_then(|r| r.into_iter().next())
        .and_then(|r| r.share_id);
    Ok((device, share))
}

/// Whether pod `name` is still unscheduled after a while, the scheduler saying why.
async fn stays_pending(pods: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    let why = eventually(
        Duration::from_secs(30),
        &format!("the scheduler to turn pod {name} down"),
        || async {
            let pod = pods.get(name).await?;
            let condition = pod
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .and_then(|c| c.message.clone());
            Ok(condition)
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = pods.get(name).await?;
    let node = pod.spec.and_then(|s| s.node_name);
    ensure!(node.is_none(), "pod {name} was placed on {node:?}");
    Ok(why)
}

/// GPUClass `team`: the A100s, in `variants`.
fn team_class(variants: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "gpu-operator-rs.dev/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "team"},
        "spec": {
            "selector": {"matchLabels": {"gpu-operator-rs.dev/device": "a100-sxm4-40gb"}},
            "variants": variants,
        },
    })
}

async fn shared_variant_shares_a_gpu(
    client: &kube::Client,
    classes: &Api<GPUClass>,
) -> anyhow::Result<()> {
    let class = team_class(json!({"whole": {}, "shared": {"shares": 2}}));
    classes
        .patch(
            "team",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(class),
        )
        .await?;
    let want = [("whole", 2, 1), ("shared", 2, 1)];
    eventually(
        Duration::from_secs(60),
        "GPUClass team to count 2 whole A100s and the 2 A100s published in shares",
        || async {
            let status = classes.get("team").await?.status.unwrap_or_default();
            let rows: Vec<(&str, i64, i64)> = status
                .variants
                .iter()
                .map(|v| (v.name.as_str(), v.devices, v.nodes))
                .collect();
            Ok((rows == want).then_some(()))
        },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let shared = "gpu-operator-rs.dev/team-shared";
    let whole = "gpu-operator-rs.dev/team";
    for name in ["share-1", "share-2"] {
        pods.create(&PostParams::default(), &asking(name, shared)?)
            .await?;
    }
    let (first, first_share) = running_on(client, &pods, "share-1").await?;
    let (second, second_share) = running_on(client, &pods, "share-2").await?;
    ensure!(
        first == second && first.contains("-shared-team"),
        "the two shared pods got {first} and {second}, not one GPU's shares"
    );
    ensure!(
        first_share.is_some() && first_share != second_share,
        "the shares' ids are {first_share:?} and {second_share:?}"
    );
    let shared_gpu = first
        .split("-shared-")
        .next()
        .unwrap_or_default()
        .to_owned();
    pods.create(&PostParams::default(), &asking("whole-1", whole)?)
        .await?;
    let (card, _) = running_on(client, &pods, "whole-1").await?;
    ensure!(
        card != shared_gpu && !card.contains("shared"),
        "the whole-card pod got {card}, the GPU whose shares are out is {shared_gpu}"
    );
    // Both cards are taken now: one in shares (both out), one whole.
    pods.create(&PostParams::default(), &asking("whole-2", whole)?)
        .await?;
    let why = stays_pending(&pods, "whole-2").await?;
    eprintln!("whole-2 stays pending: {why}");
    pods.create(&PostParams::default(), &asking("share-3", shared)?)
        .await?;
    let why = stays_pending(&pods, "share-3").await?;
    eprintln!("share-3 stays pending: {why}");
    // The shared card's PhysicalGPU names both sharing claims.
    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    eventually(
        Duration::from_secs(30),
        "the shared card's PhysicalGPU to name both sharing claims",
        || async {
            let both = gpus
                .list(&ListParams::default().labels(&format!("{NODE_LABEL}={WHOLE_NODE}")))
                .await?
                .items
                .iter()
                .any(|g| g.status.as_ref().is_some_and(|s| s.consumers.len() == 2));
            Ok(both.then_some(()))
        },
    )
    .await?;
    // The class narrowed while the shares are in use: the shares held stay published, their
    // counters with them, so the scheduler still cannot give the card whole.
    let narrowed = team_class(json!({"whole": {}}));
    classes
        .patch(
            "team",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(narrowed),
        )
        .await?;
    eventually(
        Duration::from_secs(30),
        "GPUClass team to list its whole variant only",
        || async {
            let status = classes.get("team").await?.status.unwrap_or_default();
            let names: Vec<String> = status.variants.into_iter().map(|v| v.name).collect();
            Ok((names == ["whole"]).then_some(()))
        },
    )
    .await?;
    // The plugin has seen the change by now (it republishes within a second of one).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let published: Vec<String> = slices
        .list(&ListParams::default().fields(&format!("spec.nodeName={WHOLE_NODE}")))
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| d.name)
        .collect();
    ensure!(
        published.contains(&first),
        "{first}, held by share-1 and share-2, left the slices when its variant went: {published:?}"
    );
    let waiting = pods.get("whole-2").await?;
    ensure!(
        waiting.spec.and_then(|s| s.node_name).is_none(),
        "whole-2 was given a card while the shares of {shared_gpu} are held"
    );
    // Once the shares are given back (their pods and claims gone), the card goes whole again.
    // The waiting pods go first: one the scheduler is binding when deleted can leave its
    // allocation in the scheduler's memory (seen with kube-scheduler 1.36.3), and a pod that
    // waited is retried on the scheduler's own clock (a deleted claim does not wake it), so a
    // new pod asks.
    let gone = |names: &'static [&'static str]| {
        let pods = pods.clone();
        async move {
            for name in names {
                pods.delete(name, &DeleteParams::default()).await?;
            }
            eventually(Duration::from_secs(60), "the pods to go", || async {
                let mut left = 0;
                for name in names {
                    left += usize::from(pods.get_opt(name).await?.is_some());
                }
                Ok((left == 0).then_some(()))
            })
            .await
        }
    };
    gone(&["share-3", "whole-2"]).await?;
    gone(&["share-1", "share-2"]).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    eventually(
        Duration::from_secs(60),
        "the shares' pods and claims to go",
        || async {
            let left = pods.list(&ListParams::default()).await?.items.len();
            let shares = claims
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|c| allocated(c).is_ok_and(|(_, d)| d.contains("-shared-")))
                .count();
            Ok((left == 1 && shares == 0).then_some(()))
        },
    )
    .await?;
    pods.create(&PostParams::default(), &asking("whole-3", whole)?)
        .await?;
    let (card, _) = running_on(client, &pods, "whole-3").await?;
    ensure!(
        card == shared_gpu,
        "whole-3 got {card}, not the card the shares gave back ({shared_gpu})"
    );
    Ok(())
}

async fn taken_resource_is_refused(
    client: &kube::Client,
    classes: &Api<GPUClass>,
) -> anyhow::Result<()> {
    let copy = json!({
        "apiVersion": "gpu-operator-rs.dev/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "copycat"},
        "spec": {
            "selector": {"minMemory": "1Gi"},
            "variants": {"whole": {"extendedResourceName": "gpu-operator-rs.dev/team"}},
        },
    });
    classes
        .patch(
            "copycat",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(copy),
        )
        .await?;
    let message = eventually(
        Duration::from_secs(30),
        "GPUClass copycat to be refused",
        || async {
            let class = classes.get("copycat").await?;
            Ok(class
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .find(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
                .map(|c| c.message.clone()))
        },
    )
    .await?;
    ensure!(
        message.contains("already GPUClass team's"),
        "copycat's refusal does not name class team: {message}"
    );
    let own = Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{CLASS_LABEL}=copycat")))
        .await?;
    ensure!(
        own.items.is_empty(),
        "copycat got DeviceClasses: {:?}",
        own.items.iter().map(|d| d.name_any()).collect::<Vec<_>>()
    );
    eprintln!("copycat: {message}");
    Ok(())
}

/// Deletes every GPUClass, without the operator if need be.
async fn remove_classes(classes: &Api<GPUClass>) -> anyhow::Result<()> {
    for class in classes.list(&ListParams::default()).await?.items {
        let name = class.name_any();
        let patch = json!({"metadata": {"finalizers": null}});
        classes
            .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let _ = classes.delete(&name, &DeleteParams::default()).await;
    }
    Ok(())
}

/// Removes what the test made: workloads first (their claims are unprepared by the plugins),
/// then the classes, the plugins and their slices.
async fn cleanup(client: &kube::Client, classes: &Api<GPUClass>, nodes: [DraNode; 2]) {
    let _ = Api::<Deployment>::namespaced(client.clone(), NS)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let _ = pods
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let _ = eventually(Duration::from_secs(30), "the test's pods to go", || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await;
    let _ = remove_classes(classes).await;
    let _ = Api::<DeviceClass>::all(client.clone())
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(CLASS_LABEL),
        )
        .await;
    drop(nodes);
    for node in [WHOLE_NODE, MIG_NODE] {
        let _ = Api::<PhysicalGPU>::all(client.clone())
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{NODE_LABEL}={node}")),
            )
            .await;
        let _ = Api::<ResourceSlice>::all(client.clone())
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields(&format!("spec.nodeName={node}")),
            )
            .await;
    }
}
