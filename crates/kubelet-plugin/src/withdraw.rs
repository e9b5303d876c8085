//! At shutdown, the node's ResourceSlices go with the plugin when the node leaves the DRA plane.
//!
//! The kubelet removes a driver's slices itself, but only about 30 s after the plugin unregisters.
//! Until then the scheduler keeps allocating the node's GPUs from them: while the device plugin
//! hands the same GPUs out, or, when the node comes back to DRA soon, to the operands' claims,
//! whose pods then wait out the kubelet's backoff (a minute and more) for a plugin that had not
//! registered yet. Leaving is the DRA driver's deploy label going away while the plugin ran; a
//! restart or an upgrade (the label stays) keeps the slices, so running claims see no churn, and so
//! does a plugin on a node that never had the label (run without the labeler).

use std::collections::BTreeMap;

use api::contract::labels::DEPLOY_DRA_DRIVER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams};

/// Whether a node with `labels` carries the DRA driver's deploy label.
pub fn deployed(labels: &BTreeMap<String, String>) -> bool {
    labels.get(DEPLOY_DRA_DRIVER).map(String::as_str) == Some("true")
}

/// Whether a node left the DRA plane while the plugin ran: it carried the deploy label when the
/// plugin started (`deployed_at_start`) and its labels now (`labels`) do not.
pub fn leaving_dra(deployed_at_start: bool, labels: &BTreeMap<String, String>) -> bool {
    deployed_at_start && !deployed(labels)
}

/// The labels of node `node`.
pub async fn node_labels(
    client: &kube::Client,
    node: &str,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let meta = Api::<Node>::all(client.clone()).get_metadata(node).await?;
    Ok(meta.metadata.labels.unwrap_or_default())
}

/// Deletes `node`'s ResourceSlices of `driver` when the node has left the DRA plane since the
/// plugin started (`deployed_at_start`); how many.
pub async fn withdraw_if_leaving(
    client: &kube::Client,
    node: &str,
    driver: &str,
    deployed_at_start: bool,
) -> Result<usize, kube::Error> {
    if !(deployed_at_start && leaving_dra(true, &node_labels(client, node).await?)) {
        return Ok(0);
    }
    let slices = Api::<ResourceSlice>::all(client.clone());
    let params =
        ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}"));
    let mut deleted = 0;
    for slice in slices.list(&params).await?.items {
        let Some(name) = slice.metadata.name else {
            continue;
        };
        match slices.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_leaves_only_when_the_label_it_had_at_start_is_gone() {
        let labels = |value: Option<&str>| {
            value
                .map(|v| BTreeMap::from([(DEPLOY_DRA_DRIVER.to_owned(), v.to_owned())]))
                .unwrap_or_default()
        };
        assert!(!leaving_dra(true, &labels(Some("true"))));
        assert!(leaving_dra(true, &labels(None)));
        assert!(leaving_dra(true, &labels(Some("false"))));
        // Never labelled (no labeler deploys it): a restart keeps the slices.
        assert!(!leaving_dra(false, &labels(None)));
        assert!(deployed(&labels(Some("true"))) && !deployed(&labels(None)));
    }
}
