//! The reconcile loop against an in-memory API: what it writes, and that a steady state writes
//! nothing. The fake keeps objects by URL path, answers GET, LIST, PATCH and DELETE the way the
//! apiserver does for what the operator asks, and logs every write.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use api::GPUCluster;
use api::contract::{GPU_CLUSTER_FINALIZER, labels as l, objects as o};
use http::{Method, Response, StatusCode};
use kube::api::DynamicObject;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use serde_json::{Value, json};
use service::fake_api::{self, failure, reply};

use super::cache::{Operands, Writers};
use super::{Context, Error, Metrics, Settings, discovery, error_policy, reconcile};
use crate::render::DefaultImages;

const NS: &str = "gpu-operator";
const GC_UID: &str = "0b5e7f2a-0000-4000-8000-000000000001";
const COLLECTIONS: [&str; 10] = [
    "configmaps",
    "daemonsets",
    "deployments",
    "services",
    "resourceclaimtemplates",
    "deviceclasses",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "nodes",
    "events",
];

/// Objects by URL path, and the writes made, as `METHOD path`.
#[derive(Clone, Default)]
struct FakeApi {
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    writes: Arc<Mutex<Vec<String>>>,
    /// The last status written to the GPUCluster.
    status: Arc<Mutex<Option<Value>>>,
    /// Reads of single operands (`GET` of an operand path), which the watch stores make needless.
    operand_reads: Arc<Mutex<Vec<String>>>,
    /// What feeds the context's operand stores, as the watches would.
    writers: Arc<Mutex<Option<Writers>>>,
}

fn not_found(path: &str) -> Response<Body> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{path} not found"),
    )
}

/// A JSON merge patch (RFC 7386) of `patch` into `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            target.as_object_mut().unwrap().remove(key);
        } else {
            merge(&mut target[key], value);
        }
    }
}

impl FakeApi {
    fn put(&self, path: &str, object: Value) {
        self.objects.lock().unwrap().insert(path.to_owned(), object);
    }

    fn writes(&self) -> Vec<String> {
        std::mem::take(&mut *self.writes.lock().unwrap())
    }

