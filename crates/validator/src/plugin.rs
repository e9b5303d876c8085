//! `plugin`: the device plugin serves this node. Its GPUs are allocatable, and a pod that asks for
//! one runs with exactly that GPU (the `workload` check, once); then report ready and stay up.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use gpu_discovery::atomic::{Durability, replace};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::cli::{Common, PluginArgs};
use crate::retry::{CommandError, Policy, Stop, retry_async};

/// File name of the readiness marker in the output dir.
pub const READY_FILE: &str = "plugin-ready";
/// Label of the validation pods.
pub const WORKLOAD_APP: &str = "nvidia-device-plugin-validator";

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The node offers no GPU resource yet.
    #[error(
        "node {node} offers no {wanted} in its allocatable resources yet: is the device plugin \
         running and registered there?"
    )]
    NotOffered {
        /// The node.
        node: String,
        /// What was looked for.
        wanted: String,
    },
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, naming the object.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// The validation pod did not finish yet.
    #[error("validation pod {pod} is {phase}{detail}")]
    NotDone {
        /// The pod.
        pod: String,
        /// Its phase.
        phase: String,
        /// Why it waits, when the pod says.
        detail: String,
    },
    /// The validation pod failed.
    #[error("validation pod {pod} failed: {reason}")]
    WorkloadFailed {
        /// The pod.
        pod: String,
        /// What its container said.
        reason: String,
    },
}

/// Why the `plugin` command failed.
pub type PluginError = CommandError<AttemptError>;

/// The GPU resource a validation pod asks for: `wanted` when set, else `nvidia.com/gpu` when
/// offered, else the first other `nvidia.com/` resource offered (a MIG profile, a shared GPU).
pub fn pick_resource(
    allocatable: &BTreeMap<String, String>,
    wanted: Option<&str>,
) -> Option<String> {
    let offered = |name: &str| {
        allocatable
            .get(name)
            .and_then(|q| q.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    };
    if let Some(name) = wanted {
        return offered(name).then(|| name.to_owned());
    }
    if offered("nvidia.com/gpu") {
        return Some("nvidia.com/gpu".into());
    }
    allocatable
        .keys()
        .find(|k| k.starts_with("nvidia.com/") && offered(k))
        .cloned()
}

/// What the validation pod needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload<'a> {
    /// Node to run on.
    pub node: &'a str,
    /// Namespace of the pod.
    pub namespace: &'a str,
    /// The resource asked for (one of it).
    pub resource: &'a str,
    /// Image holding `dra-driver-validator`.
    pub image: &'a str,
    /// Its pull policy.
    pub pull_policy: &'a str,
    /// Pull secrets.
    pub pull_secrets: &'a [String],
    /// The validator pod (name, uid) that owns it, so it goes with it.
    pub owner: Option<(&'a str, &'a str)>,
}

impl Workload<'_> {
    /// The pod's name: one per node.
    pub fn name(&self) -> String {
        format!("{WORKLOAD_APP}-{}", self.node)
    }

    /// The validation pod: pinned to the node, asking one of the resource, running the `workload`
    /// check once.
    pub fn pod(&self) -> Pod {
        let owners: Vec<_> = self
            .owner
            .iter()
            .map(|(name, uid)| json!({"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}))
            .collect();
        let secrets: Vec<_> = self
            .pull_secrets
            .iter()
            .map(|n| json!({"name": n}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name(),
                "namespace": self.namespace,
                "labels": {"app": WORKLOAD_APP, "app.kubernetes.io/part-of": "gpu-operator"},
                "ownerReferences": owners,
            },
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [self.node]}]}]}}},
                "tolerations": [{"operator": "Exists"}],
                "imagePullSecrets": secrets,
                "containers": [{
                    "name": "workload",
                    "image": self.image,
                    "imagePullPolicy": self.pull_policy,
                    "command": ["dra-driver-validator", "workload"],
                    // The check's one-line error becomes the pod's termination message.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "env": [
                        {"name": "EXIT_WHEN_READY", "value": "true"},
                        {"name": "OUTPUT_DIR", "value": "/validations"},
                        {"name": "WITH_WAIT", "value": "true"},
                        {"name": "SLEEP_INTERVAL_SECONDS", "value": "2"},
                        {"name": "TIMEOUT_SECONDS", "value": "60"},
                    ],
                    "resources": {"limits": {self.resource: "1"}},
                    "volumeMounts": [{"name": "validations", "mountPath": "/validations"}],
                }],
                "volumes": [{"name": "validations", "emptyDir": {}}],
            },
        }))
        .expect("a valid pod")
    }
}

