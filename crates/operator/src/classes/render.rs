//! Pure: the DeviceClasses a `GPUClass` derives, and the status that reports them.

use std::collections::BTreeSet;
use std::sync::Arc;

use api::GPUClass;
use api::contract::DRIVER_NAME;
use api::gpuclass::{CLASS_LABEL, GPUClassStatus, SharingStrategy, VariantStatus};
use jiff::Timestamp;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassConfiguration, DeviceClassSpec, DeviceSelector,
    OpaqueDeviceConfiguration, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::{Resource, ResourceExt};

use api::gpuclass::variants::{Invalid, Variant};

/// `app.kubernetes.io/managed-by` of derived DeviceClasses (not the GPUCluster's `gpu-operator`,
/// so the GPUCluster controller neither watches nor prunes them).
pub const MANAGED_BY: &str = "gpu-class-controller";

/// The DeviceClass of `variant`, owned by `class`. `extended_resources`: whether the apiserver
/// serves `spec.extendedResourceName`.
pub fn device_class(class: &GPUClass, variant: &Variant, extended_resources: bool) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(variant.device_class.clone()),
            labels: Some(
                [
                    ("app.kubernetes.io/managed-by", MANAGED_BY),
                    (CLASS_LABEL, class.name_any().as_str()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ),
            owner_references: class.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: variant.cel(),
                }),
            }]),
            extended_resource_name: extended_resources.then(|| variant.extended_resource.clone()),
            config: variant
                .sharing
                .map(|strategy| vec![sharing_config(strategy)]),
        },
    }
}

/// The driver's opaque `GpuConfig` that tells the plugin how the pods on a shared card are kept
/// apart; each pod's part of the card comes from the capacity its claim consumed.
fn sharing_config(strategy: SharingStrategy) -> DeviceClassConfiguration {
    DeviceClassConfiguration {
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER_NAME.to_owned(),
            parameters: RawExtension(serde_json::json!({
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": strategy},
            })),
        }),
    }
}

/// The first variant of `class` whose extended resource another class's DeviceClass already maps,
/// as the reason to refuse the class; `None` when every resource is free. Of two classes that
/// both hold a DeviceClass for one resource, the one whose DeviceClass is older (then whose name
/// sorts first) keeps it.
pub fn resource_taken(
    class: &GPUClass,
    variants: &[Variant],
    derived: &[Arc<DeviceClass>],
) -> Option<Invalid> {
    let name = class.name_any();
    let age = |d: &DeviceClass| {
        (
            d.metadata.creation_timestamp.clone().map(|t| t.0),
            d.name_any(),
        )
    };
    variants.iter().find_map(|variant| {
        let maps = |d: &&Arc<DeviceClass>| {
            d.spec.extended_resource_name.as_deref() == Some(variant.extended_resource.as_str())
        };
        let ours = derived
            .iter()
            .filter(maps)
            .find(|d| d.labels().get(CLASS_LABEL) == Some(&name));
        let theirs = derived
            .iter()
            .filter(maps)
            .filter(|d| d.labels().get(CLASS_LABEL) != Some(&name))
            .find(|d| ours.is_none_or(|o| age(d) < age(o)))?;
        let holder = theirs.labels().get(CLASS_LABEL).cloned().unwrap_or_default();
        Some(Invalid {
            class: name.clone(),
            field: "variants",
            reason: format!(
                "extended resource {} of variant {} is already GPUClass {holder}'s (DeviceClass {}); \
                 give this variant another extendedResourceName",
                variant.extended_resource,
                variant.name,
                theirs.name_any()
            ),
        })
    })
}

/// Whether the live DeviceClass already is what `want` says (spec, our labels, owner).
pub fn up_to_date(live: &DeviceClass, want: &DeviceClass) -> bool {
    let labels_kept = want
        .labels()
        .iter()
        .all(|(k, v)| live.labels().get(k) == Some(v));
    live.spec == want.spec
        && labels_kept
        && live.metadata.owner_references == want.metadata.owner_references
}

