//! Claims read ahead, so that a prepare does not wait for its claim GET.
//!
//! Before the kubelet calls `NodePrepareResources` it reads the pod's claims itself. A watch of the
//! pods bound to this node sees the same pod at the same moment: the plugin reads the pod's claims
//! then, while the kubelet reads them, and the prepare finds its claim already read (or its read in
//! flight). A claim read ahead is used by one prepare only, within [`TTL`], and only while every pod
//! it is reserved for is still on this node and not being deleted: a claim can be allocated anew
//! only once those pods are gone, so an allocation read ahead is the one the kubelet saw. In any
//! other case, and whenever the read ahead failed, the claim is read again ([`KubeClaims`]).
//!
//! Only pods first seen after the watch's initial list are read ahead: pods already running have
//! their claims prepared, and reading them at every start would be wasted requests.
//!
//! Pods are read as [`BoundPod`], the few fields this needs: the full `Pod` type's decoder alone
//! would cost the plugin about a MiB of resident code.

use crate::driver::{ClaimFailure, ClaimSource, KubeClaims};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a claim read ahead may wait for its prepare.
pub const TTL: Duration = Duration::from_secs(30);

type Read = Shared<BoxFuture<'static, Option<ResourceClaim>>>;

/// A Pod as this module reads it: its claims, whether it is going, and nothing else.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct BoundPod {
    /// The pod's metadata.
    pub metadata: ObjectMeta,
    /// `spec.resourceClaims`.
    #[serde(default)]
    pub spec: BoundPodSpec,
    /// `status.resourceClaimStatuses` and `status.phase`.
    #[serde(default)]
    pub status: BoundPodStatus,
}

/// The part of a pod's spec read here.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundPodSpec {
    /// The claims the pod names.
    #[serde(default)]
    pub resource_claims: Vec<PodClaimName>,
}

/// The part of a pod's status read here.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundPodStatus {
    /// The claims made for the pod from its templates.
    #[serde(default)]
    pub resource_claim_statuses: Vec<PodClaimName>,
    /// The pod's phase.
    #[serde(default)]
    pub phase: Option<String>,
}

/// A claim named in a pod's spec or status (`resourceClaimName`; unset for a template not made
/// into a claim yet).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodClaimName {
    /// The ResourceClaim's name.
    #[serde(default)]
    pub resource_claim_name: Option<String>,
}

impl kube::Resource for BoundPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group((): &()) -> Cow<'_, str> {
        "".into()
    }
    fn version((): &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural((): &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A claim `(namespace, name)`.
type ClaimKey = (String, String);

#[derive(Default)]
struct State {
    /// Reads ahead by claim, with when each started.
    reads: HashMap<ClaimKey, (Read, Instant)>,
    /// Pods on this node, not being deleted, by UID, with their claims.
    pods: HashMap<String, Vec<ClaimKey>>,
}

/// Claims read from the API, ahead of the prepare where the pod watch allowed it.
#[derive(Clone)]
pub struct PrefetchedClaims {
    api: KubeClaims,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for PrefetchedClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrefetchedClaims")
    }
}

/// The claims a pod names: from its templates (in its status) and by name (in its spec).
pub fn pod_claims(pod: &BoundPod) -> Vec<ClaimKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut names: Vec<String> = (pod.status.resource_claim_statuses.iter())
        .chain(&pod.spec.resource_claims)
        .filter_map(|c| c.resource_claim_name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| (namespace.clone(), name))
        .collect()
}

/// The UIDs of the pods a claim is reserved for.
fn reserved_pods(claim: &ResourceClaim) -> Vec<&str> {
    claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods")
        .map(|r| r.uid.as_str())
        .collect()
}

impl PrefetchedClaims {
    /// Reads claims through `client`; nothing is read ahead until [`PrefetchedClaims::watch`]
    /// runs.
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: KubeClaims(client),
            state: Arc::default(),
        }
    }

    /// Watches the pods bound to `node` and reads the claims of each new one, forever.
    pub async fn watch(self, node: String) {
        let api: kube::Api<BoundPod> = kube::Api::all(self.api.0.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => self.saw(event),
                Err(e) => {
                    tracing::debug!(error = %e, "pod watch error; claims are read at prepare")
                }
            }
        }
    }

    /// Takes in a pod watch event: a new pod's claims are read ahead, a pod deleted (or being
    /// deleted) makes its claims' reads unusable.
    fn saw(&self, event: watcher::Event<BoundPod>) {
        let mut state = self.state.lock().expect("prefetch state");
        let now = Instant::now();
        state
            .reads
            .retain(|_, (_, started)| now.duration_since(*started) < TTL);
        match event {
            watcher::Event::Init => state.pods.clear(),
            watcher::Event::InitApply(pod) => {
                if let (Some(uid), false) = (&pod.metadata.uid, going(&pod)) {
                    state.pods.insert(uid.clone(), pod_claims(&pod));
                }
            }
            watcher::Event::InitDone => {}
            watcher::Event::Apply(pod) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    return;
                };
                if going(&pod) {
                    forget(&mut state, &uid);
                } else if !state.pods.contains_key(&uid) {
                    let claims = pod_claims(&pod);
                    for key in &claims {
                        let read = self.read(key.clone());
                        state.reads.insert(key.clone(), (read, now));
                    }
                    state.pods.insert(uid, claims);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(uid) = &pod.metadata.uid {
                    forget(&mut state, uid);
                }
            }
        }
    }

    /// Starts reading `key` now, whether or not a prepare waits for it.
    fn read(&self, (namespace, name): ClaimKey) -> Read {
        let api = self.api.clone();
        let read = async move { api.get(&namespace, &name).await.ok() }
            .boxed()
            .shared();
        tokio::spawn(read.clone());
        read
    }

    /// Whether every pod `claim` is reserved for is still on this node and not being deleted.
    fn still_reserved(&self, claim: &ResourceClaim) -> bool {
        let reserved = reserved_pods(claim);
        let state = self.state.lock().expect("prefetch state");
        !reserved.is_empty() && reserved.iter().all(|uid| state.pods.contains_key(*uid))
    }
}

