//! Why an operand's pods run but are not available: an image that cannot be pulled, a container in
//! a crash loop, a failing init container (`driver-validation`). The DaemonSet's status says only
//! "2 of 3 pods available"; the pods' container statuses say which node, which container and why.
//! Those are brought into the `GPUCluster` status, bounded. The decisions are pure; [`read`] is
//! the one list of pods around them.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// Waiting reasons that need someone to act: they do not clear by themselves.
const STUCK: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];
/// Failures named one by one in the condition; the rest are counted.
pub const NAMED: usize = 3;
/// Characters of a container's own message kept.
const MESSAGE_CHARS: usize = 160;

/// One container of an operand pod that keeps the pod from being available.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFailure {
    /// The node the pod runs on.
    pub node: String,
    /// The pod.
    pub pod: String,
    /// The container, `init:` in front for an init container.
    pub container: String,
    /// The kubelet's reason (`ImagePullBackOff`, `CrashLoopBackOff`, `Error`).
    pub reason: String,
    /// What the kubelet or the container said (the pull error, the last termination message).
    pub message: String,
}

impl std::fmt::Display for PodFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {}: pod {} container {}: {}",
            self.node, self.pod, self.container, self.reason
        )?;
        if !self.message.is_empty() {
            write!(f, " ({})", self.message)?;
        }
        Ok(())
    }
}

fn shorten(text: &str) -> String {
    let text = text.trim().replace('\n', " ");
    match text.char_indices().nth(MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Why `status` keeps its container from running, if it is stuck: waiting for a reason of
/// [`STUCK`] (with the last termination's message where the waiting one is empty), or, for an init
/// container, ended with a non-zero exit code.
fn stuck(status: &ContainerStatus, init: bool) -> Option<(String, String)> {
    let state = status.state.as_ref()?;
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        if STUCK.contains(&reason) {
            let message = waiting
                .message
                .clone()
                .filter(|m| !m.is_empty())
                .or_else(|| last.and_then(|t| t.message.clone()))
                .unwrap_or_default();
            return Some((reason.to_owned(), message));
        }
    }
    match &state.terminated {
        Some(t) if init && t.exit_code != 0 => Some((
            t.reason.clone().unwrap_or_else(|| "Error".into()),
            t.message
                .clone()
                .unwrap_or_else(|| format!("exit code {}", t.exit_code)),
        )),
        _ => None,
    }
}

/// The stuck containers of `pod`, init containers first.
pub fn failures(pod: &Pod) -> Vec<PodFailure> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| "(unscheduled)".into());
    let init = status
        .init_container_statuses
        .iter()
        .flatten()
        .map(|c| (c, true));
    let main = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| (c, false));
    init.chain(main)
        .filter_map(|(c, is_init)| {
            let (reason, message) = stuck(c, is_init)?;
            Some(PodFailure {
                node: node.clone(),
                pod: pod.name_any(),
                container: if is_init {
                    format!("init:{}", c.name)
                } else {
                    c.name.clone()
                },
                reason,
                message: shorten(&message),
            })
        })
        .collect()
}

/// Whether `pod` belongs to one of `daemonsets`.
fn owned_by_any(pod: &Pod, daemonsets: &[&DaemonSet]) -> bool {
    pod.owner_references().iter().any(|o| {
        o.kind == "DaemonSet"
            && daemonsets
                .iter()
                .any(|ds| ds.metadata.uid.as_deref() == Some(o.uid.as_str()))
    })
}

/// Whether `ds` has pods that are not available.
pub fn pods_unavailable(ds: &DaemonSet) -> bool {
    ds.status
        .as_ref()
        .is_some_and(|s| s.number_available.unwrap_or(0) < s.desired_number_scheduled)
}