    fn handle(&self, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
        let mut objects = self.objects.lock().unwrap();
        if method == Method::GET {
            if path == "/apis/resource.k8s.io/v1" {
                return reply(
                    StatusCode::OK,
                    &json!({"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1",
                            "resources": [{"name": "deviceclasses", "singularName": "deviceclass",
                                           "namespaced": false, "kind": "DeviceClass", "verbs": ["get"]}]}),
                );
            }
            if let Some(object) = objects.get(path) {
                if path.starts_with(&format!("/apis/apps/v1/namespaces/{NS}/")) {
                    self.operand_reads.lock().unwrap().push(path.to_owned());
                }
                return reply(StatusCode::OK, object);
            }
            if COLLECTIONS.iter().any(|c| path.ends_with(&format!("/{c}"))) {
                let items: Vec<&Value> = objects
                    .iter()
                    .filter(|(k, _)| k.rsplit_once('/').is_some_and(|(parent, _)| parent == path))
                    .map(|(_, v)| v)
                    .collect();
                return reply(
                    StatusCode::OK,
                    &json!({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}),
                );
            }
            return not_found(path);
        }
        if method == Method::POST
            && ["deviceclasses", "resourceslices"]
                .iter()
                .any(|c| path == format!("/apis/resource.k8s.io/v1/{c}"))
        {
            // The feature probes, dry runs: answered as an apiserver that serves every field, and
            // not writes.
            let mut object: Value = serde_json::from_slice(body).unwrap();
            object["metadata"]["name"] = json!("gpu-operator-probe-x");
            return reply(StatusCode::CREATED, &object);
        }
        if path.starts_with("/apis/events.k8s.io/") {
            self.writes.lock().unwrap().push(format!("EVENT {path}"));
            return reply(StatusCode::CREATED, &serde_json::from_slice(body).unwrap());
        }
        self.writes.lock().unwrap().push(format!("{method} {path}"));
        match *method {
            Method::DELETE => match objects.remove(path) {
                Some(object) => reply(StatusCode::OK, &object),
                None => not_found(path),
            },
            Method::PATCH if path.ends_with("/status") => {
                let patch: Value = serde_json::from_slice(body).unwrap();
                *self.status.lock().unwrap() = Some(patch["status"].clone());
                match objects.get_mut(path.trim_end_matches("/status")) {
                    Some(object) => {
                        merge(object, &patch);
                        reply(StatusCode::OK, object)
                    }
                    None => not_found(path),
                }
            }
            Method::PATCH => {
                let patch: Value = serde_json::from_slice(body).unwrap();
                // A JSON patch (the finalizer's): applied with its test operations, as the
                // apiserver does.
                if patch.is_array() {
                    let ops: json_patch::Patch = serde_json::from_value(patch).unwrap();
                    return match objects.get_mut(path) {
                        Some(object) => match apiserver_json_patch(object, &ops) {
                            Ok(()) => reply(StatusCode::OK, object),
                            Err(e) => {
                                fake_api::failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e)
                            }
                        },
                        None => not_found(path),
                    };
                }
                // Server-side apply of a whole object stores it; a merge patch merges into the
                // stored object.
                if patch.get("kind").is_some() {
                    objects.insert(path.to_owned(), patch.clone());
                    return reply(StatusCode::OK, &patch);
                }
                match objects.get_mut(path) {
                    Some(object) => {
                        merge(object, &patch);
                        reply(StatusCode::OK, object)
                    }
                    None => not_found(path),
                }
            }
            _ => reply(StatusCode::METHOD_NOT_ALLOWED, &json!({})),
        }
    }

    /// The operand stores as a watch would show the objects now.
    fn sync(&self) {
        let objects: Vec<DynamicObject> = self
            .objects
            .lock()
            .unwrap()
            .values()
            .filter_map(|o| serde_json::from_value(o.clone()).ok())
            .collect();
        if let Some(writers) = self.writers.lock().unwrap().as_mut() {
            writers.fill(&objects);
        }
    }

    /// A reconcile after the watches caught up with the objects.
    async fn reconcile(&self, gc: Arc<GPUCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
        self.sync();
        reconcile(gc, ctx).await
    }

    fn context(&self) -> Arc<Context> {
        let (operands, writers) = Operands::new(NS);
        *self.writers.lock().unwrap() = Some(writers);
        let api = self.clone();
        let client = fake_api::client(NS, move |method, path, body| api.handle(method, path, body));
        let reporter = Reporter {
            controller: "gpu-operator".into(),
            instance: None,
        };
        Arc::new(Context {
            operands,
            events: service::events::EventPublisher::new(client.clone(), reporter),
            features: Arc::new(discovery::FeatureCache::new(client.clone())),
            client,
            settings: Settings {
                namespace: NS.into(),
                images: DefaultImages {
                    dra_driver: "registry.example/gpu-kubelet-plugin:1".into(),
                    validator: "registry.example/gpu-operator:1".into(),
                    compute_domain: "registry.example/dra-driver:1".into(),
                    dcgm: "registry.example/dcgm:1".into(),
                    dcgm_exporter: "registry.example/dcgm-exporter:1".into(),
                },
            },
            metrics: Metrics::default(),
            served: tokio::sync::Mutex::new(None),
            cluster_policy: tokio::sync::watch::channel(Some(false)).1,
        })
    }
}

/// The fake with the operator's namespace and one GPU node in DRA mode.
fn cluster() -> FakeApi {
    let api = FakeApi::default();
    api.put(
        &format!("/api/v1/namespaces/{NS}"),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    );
    api.put(
        GPU_CLUSTER_PATH,
        serde_json::to_value(&*gpu_cluster(true, None)).unwrap(),
    );
    api.put(
        "/api/v1/nodes/gpu-node-0",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-0", "labels": {
            l::GPU_PRESENT: "true", l::ALLOCATION_MODE: "dra", l::DEPLOY_DRA_DRIVER: "true"}}}),
    );
    api
}

fn gpu_cluster(finalizer: bool, status: Option<Value>) -> Arc<GPUCluster> {
    let mut gc = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster", "uid": GC_UID, "resourceVersion": "1", "generation": 1},
        "spec": {}});
    if finalizer {
        gc["metadata"]["finalizers"] = json!([GPU_CLUSTER_FINALIZER]);
    }
    if let Some(status) = status {
        gc["status"] = status;
    }
    Arc::new(serde_json::from_value(gc).unwrap())
}

