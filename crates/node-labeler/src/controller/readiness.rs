//! Whether a plane whose validator is Ready also offers every GPU of the node, before the node
//! gets that plane's readiness label.

use std::collections::BTreeMap;

use api::AllocationMode;
use api::contract::labels as l;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;

use super::context::Context;
use super::error::Error;
use crate::offers;
use crate::plan::ReadyPlanes;

/// Keeps a plane's validator-ready flag only while the plane offers every GPU of the node (see
/// [`crate::offers`]), checked while the node does not carry that plane's readiness label yet.
/// The second value says a check held a plane back, so the node is looked at again soon.
pub(super) async fn confirm_offers(
    ctx: &Context,
    name: &str,
    labels: &BTreeMap<String, String>,
    mut ready: ReadyPlanes,
) -> Result<(ReadyPlanes, bool), Error> {
    let wanted = offers::gpu_count(labels);
    let labelled = |plane: AllocationMode| {
        labels.get(l::GPU_STACK).map(String::as_str) == Some(plane.as_str())
    };
    let err = |plane| {
        let node = name.to_owned();
        move |source| Error::Offers {
            plane,
            node,
            source,
        }
    };
    let mut held = false;
    if ready.dra && !labelled(AllocationMode::Dra) {
        let selector = format!(
            "spec.nodeName={name},spec.driver={}",
            api::contract::DRIVER_NAME
        );
        let slices = Api::<ResourceSlice>::all(ctx.client.clone())
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(err(AllocationMode::Dra))?;
        if offers::published_gpus(&slices.items, name) < wanted {
            ready.dra = false;
            held = true;
        }
    }
    if ready.device_plugin && !labelled(AllocationMode::DevicePlugin) {
        let node = Api::<Node>::all(ctx.client.clone())
            .get(name)
            .await
            .map_err(err(AllocationMode::DevicePlugin))?;
        if offers::allocatable_gpus(&node) < wanted {
            ready.device_plugin = false;
            held = true;
        }
    }
    Ok((ready, held))
}
