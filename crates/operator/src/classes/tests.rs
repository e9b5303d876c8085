//! Derived DeviceClasses (snapshots) and what the status counts, on the slices the kubelet
//! plugin publishes for the mock GPUs (its own snapshots).

use std::sync::Arc;

use api::GPUClass;
use jiff::Timestamp;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::json;

use super::render::{self, device_class};
use api::gpuclass::variants::{self, Invalid};

fn class(spec: serde_json::Value) -> GPUClass {
    serde_json::from_value(json!({
        "apiVersion": "gpu-operator-rs.dev/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "a100", "uid": "c1a55-uid", "generation": 3},
        "spec": spec,
    }))
    .unwrap()
}

/// The plugin's published slices for a mock profile, renamed to `node`.
fn published(snapshot: &str, node: &str) -> Vec<ResourceSlice> {
    let yaml = snapshot
        .splitn(3, "---\n")
        .nth(2)
        .expect("an insta snapshot");
    let mut slices: Vec<ResourceSlice> = serde_yaml::from_str(yaml).unwrap();
    for slice in &mut slices {
        slice.spec.node_name = Some(node.to_owned());
    }
    slices
}

fn cluster() -> Vec<Arc<ResourceSlice>> {
    let mut slices = published(
        include_str!("../../../kubelet-plugin/tests/snapshots/slices_from_mock__eight_a100s.snap"),
        "node-a",
    );
    slices.extend(published(
        include_str!(
            "../../../kubelet-plugin/tests/snapshots/slices_from_mock__a100_mig_mixed_layout.snap"
        ),
        "node-b",
    ));
    slices.extend(published(
        include_str!("../../../kubelet-plugin/tests/snapshots/slices_from_mock__one_l4.snap"),
        "node-c",
    ));
    slices.into_iter().map(Arc::new).collect()
}

fn a100_whole_and_mig() -> GPUClass {
    class(json!({
        "selector": {"matchLabels": {"gpu-operator-rs.dev/device": "a100-sxm4-40gb"}},
        "variants": {"whole": {}, "mig": {"profiles": ["1g.5gb", "3g.20gb", "1g.5gb+me"]}},
    }))
}

#[test]
fn whole_and_mig_variants_derive_one_device_class_each() {
    let class = a100_whole_and_mig();
    let classes: Vec<_> = variants::variants(&class)
        .unwrap()
        .iter()
        .map(|v| device_class(&class, v, true))
        .collect();
    insta::assert_yaml_snapshot!(classes);
}

#[test]
fn a_class_names_its_own_extended_resource_and_none_without_the_field() {
    let class = class(json!({
        "selector": {"productNames": ["NVIDIA L4"], "minMemory": "20Gi", "minComputeCapability": "8.9"},
        "variants": {"whole": {"extendedResourceName": "example.com/inference"}},
    }));
    let whole = &variants::variants(&class).unwrap()[0];
    insta::assert_yaml_snapshot!(device_class(&class, whole, true));
    let without = device_class(&class, whole, false);
    assert_eq!(without.spec.extended_resource_name, None);
}

#[test]
fn the_status_counts_what_each_variant_matches_on_the_published_slices() {
    let class = a100_whole_and_mig();
    let variants = variants::variants(&class).unwrap();
    let status = render::status(&class, &variants, true, &cluster(), Timestamp::UNIX_EPOCH);
    let rows: Vec<_> = status
        .variants
        .iter()
        .map(|v| (v.name.as_str(), v.devices, v.nodes))
        .collect();
    // node-a: 8 whole A100s; node-b: 2 A100s in MIG mode with a 3g.20gb, a 2g.10gb and a 1g.5gb
    // each; node-c: an L4, which no variant offers.
    assert_eq!(
        rows,
        [
            ("whole", 8, 1),
            ("mig-1g.5gb", 2, 1),
            ("mig-3g.20gb", 2, 1),
            ("mig-1g.5gb-me", 0, 0)
        ]
    );
    assert_eq!(status.devices, 12);
    assert_eq!(
        status.extended_resource_names,
        [
            "gpu-operator-rs.dev/a100",
            "gpu-operator-rs.dev/a100-mig-1g.5gb",
            "gpu-operator-rs.dev/a100-mig-3g.20gb",
            "gpu-operator-rs.dev/a100-mig-1g.5gb-me"
        ]
    );
    let ready = &status.conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "DeviceClassesApplied")
    );
    assert!(
        ready
            .message
            .contains("no published device matches mig-1g.5gb-me"),
        "{}",
        ready.message
    );
    assert_eq!(status.observed_generation, Some(3));
}

#[test]
fn memory_and_compute_capability_select_like_the_cel() {
    let slices = cluster();
    let count = |selector: serde_json::Value| {
        let class = class(json!({"selector": selector}));
        let variants = variants::variants(&class).unwrap();
        render::status(&class, &variants, true, &slices, Timestamp::UNIX_EPOCH).devices
    };
    assert_eq!(
        count(json!({"minMemory": "40Gi"})),
        8,
        "the A100s' 40Gi, not the L4's"
    );
    assert_eq!(count(json!({"minMemory": "20G"})), 9, "the L4 has 22.5 GB");
    assert_eq!(count(json!({"minMemory": "80Gi"})), 0);
    assert_eq!(
        count(json!({"minComputeCapability": "8.9"})),
        1,
        "only the L4 (8.9)"
    );
    assert_eq!(count(json!({"minComputeCapability": "8.0"})), 9);
    assert_eq!(
        count(json!({"matchLabels": {"gpu-operator-rs.dev/architecture": "ampere"}})),
        8
    );
    assert_eq!(
        count(json!({"productNames": ["NVIDIA L4", "NVIDIA A100-SXM4-40GB"]})),
        9
    );
}