/// Devices and nodes of `slices` that `variant` matches.
fn matched(variant: &Variant, slices: &[Arc<ResourceSlice>]) -> (i64, i64) {
    let mut devices = 0;
    let mut nodes = BTreeSet::new();
    for slice in slices {
        let spec = &slice.spec;
        for device in spec.devices.iter().flatten() {
            if variant.matches(&spec.driver, device) {
                devices += 1;
                nodes.insert(spec.node_name.clone().unwrap_or_default());
            }
        }
    }
    (devices, i64::try_from(nodes.len()).unwrap_or(i64::MAX))
}

fn ready(status: bool, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// Keeps the previous transition time of a condition whose status did not change.
fn with_transition(
    mut condition: Condition,
    previous: Option<&GPUClassStatus>,
    now: Timestamp,
) -> Condition {
    let before = previous
        .into_iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == condition.type_);
    condition.last_transition_time = match before {
        Some(b) if b.status == condition.status => b.last_transition_time.clone(),
        _ => Time(now),
    };
    condition
}

/// The status of a class whose DeviceClasses are in place: names, and what each variant matches
/// in the published `slices` now.
pub fn status(
    class: &GPUClass,
    variants: &[Variant],
    extended_resources: bool,
    slices: &[Arc<ResourceSlice>],
    now: Timestamp,
) -> GPUClassStatus {
    let generation = class.metadata.generation;
    let rows: Vec<VariantStatus> = variants
        .iter()
        .map(|v| {
            let (devices, nodes) = matched(v, slices);
            VariantStatus {
                name: v.name.clone(),
                device_class_name: v.device_class.clone(),
                extended_resource_name: extended_resources.then(|| v.extended_resource.clone()),
                devices,
                nodes,
            }
        })
        .collect();
    let unmatched: Vec<&str> = rows
        .iter()
        .filter(|r| r.devices == 0)
        .map(|r| r.name.as_str())
        .collect();
    let mut message = if unmatched.is_empty() {
        "every variant matches published devices".to_owned()
    } else {
        format!(
            "no published device matches {}: check the selector against `kubectl get resourceslices -o yaml`",
            unmatched.join(", ")
        )
    };
    if unmatched.contains(&"shared") {
        message.push_str(
            "; a card is published in shares only when one share fits its memory and the \
             apiserver serves DRAConsumableCapacity and DRAPartitionableDevices",
        );
    }
    if !extended_resources {
        message.push_str(
            "; the apiserver does not serve DeviceClass extendedResourceName \
             (DRAExtendedResource), so pods ask through claims of the DeviceClasses",
        );
    }
    let condition = ready(true, "DeviceClassesApplied", message, generation);
    GPUClassStatus {
        observed_generation: generation,
        device_class_names: rows.iter().map(|r| r.device_class_name.clone()).collect(),
        extended_resource_names: rows
            .iter()
            .filter_map(|r| r.extended_resource_name.clone())
            .collect(),
        devices: rows.iter().map(|r| r.devices).sum(),
        conditions: vec![with_transition(condition, class.status.as_ref(), now)],
        variants: rows,
    }
}

/// The status of a class the operator cannot derive DeviceClasses from.
pub fn invalid_status(class: &GPUClass, invalid: &Invalid, now: Timestamp) -> GPUClassStatus {
    let generation = class.metadata.generation;
    let condition = ready(false, "InvalidSpec", invalid.to_string(), generation);
    GPUClassStatus {
        observed_generation: generation,
        conditions: vec![with_transition(condition, class.status.as_ref(), now)],
        ..GPUClassStatus::default()
    }
}

/// The status of a class being deleted while `claims` still use its DeviceClasses.
pub fn blocked_status(class: &GPUClass, claims: &[String], now: Timestamp) -> GPUClassStatus {
    let message = format!(
        "being deleted: its DeviceClasses stay while {} ResourceClaim(s) use them ({}); \
         delete those claims or the pods that made them",
        claims.len(),
        claims.join(", ")
    );
    let mut status = class.status.clone().unwrap_or_default();
    let condition = ready(false, "InUse", message, class.metadata.generation);
    status.conditions = vec![with_transition(condition, class.status.as_ref(), now)];
    status
}
