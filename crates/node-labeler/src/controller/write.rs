//! Writing a node's plan: a merge patch guarded by the resourceVersion it was planned from,
//! planned again from a fresh read when another writer got there first.

use std::collections::BTreeMap;

use api::contract::labels as l;
use k8s_openapi::api::core::v1::Node;
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::FIELD_MANAGER;
use super::error::Error;
use super::metrics::Metrics;
use crate::claims;
use crate::plan::{GpuClaims, NodeFacts, Plan};

/// The merge patch for a plan, guarded by the resourceVersion the plan was made from.
pub fn patch_body(plan: &Plan, resource_version: Option<&str>) -> Value {
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    if !plan.labels.is_empty() {
        metadata["labels"] = json!(plan.labels);
    }
    if !plan.annotations.is_empty() {
        metadata["annotations"] = json!(plan.annotations);
    }
    json!({ "metadata": metadata })
}

pub(super) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// How many times a write that conflicted is planned again from a fresh read before the node is
/// left to the controller's requeue.
const CONFLICT_RETRIES: usize = 3;

/// Writes `plan`, guarded by the resourceVersion of the copy it was made from. On a conflict
/// (another writer changed the node since that copy) the node is read afresh and planned again
/// with `replan` from the same facts, at once and at most [`CONFLICT_RETRIES`] times, instead of
/// waiting for the watch to bring the newer copy. A fresh read whose hand-over record differs from
/// the one this round decided on ends the retries: the next round decides again.
pub(super) async fn write_plan(
    client: &kube::Client,
    metrics: &Metrics,
    node: &PartialObjectMeta<Node>,
    plan: Plan,
    mut facts: NodeFacts,
    replan: impl Fn(&BTreeMap<String, String>, &BTreeMap<String, String>, NodeFacts) -> Plan,
) -> Result<(), Error> {
    let name = node.name_any();
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = patch_params();
    let record = node.annotations().get(l::HANDOVER).cloned();
    let (mut plan, mut version) = (plan, node.resource_version());
    let mut attempt = 0;
    loop {
        let body = patch_body(&plan, version.as_deref());
        let source = match nodes.patch_metadata(&name, &pp, &Patch::Merge(&body)).await {
            Ok(_) => {
                metrics.count_write();
                tracing::info!(node = %name, labels = ?plan.labels, annotations = ?plan.annotations, "node updated");
                return Ok(());
            }
            Err(source) => source,
        };
        let conflict = matches!(&source, kube::Error::Api(status) if status.code == 409);
        if !conflict || attempt == CONFLICT_RETRIES {
            return Err(Error::Patch { node: name, source });
        }
        metrics.count_error("conflict");
        let fresh = nodes
            .get_metadata(&name)
            .await
            .map_err(|source| Error::Patch {
                node: name.clone(),
                source,
            })?;
        if fresh.annotations().get(l::HANDOVER) != record.as_ref() {
            return Err(Error::Patch { node: name, source });
        }
        tracing::debug!(node = %name, attempt, "node changed while planning; planning again from a fresh read");
        plan = replan(fresh.labels(), fresh.annotations(), facts);
        if let Some(plane) = plan.needs_claim_lookup
            && facts.claims == GpuClaims::Unknown
        {
            facts.claims = claims::on_node(client, &name, plane).await;
            plan = replan(fresh.labels(), fresh.annotations(), facts);
        }
        if !plan.has_changes() {
            return Ok(());
        }
        version = fresh.resource_version();
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Hold, ReadyPlanes};

    #[test]
    fn patch_sets_and_removes_only_planned_keys_guarded_by_resource_version() {
        let plan = Plan {
            labels: BTreeMap::from([
                ("a".to_string(), Some("true".to_string())),
                ("b".to_string(), None),
            ]),
            ..Plan::default()
        };
        assert_eq!(
            patch_body(&plan, Some("42")),
            json!({"metadata": {"resourceVersion": "42", "labels": {"a": "true", "b": null}}})
        );
    }

    /// The requests a fake API saw (method, resourceVersion or `-` for a read), and its node.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

    /// An API whose node `n` answers every PATCH with `conflicts` 409s before it takes one, and
    /// every GET with `fresh` (resourceVersion 43).
    fn conflicting_api(conflicts: usize, fresh: Value) -> (kube::Client, Seen) {
        use http::{Method, StatusCode};
        use service::fake_api::{client, failure, reply};
        let seen = Seen::default();
        let log = seen.clone();
        let client = client("default", move |method, path, body| {
            assert_eq!(path, "/api/v1/nodes/n");
            let mut log = log.lock().unwrap();
            if method == Method::GET {
                log.push("GET".into());
                return reply(StatusCode::OK, &fresh);
            }
            let body: Value = serde_json::from_slice(body).unwrap();
            log.push(format!("PATCH {}", body["metadata"]));
            let patches = log.iter().filter(|r| r.starts_with("PATCH")).count();
            if patches <= conflicts {
                return failure(
                    StatusCode::CONFLICT,
                    "Conflict",
                    "the object has been modified",
                );
            }
            reply(StatusCode::OK, &fresh)
        });
        (client, seen)
    }

    fn meta(version: &str, labels: Value, annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n",
               "resourceVersion": version, "labels": labels, "annotations": annotations}})
    }

    /// Plans `want=yes` unless the node has it, as the planner plans only what differs.
    fn replan(
        labels: &BTreeMap<String, String>,
        _: &BTreeMap<String, String>,
        _: NodeFacts,
    ) -> Plan {
        let mut plan = Plan::default();
        if labels.get("want").map(String::as_str) != Some("yes") {
            plan.labels.insert("want".into(), Some("yes".into()));
        }
        plan
    }

    fn facts() -> NodeFacts {
        NodeFacts {
            claims: GpuClaims::None,
            ready: ReadyPlanes::default(),
            pinned: None,
            hold: Hold::No,
            operands: Default::default(),
        }
    }

    async fn write(client: &kube::Client, cached: Value) -> Result<(), Error> {
        let node: PartialObjectMeta<Node> = serde_json::from_value(cached).unwrap();
        let plan = replan(node.labels(), node.annotations(), facts());
        write_plan(client, &Metrics::default(), &node, plan, facts(), replan).await
    }

    #[tokio::test]
    async fn a_conflicting_write_is_planned_again_from_a_fresh_read_at_once() {
        // Another writer added a label after the cache's copy (42) was taken.
        let fresh = meta("43", json!({"other": "x"}), json!({}));
        let (client, seen) = conflicting_api(1, fresh);
        write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                r#"PATCH {"labels":{"want":"yes"},"resourceVersion":"42"}"#,
                "GET",
                r#"PATCH {"labels":{"want":"yes"},"resourceVersion":"43"}"#,
            ]
        );
    }

    #[tokio::test]
    async fn a_fresh_read_that_already_shows_the_change_writes_nothing_more() {
        let (client, seen) = conflicting_api(1, meta("43", json!({"want": "yes"}), json!({})));
        write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap();
        assert_eq!(seen.lock().unwrap().len(), 2, "{seen:?}");
    }

    #[tokio::test]
    async fn conflicts_are_retried_a_bounded_number_of_times() {
        let (client, seen) = conflicting_api(usize::MAX, meta("43", json!({}), json!({})));
        let error = write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::Patch { source: kube::Error::Api(ref s), .. } if s.code == 409)
        );
        let patches = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("PATCH"))
            .count();
        assert_eq!(patches, CONFLICT_RETRIES + 1);
    }

    #[tokio::test]
    async fn a_hand_over_record_changed_meanwhile_ends_the_retries() {
        let moved = json!({l::HANDOVER: "{}"});
        let (client, seen) = conflicting_api(1, meta("43", json!({}), moved));
        let error = write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Patch { .. }), "{error}");
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "a read, no second write: {seen:?}"
        );
    }
}