/// The failures of the pods of `daemonsets` among `pods`, sorted by node and pod.
pub fn of_daemonsets(daemonsets: &[&DaemonSet], pods: &[Pod]) -> Vec<PodFailure> {
    let mut out: Vec<PodFailure> = pods
        .iter()
        .filter(|p| owned_by_any(p, daemonsets))
        .flat_map(failures)
        .collect();
    out.sort_by(|a, b| (&a.node, &a.pod).cmp(&(&b.node, &b.pod)));
    out
}

/// The condition's text for `failures`: the first [`NAMED`], then how many more.
pub fn summary(failures: &[PodFailure]) -> Option<String> {
    if failures.is_empty() {
        return None;
    }
    let mut text = failures
        .iter()
        .take(NAMED)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if failures.len() > NAMED {
        text.push_str(&format!("; and {} more", failures.len() - NAMED));
    }
    Some(format!("operand pods failing: {text}"))
}

/// The failures of the pods of those of `daemonsets` whose pods are not all available: one list
/// of the namespace's pods, and only then. A failed read is logged and yields nothing (the
/// operand stays "not ready" with its counts).
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    daemonsets: &[DaemonSet],
) -> Vec<PodFailure> {
    let unavailable: Vec<&DaemonSet> = daemonsets.iter().filter(|d| pods_unavailable(d)).collect();
    if unavailable.is_empty() {
        return Vec::new();
    }
    match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => of_daemonsets(&unavailable, &list.items),
        Err(e) => {
            tracing::warn!(error = %e, "listing the operands' pods failed");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(uid: &str) -> DaemonSet {
        serde_json::from_value(
            json!({"metadata": {"name": "nvidia-dra-driver-kubelet-plugin", "uid": uid},
            "status": {"desiredNumberScheduled": 3, "numberAvailable": 1,
                       "currentNumberScheduled": 3, "numberMisscheduled": 0, "numberReady": 1}}),
        )
        .unwrap()
    }

    fn pod(name: &str, node: &str, owner: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": owner}]},
            "spec": {"nodeName": node, "containers": []}, "status": status}))
        .unwrap()
    }

    #[test]
    fn stuck_containers_name_their_node_container_and_reason() {
        let pull = pod(
            "plugin-a",
            "node-a",
            "u1",
            json!({"containerStatuses": [{"name": "gpus", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope:1\""}}}]}),
        );
        let init = pod(
            "plugin-b",
            "node-b",
            "u1",
            json!({"initContainerStatuses": [{"name": "driver-validation", "ready": false, "restartCount": 4, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "no NVIDIA driver under /run/nvidia/driver"}}}]}),
        );
        let starting = pod(
            "plugin-c",
            "node-c",
            "u1",
            json!({"containerStatuses": [{"name": "gpus", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        let others = pod(
            "someone-else",
            "node-a",
            "u9",
            json!({"containerStatuses": [{"name": "x", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}),
        );
        let plugin = ds("u1");
        let found = of_daemonsets(&[&plugin], &[init, starting, others, pull]);
        let text: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "node node-a: pod plugin-a container gpus: ImagePullBackOff (Back-off pulling image \"nope:1\")",
                "node node-b: pod plugin-b container init:driver-validation: CrashLoopBackOff (no NVIDIA driver under /run/nvidia/driver)",
            ]
        );
        assert!(pods_unavailable(&plugin));
    }

    #[test]
    fn the_summary_names_a_few_and_counts_the_rest() {
        let failure = |i: usize| PodFailure {
            node: format!("node-{i}"),
            pod: format!("p-{i}"),
            container: "gpus".into(),
            reason: "ErrImagePull".into(),
            message: "x".repeat(500),
        };
        let all: Vec<_> = (0..5).map(failure).collect();
        let text = summary(&all).unwrap();
        assert!(
            text.starts_with("operand pods failing: node node-0: pod p-0"),
            "{text}"
        );
        assert!(text.ends_with("; and 2 more"), "{text}");
        assert_eq!(text.matches("ErrImagePull").count(), NAMED);
        assert!(shorten(&"y".repeat(500)).chars().count() <= MESSAGE_CHARS + 1);
        assert_eq!(summary(&[]), None);
    }
}