#[test]
fn the_same_inputs_give_the_same_status_so_an_idle_class_is_not_written() {
    let mut class = a100_whole_and_mig();
    let variants = variants::variants(&class).unwrap();
    let first = render::status(&class, &variants, true, &cluster(), Timestamp::UNIX_EPOCH);
    class.status = Some(first.clone());
    let later = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(3600);
    assert_eq!(
        render::status(&class, &variants, true, &cluster(), later),
        first
    );
}

#[test]
fn a_class_the_schema_let_through_is_refused_naming_the_field() {
    let class = class(json!({"selector": {"minMemory": "1e3"}}));
    let err: Invalid = variants::variants(&class).unwrap_err();
    assert_eq!(err.field, "selector.minMemory");
    assert!(
        err.to_string()
            .starts_with("GPUClass a100: selector.minMemory: 1e3"),
        "{err}"
    );
    let status = render::invalid_status(&class, &err, Timestamp::UNIX_EPOCH);
    assert_eq!(status.conditions[0].reason, "InvalidSpec");
    assert!(status.device_class_names.is_empty());
}

#[test]
fn a_shared_variant_derives_a_device_class_of_shares_with_the_sharing_config() {
    let class = class(json!({
        "selector": {"matchLabels": {"gpu-operator-rs.dev/device": "a100-sxm4-40gb"}},
        "variants": {"whole": {}, "shared": {"shares": 4, "strategy": "MPS"}},
    }));
    let variants = variants::variants(&class).unwrap();
    let shared = variants.iter().find(|v| v.name == "shared").unwrap();
    insta::assert_yaml_snapshot!(device_class(&class, shared, true));
    let offer = variants::shared_offer(&class).unwrap().unwrap();
    assert_eq!(offer.size, variants::ShareSize::Count(4));
    // A 40 GiB card in four: 10 GiB each; a fifth does not fit.
    assert_eq!(offer.share_bytes(40 << 30), Some(10 << 30));
    let by_memory = self::class(json!({
        "selector": {"productNames": ["NVIDIA A100-SXM4-40GB"]},
        "variants": {"shared": {"memory": "50Gi"}},
    }));
    let offer = variants::shared_offer(&by_memory).unwrap().unwrap();
    assert_eq!(
        offer.share_bytes(40 << 30),
        None,
        "a share larger than the card"
    );
    assert_eq!(offer.share_bytes(80 << 30), Some(50 << 30));
}

#[test]
fn a_shared_variant_no_card_is_published_for_says_when_cards_get_shares() {
    let class = class(json!({
        "selector": {"matchLabels": {"gpu-operator-rs.dev/device": "a100-sxm4-40gb"}},
        "variants": {"whole": {}, "shared": {"memory": "30Gi"}},
    }));
    let variants = variants::variants(&class).unwrap();
    let status = render::status(&class, &variants, true, &cluster(), Timestamp::UNIX_EPOCH);
    let rows: Vec<_> = status
        .variants
        .iter()
        .map(|v| (v.name.as_str(), v.devices))
        .collect();
    assert_eq!(rows, [("whole", 8), ("shared", 0)]);
    let ready = &status.conditions[0];
    assert!(
        ready.message.contains("no published device matches shared"),
        "{}",
        ready.message
    );
    assert!(
        ready.message.contains("one share fits its memory"),
        "{}",
        ready.message
    );
}

#[test]
fn an_extended_resource_another_class_holds_is_refused_naming_that_class() {
    let older = class(json!({
        "selector": {"productNames": ["NVIDIA L4"]},
        "variants": {"whole": {"extendedResourceName": "example.com/inference"}},
    }));
    let mut held = device_class(&older, &variants::variants(&older).unwrap()[0], true);
    held.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(api::gpuclass::CLASS_LABEL.into(), "l4".into());
    held.metadata.name = Some("l4.gpu-operator-rs.dev".into());
    held.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::UNIX_EPOCH,
    ));
    let derived = [Arc::new(held.clone())];
    // Class a100 asks the same resource: refused, naming class l4 and its DeviceClass.
    let variants = variants::variants(&older).unwrap();
    let taken = render::resource_taken(&older, &variants, &derived).unwrap();
    assert_eq!(taken.field, "variants");
    assert!(
        taken
            .reason
            .contains("already GPUClass l4's (DeviceClass l4.gpu-operator-rs.dev)"),
        "{}",
        taken.reason
    );
    // A resource no other class maps is free.
    let other = class(json!({"selector": {"productNames": ["NVIDIA L4"]}}));
    assert_eq!(
        render::resource_taken(&other, &variants::variants(&other).unwrap(), &derived),
        None
    );
    // Both hold a DeviceClass for it: the older DeviceClass keeps it.
    let mut ours = device_class(&older, &variants[0], true);
    ours.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::from_second(60).unwrap(),
    ));
    let both = [Arc::new(held), Arc::new(ours)];
    assert!(
        render::resource_taken(&older, &variants, &both).is_some(),
        "the younger one yields"
    );
}
