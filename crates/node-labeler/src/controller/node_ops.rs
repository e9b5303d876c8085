//! What a hand-over does to a node and its pods: cordon, uncordon, evict.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{EvictParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Whether the node is marked unschedulable.
pub async fn is_cordoned(client: &kube::Client, node: &str) -> kube::Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get(node).await?;
    Ok(current.spec.and_then(|s| s.unschedulable) == Some(true))
}

/// Marks the node unschedulable (a no-op write when it already is).
pub async fn cordon(client: &kube::Client, node: &str, pp: &PatchParams) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let body = json!({"spec": {"unschedulable": true}});
    nodes.patch(node, pp, &Patch::Merge(&body)).await?;
    Ok(())
}

/// Makes the node schedulable again.
pub async fn uncordon(client: &kube::Client, node: &str, pp: &PatchParams) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let body = json!({"spec": {"unschedulable": null}});
    nodes.patch(node, pp, &Patch::Merge(&body)).await?;
    Ok(())
}

/// How one eviction went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// The API accepted it; the pod is terminating.
    Evicted,
    /// A PodDisruptionBudget does not allow it now (HTTP 429); tried again next round.
    Blocked(String),
    /// The pod was already gone.
    Gone,
}

/// Evicts `pod` through the Eviction API, so PodDisruptionBudgets decide.
pub async fn evict(client: &kube::Client, pod: &Pod) -> kube::Result<Eviction> {
    let namespace = pod.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    match pods.evict(&pod.name_any(), &EvictParams::default()).await {
        Ok(_) => Ok(Eviction::Evicted),
        Err(kube::Error::Api(status)) if status.code == 429 => {
            Ok(Eviction::Blocked(status.message.clone()))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Eviction::Gone),
        Err(e) => Err(e),
    }
}
