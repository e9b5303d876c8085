//! Which of the node's GPUs are offered in shares, and what a prepared share hands a container.
//!
//! A GPUClass with a `shared` variant makes the plugin publish, beside each full GPU the class
//! admits, a device `gpu-<minor>-shared-<class>` of type `shared` that many claims may hold at
//! once: its `memory` capacity is the card's, and a claim that names no capacity consumes one
//! share of it (the request policy's default). The GPU and its shares consume one counter of the
//! GPU, so the scheduler never gives a whole-card claim a GPU whose shares are out, nor shares of
//! a GPU given whole. Pure functions; the GPUClass watch that feeds them is
//! [`crate::class_watch::follow_classes`].

use crate::devices::{DeviceKind, DeviceTable, Share, shared_name};
use crate::slices::slice_device;
use api::GPUClass;
use api::gpuclass::SharingStrategy;
use api::gpuclass::variants::{SharedOffer, shared_offer};

/// The shares to publish: for every full GPU with known memory, one per offer that admits it and
/// whose share fits the card. Offers are taken in the order given (the watch sorts them by class).
pub fn shares(table: &DeviceTable, offers: &[SharedOffer]) -> Vec<Share> {
    let mut out = Vec::new();
    for device in table.devices.values() {
        let DeviceKind::Gpu {
            memory_bytes: Some(card_bytes),
        } = device.kind
        else {
            continue;
        };
        let published = slice_device(device, table);
        for offer in offers.iter().filter(|o| o.admits(&published)) {
            let Some(share_bytes) = offer.share_bytes(card_bytes) else {
                continue;
            };
            out.push(Share {
                name: shared_name(&device.name, &offer.class),
                gpu: device.name.clone(),
                class: offer.class.clone(),
                card_bytes,
                share_bytes,
                strategy: offer.strategy,
            });
        }
    }
    out
}

/// `offered`, and beside them each share published before (`published`) that a prepared claim
/// still holds (`held`: device names) though no offer makes it now: a class's `shared` variant
/// removed or its selector narrowed must not take a share in use away, nor the counter that keeps
/// its card from being given whole, until its last claim is unprepared.
pub fn keep_held(
    mut offered: Vec<Share>,
    published: &[Share],
    held: &std::collections::BTreeSet<String>,
) -> Vec<Share> {
    for share in published {
        if held.contains(&share.name) && !offered.iter().any(|s| s.name == share.name) {
            offered.push(share.clone());
        }
    }
    offered
}

/// The share a published slice device is (the inverse of [`crate::slices::share_device`]), so a
/// restarted plugin knows the shares it published before; `None` for any other device.
pub fn published_share(device: &k8s_openapi::api::resource::v1::Device) -> Option<Share> {
    let attributes = device.attributes.as_ref()?;
    let text = |name: &str| attributes.get(name).and_then(|a| a.string.as_deref());
    if text("type")? != "shared" {
        return None;
    }
    let (gpu, class) = crate::devices::shared_parts(&device.name)?;
    let strategy = match text("sharing")? {
        "TimeSlicing" => SharingStrategy::TimeSlicing,
        "MPS" => SharingStrategy::Mps,
        _ => return None,
    };
    let memory = device.capacity.as_ref()?.get("memory")?;
    let bytes = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        api::gpuclass::variants::quantity_bytes(&q.0).and_then(|b| u64::try_from(b).ok())
    };
    Some(Share {
        name: device.name.clone(),
        gpu: gpu.to_owned(),
        class: class.to_owned(),
        card_bytes: bytes(&memory.value)?,
        share_bytes: bytes(memory.request_policy.as_ref()?.default.as_ref()?)?,
        strategy,
    })
}

/// The shared offers of `classes`, by class name; classes being deleted keep theirs until they
/// are gone (claims may still hold shares, and the counters must keep counting them). A class
/// the operator would refuse offers nothing.
pub fn offers<'a>(classes: impl IntoIterator<Item = &'a GPUClass>) -> Vec<SharedOffer> {
    let mut offers: Vec<SharedOffer> = classes
        .into_iter()
        .filter_map(|class| shared_offer(class).ok().flatten())
        .collect();
    offers.sort_by(|a, b| a.class.cmp(&b.class));
    offers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::table;
    use serde_json::json;

    fn class(name: &str, spec: serde_json::Value) -> GPUClass {
        serde_json::from_value(json!({
            "apiVersion": "gpu-operator-rs.dev/v1alpha1",
            "kind": "GPUClass",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn a_class_shares_the_cards_it_admits_and_a_share_too_large_shares_none() {
        let table = table(2);
        let product = &table.devices["gpu-0"].gpu.product_name;
        let classes = [
            class(
                "b-quarters",
                json!({"selector": {"productNames": [product]}, "variants": {"shared": {"shares": 4}}}),
            ),
            class(
                "a-huge",
                json!({"selector": {"productNames": [product]}, "variants": {"shared": {"memory": "1Ti"}}}),
            ),
            class(
                "c-other",
                json!({"selector": {"productNames": ["NVIDIA L4"]}, "variants": {"shared": {"shares": 2}}}),
            ),
            class("d-whole", json!({"selector": {"productNames": [product]}})),
        ];
        let offers = offers(&classes);
        assert_eq!(
            offers.iter().map(|o| o.class.as_str()).collect::<Vec<_>>(),
            ["a-huge", "b-quarters", "c-other"]
        );
        let shares = shares(&table, &offers);
        let names: Vec<_> = shares.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["gpu-0-shared-b-quarters", "gpu-1-shared-b-quarters"]
        );
        let card = shares[0].card_bytes;
        assert_eq!(shares[0].share_bytes, card / 4 / (1 << 20) * (1 << 20));
        assert_eq!(shares[0].gpu, "gpu-0");
    }
}
