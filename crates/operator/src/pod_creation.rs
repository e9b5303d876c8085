//! Why an operand DaemonSet has fewer pods than it wants: the DaemonSet controller says so only in
//! `FailedCreate` Events (no PriorityClass of that name, a quota, an admission webhook), never in the
//! DaemonSet's status. Those messages are brought into the `GPUCluster` status.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// A `FailedCreate` older than this is history, not why pods are missing now (the DaemonSet
/// controller retries with a backoff of at most a few minutes and the Event's last time moves).
const RECENT: SignedDuration = SignedDuration::from_secs(10 * 60);

/// Whether `ds` has fewer pods than nodes it should run on.
pub fn pods_missing(ds: &DaemonSet) -> bool {
    ds.status
        .as_ref()
        .is_some_and(|s| s.current_number_scheduled < s.desired_number_scheduled)
}

/// When an Event was last seen: its series, its last timestamp, or when it happened.
fn last_seen(event: &Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
}

/// The message of the latest `FailedCreate` Event of DaemonSet `ds` seen within [`RECENT`] of `now`,
/// when the DaemonSet misses pods; `None` otherwise. Pure.
pub fn failure(ds: &DaemonSet, events: &[Event], now: Timestamp) -> Option<String> {
    if !pods_missing(ds) {
        return None;
    }
    events
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("FailedCreate")
                && e.involved_object.kind.as_deref() == Some("DaemonSet")
                && e.involved_object.name.as_deref() == Some(ds.name_any().as_str())
        })
        .filter_map(|e| Some((last_seen(e)?, e)))
        .filter(|(seen, _)| now.duration_since(*seen) <= RECENT)
        .max_by_key(|(seen, _)| *seen)
        .and_then(|(_, e)| e.message.clone())
}

/// `DaemonSet/<name> cannot create pods: <message>` for each of `daemonsets` that misses pods and
/// has a recent `FailedCreate` Event in `namespace`. One read of Events, and only when some
/// DaemonSet misses pods; a failed read is logged and yields nothing (the operand stays "not
/// ready" with its counts).
pub async fn failures(
    client: &kube::Client,
    namespace: &str,
    daemonsets: &[DaemonSet],
    now: Timestamp,
) -> Vec<String> {
    let missing: Vec<&DaemonSet> = daemonsets.iter().filter(|ds| pods_missing(ds)).collect();
    if missing.is_empty() {
        return Vec::new();
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields("involvedObject.kind=DaemonSet,reason=FailedCreate");
    let events = match events.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %e, "listing FailedCreate events failed");
            return Vec::new();
        }
    };
    missing
        .into_iter()
        .filter_map(|ds| {
            let message = failure(ds, &events, now)?;
            Some(format!(
                "DaemonSet/{} cannot create pods: {message}",
                ds.name_any()
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn ds(desired: i32, current: i32) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "nvidia-dra-driver-kubelet-plugin"},
            "status": {"desiredNumberScheduled": desired, "currentNumberScheduled": current,
                       "numberMisscheduled": 0, "numberReady": 0}
        }))
        .unwrap()
    }

    fn event(name: &str, reason: &str, message: &str, at: Timestamp) -> Event {
        let mut e: Event = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}.1")},
            "involvedObject": {"kind": "DaemonSet", "name": name},
            "reason": reason, "message": message
        }))
        .unwrap();
        e.last_timestamp = Some(Time(at));
        e
    }

    #[test]
    fn the_latest_recent_failed_create_of_that_daemonset_is_the_reason() {
        let now: Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        let ago = |mins: i64| now - SignedDuration::from_mins(mins);
        let plugin = "nvidia-dra-driver-kubelet-plugin";
        let events = [
            event(plugin, "FailedCreate", "older", ago(3)),
            event(
                plugin,
                "FailedCreate",
                "no PriorityClass with name gpu-high was found",
                ago(1),
            ),
            event(plugin, "SuccessfulCreate", "Created pod", ago(0)),
            event("nvidia-dcgm-exporter-dra", "FailedCreate", "other", ago(0)),
            event(plugin, "FailedCreate", "an hour ago", ago(60)),
        ];
        assert_eq!(
            failure(&ds(3, 1), &events, now).as_deref(),
            Some("no PriorityClass with name gpu-high was found")
        );
        // Every pod there: an old failure is history.
        assert_eq!(failure(&ds(3, 3), &events, now), None);
        // Pods missing but the only failure is stale: still starting, not failing.
        assert_eq!(failure(&ds(3, 1), &events[4..], now), None);
    }
}