/// Where a validation pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Still pending or running; why, when the pod says.
    Waiting(String, String),
    /// Its check passed.
    Succeeded,
    /// Its check failed; what the container said.
    Failed(String),
}

/// Reads a validation pod's status.
pub fn outcome(pod: &Pod) -> Outcome {
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_else(|| "Pending".into());
    let container = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .next();
    match phase.as_str() {
        "Succeeded" => Outcome::Succeeded,
        "Failed" => {
            let terminated = container.and_then(|c| c.state).and_then(|s| s.terminated);
            let said = terminated
                .and_then(|t| t.message.or(t.reason))
                .or(status.message)
                .or(status.reason)
                .unwrap_or_else(|| "no reason given".into());
            Outcome::Failed(said.trim().to_owned())
        }
        _ => {
            let waiting = container
                .and_then(|c| c.state)
                .and_then(|s| s.waiting)
                .and_then(|w| w.message.or(w.reason));
            let unschedulable = status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .and_then(|c| c.message);
            let detail = waiting
                .or(unschedulable)
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            Outcome::Waiting(phase, detail)
        }
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> AttemptError {
    let action = action.into();
    move |source| AttemptError::Api { action, source }
}

/// Runs the check until it passes, then reports ready until `shutdown`.
pub async fn run<F: Future<Output = ()>>(
    common: &Common,
    args: &PluginArgs,
    mut shutdown: Pin<&mut F>,
) -> Result<(), PluginError> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| CommandError::Failed(api_err("connecting to the API server")(e)))?;
    let policy = Policy {
        with_wait: common.with_wait,
        interval: common.interval(),
        timeout: common.timeout(),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, &args.namespace);
    let wanted = args.resource.as_deref();
    let node = args.node_name.as_str();

    // The plane's plugin registers seconds after this pod starts (both come with the node's
    // labels), so the node is read every second rather than every interval until it offers GPUs.
    let offered = Policy {
        interval: Duration::from_secs(1).min(common.interval()),
        ..policy
    };
    let resource = stop(
        retry_async(offered, shutdown.as_mut(), || async {
            let n = nodes
                .get(node)
                .await
                .map_err(api_err(format!("reading node {node}")))?;
            let allocatable = n
                .status
                .and_then(|s| s.allocatable)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            pick_resource(&allocatable, wanted).ok_or_else(|| AttemptError::NotOffered {
                node: node.to_owned(),
                wanted: wanted.unwrap_or("nvidia.com/ resource").to_owned(),
            })
        })
        .await,
    )?;
    let workload = Workload {
        node,
        namespace: &args.namespace,
        resource: &resource,
        image: &args.image,
        pull_policy: &args.image_pull_policy,
        pull_secrets: &args.image_pull_secrets,
        owner: args.pod_name.as_deref().zip(args.pod_uid.as_deref()),
    };
    let name = workload.name();
    // A pod left by an earlier run proves nothing about this one.
    stop(retry_async(policy, shutdown.as_mut(), || remove(&pods, &name)).await)?;
    pods.create(&PostParams::default(), &workload.pod())
        .await
        .map_err(|e| CommandError::Failed(api_err(format!("creating pod {name}"))(e)))?;
    tracing::info!(pod = %name, %resource, "validation pod created");

    let watch = Policy {
        with_wait: true,
        interval: Duration::from_secs(1).min(common.interval()),
        ..policy
    };
    let result = retry_async(watch, shutdown.as_mut(), || async {
        let pod = pods
            .get(&name)
            .await
            .map_err(api_err(format!("reading pod {name}")))?;
        match outcome(&pod) {
            Outcome::Succeeded => Ok(Ok(())),
            Outcome::Failed(reason) => Ok(Err(AttemptError::WorkloadFailed {
                pod: name.clone(),
                reason,
            })),
            Outcome::Waiting(phase, detail) => Err(AttemptError::NotDone {
                pod: name.clone(),
                phase,
                detail,
            }),
        }
    })
    .await;
    let _ = remove(&pods, &name).await;
    stop(result)?.map_err(CommandError::Failed)?;

    let path = common.output_dir.join(READY_FILE);
    replace(&path, resource.as_bytes(), Durability::Durable).map_err(|source| {
        CommandError::Write {
            path: path.clone(),
            source,
        }
    })?;
    tracing::info!("ready: node {node} offers {resource} and a pod asking for one ran with it");
    shutdown.await;
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// Deletes the pod if it exists and returns once it is gone.
async fn remove(pods: &Api<Pod>, name: &str) -> Result<(), AttemptError> {
    match pods.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(api_err(format!("deleting pod {name}"))(e)),
    }
    match pods.get_opt(name).await {
        Ok(None) => Ok(()),
        Ok(Some(pod)) => Err(AttemptError::NotDone {
            pod: pod.name_any(),
            phase: "terminating".into(),
            detail: String::new(),
        }),
        Err(e) => Err(api_err(format!("reading pod {name}"))(e)),
    }
}