/// Whether the pod is being deleted or has finished.
fn going(pod: &BoundPod) -> bool {
    let finished = pod
        .status
        .phase
        .as_deref()
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    pod.metadata.deletion_timestamp.is_some() || finished
}

/// Drops a pod and the reads ahead of its claims.
fn forget(state: &mut State, uid: &str) {
    if let Some(claims) = state.pods.remove(uid) {
        let others: HashSet<&ClaimKey> = state.pods.values().flatten().collect();
        let gone: Vec<ClaimKey> = claims.into_iter().filter(|c| !others.contains(c)).collect();
        for key in gone {
            state.reads.remove(&key);
        }
    }
}

impl ClaimSource for PrefetchedClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimFailure> {
        let ahead = {
            let mut state = self.state.lock().expect("prefetch state");
            state
                .reads
                .remove(&(namespace.to_owned(), name.to_owned()))
                .filter(|(_, started)| started.elapsed() < TTL)
        };
        if let Some((read, _)) = ahead
            && let Some(claim) = read.await
            && self.still_reserved(&claim)
        {
            return Ok(claim);
        }
        self.api.get(namespace, name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use service::fake_api::{client, reply};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn pod(uid: &str, claim: &str) -> BoundPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "ns", "uid": uid},
            "spec": {"nodeName": "node-a", "containers": [],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}
        }))
        .unwrap()
    }

    fn claim(name: &str, reserved_for: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": name, "uid": format!("uid-{name}")},
            "spec": {"devices": {}},
            "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": reserved_for}]}
        })
    }

    /// Claims served by a fake API that counts its GETs; every claim is reserved for pod `p1`.
    fn prefetched() -> (PrefetchedClaims, Arc<AtomicUsize>) {
        let gets = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&gets);
        let client = client("default", move |_, path, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            let name = path.rsplit('/').next().unwrap_or_default();
            reply(StatusCode::OK, &claim(name, "p1"))
        });
        (PrefetchedClaims::new(client), gets)
    }

    #[test]
    fn a_pod_names_its_template_claims_and_its_own() {
        let mut p = pod("p1", "p1-gpu-x");
        p.spec.resource_claims.push(PodClaimName {
            resource_claim_name: Some("team".into()),
        });
        assert_eq!(
            pod_claims(&p),
            [
                ("ns".to_owned(), "p1-gpu-x".to_owned()),
                ("ns".to_owned(), "team".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn a_new_pods_claim_is_read_once_ahead_and_used_once() {
        let (claims, gets) = prefetched();
        claims.saw(watcher::Event::Init);
        claims.saw(watcher::Event::InitDone);
        claims.saw(watcher::Event::Apply(pod("p1", "c1")));
        // A status update of the same pod reads nothing again.
        claims.saw(watcher::Event::Apply(pod("p1", "c1")));
        let got = claims.get("ns", "c1").await.unwrap();
        assert_eq!(got.metadata.uid.as_deref(), Some("uid-c1"));
        assert_eq!(
            gets.load(Ordering::SeqCst),
            1,
            "the prepare used the read ahead"
        );
        // A second prepare of the same claim (a kubelet retry) reads it again.
        claims.get("ns", "c1").await.unwrap();
        assert_eq!(gets.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn pods_running_at_start_are_not_read_ahead() {
        let (claims, gets) = prefetched();
        claims.saw(watcher::Event::Init);
        claims.saw(watcher::Event::InitApply(pod("p1", "c1")));
        claims.saw(watcher::Event::InitDone);
        tokio::task::yield_now().await;
        assert_eq!(gets.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_read_ahead_is_not_used_once_its_pod_is_gone() {
        let (claims, gets) = prefetched();
        claims.saw(watcher::Event::InitDone);
        claims.saw(watcher::Event::Apply(pod("p1", "c1")));
        claims.saw(watcher::Event::Delete(pod("p1", "c1")));
        claims.get("ns", "c1").await.unwrap();
        assert_eq!(gets.load(Ordering::SeqCst), 2, "read again at prepare");
    }

    #[tokio::test]
    async fn a_claim_reserved_for_another_pod_is_read_again() {
        let (claims, gets) = prefetched();
        claims.saw(watcher::Event::InitDone);
        // The claim read ahead is reserved for p1, which is not on this node.
        claims.saw(watcher::Event::Apply(pod("p2", "c1")));
        claims.get("ns", "c1").await.unwrap();
        assert_eq!(gets.load(Ordering::SeqCst), 2);
    }
}
