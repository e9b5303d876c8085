//! How Events and reasons name pods.

use k8s_openapi::api::core::v1::Pod;

/// Pods named in a reason for people at most.
const NAMED_PODS: usize = 5;

/// `namespace/name` of a pod, as Events and reasons name it.
pub fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The first few of `pods`, and how many more there are: `a, b and 3 more`.
pub fn named(pods: &[String]) -> String {
    let mut text = pods[..pods.len().min(NAMED_PODS)].join(", ");
    if pods.len() > NAMED_PODS {
        text.push_str(&format!(" and {} more", pods.len() - NAMED_PODS));
    }
    text
}