/// A retry's end as the command's error; a shutdown while waiting is a clean stop.
fn stop<T>(result: Result<T, Stop<AttemptError>>) -> Result<T, PluginError> {
    result.map_err(CommandError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_resource_is_whole_gpus_first_then_any_other_gpu_resource() {
        let a = alloc(&[
            ("cpu", "8"),
            ("nvidia.com/gpu", "2"),
            ("nvidia.com/mig-1g.10gb", "7"),
        ]);
        assert_eq!(pick_resource(&a, None).as_deref(), Some("nvidia.com/gpu"));
        let mig = alloc(&[("nvidia.com/gpu", "0"), ("nvidia.com/mig-1g.10gb", "7")]);
        assert_eq!(
            pick_resource(&mig, None).as_deref(),
            Some("nvidia.com/mig-1g.10gb")
        );
        assert_eq!(pick_resource(&alloc(&[("cpu", "8")]), None), None);
        let shared = alloc(&[("example.com/small", "4")]);
        assert_eq!(pick_resource(&shared, None), None);
        assert_eq!(
            pick_resource(&shared, Some("example.com/small")).as_deref(),
            Some("example.com/small")
        );
    }

    #[test]
    fn the_pod_is_pinned_asks_for_one_and_goes_with_its_owner() {
        let w = Workload {
            node: "gpu-7",
            namespace: "gpu-operator",
            resource: "nvidia.com/gpu",
            image: "registry.example/gpu-operator:1",
            pull_policy: "IfNotPresent",
            pull_secrets: &["regcred".to_owned()],
            owner: Some(("nvidia-operator-validator-x", "uid-1")),
        };
        let pod = serde_json::to_value(w.pod()).unwrap();
        assert_eq!(
            pod["metadata"]["name"],
            "nvidia-device-plugin-validator-gpu-7"
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        let spec = &pod["spec"];
        assert_eq!(
            spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchFields"][0]["values"][0],
            "gpu-7"
        );
        let c = &spec["containers"][0];
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert_eq!(c["command"], json!(["dra-driver-validator", "workload"]));
        assert!(
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "EXIT_WHEN_READY")
        );
        assert_eq!(spec["restartPolicy"], "Never");
        assert_eq!(spec["imagePullSecrets"][0]["name"], "regcred");
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    #[test]
    fn outcomes_say_why() {
        assert_eq!(
            outcome(&pod(json!({"phase": "Succeeded"}))),
            Outcome::Succeeded
        );
        let failed = pod(
            json!({"phase": "Failed", "containerStatuses": [{"name": "workload",
            "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "message": "expected GPU-1, NVML sees []\n"}}}]}),
        );
        assert_eq!(
            outcome(&failed),
            Outcome::Failed("expected GPU-1, NVML sees []".into())
        );
        let unschedulable = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "message": "0/3 nodes are available: Insufficient nvidia.com/gpu"}]}),
        );
        assert_eq!(
            outcome(&unschedulable),
            Outcome::Waiting(
                "Pending".into(),
                ": 0/3 nodes are available: Insufficient nvidia.com/gpu".into()
            )
        );
        let rejected = pod(
            json!({"phase": "Failed", "reason": "UnexpectedAdmissionError",
            "message": "Allocate failed due to no healthy devices"}),
        );
        assert_eq!(
            outcome(&rejected),
            Outcome::Failed("Allocate failed due to no healthy devices".into())
        );
    }
}
