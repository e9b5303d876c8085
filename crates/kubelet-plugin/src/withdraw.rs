//! At shutdown, the node's ResourceSlices go with the plugin when the node leaves the DRA plane.
//!
//! The kubelet removes a driver's slices itself, but only about 30 s after the plugin unregisters.
//! Until then the scheduler keeps allocating the node's GPUs from them: while the device plugin
//! hands the same GPUs out, or, when the node comes back to DRA soon, to the operands' claims,
//! whose pods then wait out the kubelet's backoff (a minute and more) for a plugin that had not
//! registered yet. A restart or an upgrade (the node still carries the DRA driver's deploy label)
//! keeps them, so running claims see no churn.

use std::collections::BTreeMap;

use api::contract::labels::DEPLOY_DRA_DRIVER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams};

/// Whether a node with `labels` has left the DRA plane: the DRA driver's deploy label is gone.
pub fn leaving_dra(labels: &BTreeMap<String, String>) -> bool {
    labels.get(DEPLOY_DRA_DRIVER).map(String::as_str) != Some("true")
}

/// Deletes `node`'s ResourceSlices of `driver` when the node has left the DRA plane; how many.
pub async fn withdraw_if_leaving(
    client: &kube::Client,
    node: &str,
    driver: &str,
) -> Result<usize, kube::Error> {
    let meta = Api::<Node>::all(client.clone()).get_metadata(node).await?;
    if !leaving_dra(&meta.metadata.labels.unwrap_or_default()) {
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
    fn only_a_node_without_the_dra_drivers_deploy_label_is_leaving() {
        let labels = |value: Option<&str>| {
            value
                .map(|v| BTreeMap::from([(DEPLOY_DRA_DRIVER.to_owned(), v.to_owned())]))
                .unwrap_or_default()
        };
        assert!(!leaving_dra(&labels(Some("true"))));
        assert!(leaving_dra(&labels(None)));
        assert!(leaving_dra(&labels(Some("false"))));
    }
}