/// A JSON patch as the apiserver applies it: a `test` of `null` passes on a missing field.
fn apiserver_json_patch(object: &mut Value, ops: &json_patch::Patch) -> Result<(), String> {
    let metadata = object["metadata"].as_object_mut().unwrap();
    metadata.entry("finalizers").or_insert(Value::Null);
    let patched = json_patch::patch(object, ops).map_err(|e| e.to_string());
    if object["metadata"]["finalizers"].is_null() {
        object["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("finalizers");
    }
    patched
}

const GPU_CLUSTER_PATH: &str = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster";

fn daemonset_path(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{NS}/daemonsets/{name}")
}

#[tokio::test]
async fn a_steady_state_reconcile_writes_nothing() {
    let api = cluster();
    let ctx = api.context();

    // A new GPUCluster first gets the finalizer, and nothing else until that write comes back.
    api.put(
        GPU_CLUSTER_PATH,
        serde_json::to_value(&*gpu_cluster(false, None)).unwrap(),
    );
    let action = api
        .reconcile(gpu_cluster(false, None), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(api.writes(), [format!("PATCH {GPU_CLUSTER_PATH}")]);
    assert_eq!(
        api.objects.lock().unwrap()[GPU_CLUSTER_PATH]["metadata"]["finalizers"],
        json!([GPU_CLUSTER_FINALIZER])
    );

    // Then every operand, the namespace label and a status.
    api.reconcile(gpu_cluster(true, None), ctx.clone())
        .await
        .unwrap();
    let first = api.writes();
    let applied = |w: &&String| w.starts_with("PATCH /apis/apps/v1/");
    assert!(first.iter().filter(applied).count() >= 3, "{first:#?}");
    assert!(
        first
            .iter()
            .any(|w| w.ends_with("/gpuclusters/gpu-cluster/status")),
        "{first:#?}"
    );

    assert_eq!(
        api.objects.lock().unwrap()[&format!("/api/v1/namespaces/{NS}")]["metadata"]["labels"]
            [l::ADMIN_ACCESS_NAMESPACE],
        "true"
    );
    // Nothing changed since: the same GPUCluster with its finalizer and the status written.
    let status = api.status.lock().unwrap().clone();
    api.reconcile(gpu_cluster(true, status), ctx).await.unwrap();
    assert_eq!(
        api.writes(),
        Vec::<String>::new(),
        "a reconcile with nothing changed wrote"
    );
    assert_eq!(
        *api.operand_reads.lock().unwrap(),
        Vec::<String>::new(),
        "an operand the watches hold was read from the API"
    );
}

#[tokio::test]
async fn an_operand_left_out_of_the_spec_is_pruned_and_a_foreign_one_kept() {
    let api = cluster();
    let ctx = api.context();
    api.reconcile(gpu_cluster(true, None), ctx.clone())
        .await
        .unwrap();
    let owned = |name: &str, uid: &str| {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name,
            "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
            "ownerReferences": [{"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
                                 "name": "gpu-cluster", "uid": uid, "controller": true}]}})
    };
    api.put(&daemonset_path("left-over"), owned("left-over", GC_UID));
    api.put(
        &daemonset_path("someone-elses"),
        owned("someone-elses", "another-uid"),
    );
    api.writes();
    let status = api.status.lock().unwrap().clone();
    api.reconcile(gpu_cluster(true, status), ctx).await.unwrap();
    let writes = api.writes();
    assert!(
        writes.contains(&format!("DELETE {}", daemonset_path("left-over"))),
        "{writes:#?}"
    );
    assert!(
        !writes.iter().any(|w| w.contains("someone-elses")),
        "{writes:#?}"
    );
}

#[tokio::test]
async fn deletion_drains_claim_consumers_before_the_plugin_then_drops_the_finalizer() {
    let api = cluster();
    let ctx = api.context();
    api.reconcile(gpu_cluster(true, None), ctx.clone())
        .await
        .unwrap();
    api.writes();
    let deleting = |status| {
        let mut gc = (*gpu_cluster(true, status)).clone();
        gc.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        Arc::new(gc)
    };
    let status = api.status.lock().unwrap().clone();

    // Consumers (the validator and the exporter hold claims) go first; the plugin stays.
    let error = api
        .reconcile(deleting(status.clone()), ctx.clone())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Draining(_)), "{error}");
    assert_eq!(
        error_policy(deleting(status.clone()), &error, ctx.clone()),
        Action::requeue(std::time::Duration::from_secs(2)),
        "the drain must come back soon"
    );
    let writes = api.writes();
    let deleted: Vec<&String> = writes.iter().filter(|w| w.starts_with("DELETE")).collect();
    assert!(
        deleted.contains(&&format!(
            "DELETE {}",
            daemonset_path(o::VALIDATOR_DAEMONSET)
        )),
        "{writes:#?}"
    );
    assert!(
        !deleted
            .iter()
            .any(|w| w.ends_with(o::KUBELET_PLUGIN_DAEMONSET)),
        "the plugin went with its consumers: {writes:#?}"
    );
    assert!(
        !writes
            .iter()
            .any(|w| w.ends_with("/gpuclusters/gpu-cluster")),
        "finalizer dropped while consumers remain: {writes:#?}"
    );

    // Once they are gone, the finalizer goes and garbage collection takes the rest.
    api.reconcile(deleting(status), ctx).await.unwrap();
    let writes = api.writes();
    assert_eq!(
        writes,
        ["PATCH /apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster"],
        "only the finalizer's removal"
    );
}

#[tokio::test]
async fn the_status_names_nodes_held_on_dra_and_gpu_nodes_no_plane_serves() {
    let api = cluster();
    let handover = api::handover::Handover {
        from: api::AllocationMode::Dra,
        to: api::AllocationMode::DevicePlugin,
        phase: api::handover::Phase::Draining,
        since: 1_700_000_000,
        cordoned: true,
        rollback: None,
    };
    api.put(
        "/api/v1/nodes/gpu-node-1",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1",
            "labels": {l::GPU_PRESENT: "true", l::ALLOCATION_MODE: "dra", l::DEPLOY_DRA_DRIVER: "true"},
            "annotations": {l::HANDOVER: handover.to_annotation()}}}),
    );
    api.put(
        "/api/v1/nodes/gpu-node-2",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-2",
            "labels": {l::GPU_PRESENT: "true", l::ENABLED: "false"}}}),
    );
    api.reconcile(gpu_cluster(true, None), api.context())
        .await
        .unwrap();
    let status = api.status.lock().unwrap().clone().unwrap();
    let condition = |type_: &str| {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or_else(|| panic!("no {type_} condition in {status:#}"))
    };
    let held = condition("NodesHeldOnDRA");
    assert_eq!(held["status"], "True");
    assert!(
        held["message"]
            .as_str()
            .unwrap()
            .contains("node gpu-node-1 (since 2023-11-14T22:13:20Z)"),
        "{held}"
    );
    let unserved = condition("GPUNodesUnserved");
    assert_eq!(unserved["status"], "True");
    assert_eq!(
        unserved["message"],
        "1 GPU node gets no GPUs from either plane: node gpu-node-2: opted out by \
         gpu-operator-rs.dev/enabled=false (remove the label to serve it)"
    );
    // An opted-out node does not keep the cluster waiting for the labeler.
    assert_ne!(
        condition("Ready")["reason"],
        "NodesNotLabelled",
        "{status:#}"
    );
    let features = condition("DRAFeaturesServed");
    assert_eq!(features["status"], "True", "{features}");
}

#[test]
fn an_operand_in_any_namespace_maps_to_the_one_cluster_scoped_key() {
    let ds = |owner: serde_json::Value| -> k8s_openapi::api::apps::v1::DaemonSet {
        serde_json::from_value(json!({"metadata": {"name": "d", "namespace": NS,
            "ownerReferences": [owner]}}))
        .unwrap()
    };
    let ours = ds(
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "name": "gpu-cluster", "uid": GC_UID, "controller": true}),
    );
    let key = super::to_gpu_cluster(ours).expect("an operand of the GPUCluster");
    assert_eq!(key, kube::runtime::reflector::ObjectRef::new("gpu-cluster"));
    assert_eq!(key.namespace, None, "a second key for the same object");
    let foreign = ds(
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "x",
        "uid": "u", "controller": true}),
    );
    assert_eq!(super::to_gpu_cluster(foreign), None);
}
