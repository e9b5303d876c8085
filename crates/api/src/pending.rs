//! Why a pod waits for GPUs: the claims it asks our DeviceClasses' devices through, how many of
//! them each node publishes and how many are taken, or the DeviceClass it names that does not
//! exist. Pure: the operator tells it in a Warning Event on pods the scheduler gave up on, and
//! `kubectl gpu why` on demand.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use crate::GPUClass;
use crate::contract::{DRIVER_NAME, objects as o};
use crate::gpuclass::variants::{Criterion, variants};

/// What one of our DeviceClasses selects, as conditions on a `gpu.nvidia.com` device: the
/// built-in classes by `type`, a GPUClass's by its variant's criteria; `None` for any other class.
pub fn selection(class: &str, gpu_classes: &[GPUClass]) -> Option<Vec<Criterion>> {
    let builtin = match class {
        o::DEVICE_CLASS_GPU => Some("gpu"),
        o::DEVICE_CLASS_MIG => Some("mig"),
        o::DEVICE_CLASS_VFIO => Some("vfio"),
        _ => None,
    };
    if let Some(kind) = builtin {
        return Some(vec![Criterion::Type(kind)]);
    }
    gpu_classes
        .iter()
        .filter_map(|c| variants(c).ok())
        .flatten()
        .find(|v| v.device_class == class)
        .map(|v| v.criteria)
}

/// Whether the scheduler tried the pod and found no node for it.
pub fn unschedulable(pod: &Pod) -> bool {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    !bound
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
}

/// The DeviceClasses a claim asks devices of, with how many (a request for all devices of a
/// class counts one; of alternatives, each counts its own).
pub fn classes_wanted(claim: &ResourceClaim) -> BTreeMap<String, i64> {
    let requests = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref());
    let mut wanted = BTreeMap::new();
    for r in requests.into_iter().flatten() {
        let exact = r
            .exactly
            .iter()
            .map(|e| (e.device_class_name.clone(), e.count.unwrap_or(1)));
        let alternatives = r
            .first_available
            .iter()
            .flatten()
            .map(|s| (s.device_class_name.clone(), s.count.unwrap_or(1)));
        for (class, count) in exact.chain(alternatives) {
            *wanted.entry(class).or_insert(0) += count.max(1);
        }
    }
    wanted
}

/// Devices of one type per node: `(published, allocated)`.
pub type Supply = BTreeMap<String, (usize, usize)>;

/// How many devices meeting `selection` each node publishes for our driver, and how many of them
/// claims hold (admin access holds none).
pub fn supply(
    selection: &[Criterion],
    slices: &[ResourceSlice],
    claims: &[ResourceClaim],
) -> Supply {
    let mut published: BTreeSet<(String, String)> = BTreeSet::new();
    for slice in slices.iter().filter(|s| s.spec.driver == DRIVER_NAME) {
        let Some(node) = slice.spec.node_name.as_ref() else {
            continue;
        };
        for device in slice.spec.devices.iter().flatten() {
            if selection.iter().all(|c| c.matches(device)) {
                published.insert((node.clone(), device.name.clone()));
            }
        }
    }
    let allocated: BTreeSet<(String, String)> = claims
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        // Admin access (the DCGM exporter's claims) reaches devices without taking them.
        .filter(|r| r.driver == DRIVER_NAME && r.admin_access != Some(true))
        .map(|r| (r.pool.clone(), r.device.clone()))
        .filter(|key| published.contains(key))
        .collect();
    let mut supply = Supply::new();
    for (node, device) in &published {
        let entry = supply.entry(node.clone()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(allocated.contains(&(node.clone(), device.clone())));
    }
    supply
}

/// Nodes named in a note at most.
const NAMED_NODES: usize = 10;

/// What the Event says about one class the pod's claims ask `wanted` devices of.
pub fn note(class: &str, wanted: i64, supply: &Supply) -> String {
    if supply.is_empty() {
        return format!(
            "no node publishes devices of DeviceClass {class}: no GPU node with such devices is \
             on the dra plane (see the GPUCluster's GPUNodesUnserved condition and the nodes' \
             {} label)",
            crate::contract::labels::ALLOCATION_MODE
        );
    }
    let (total, taken) = supply
        .values()
        .fold((0, 0), |(t, a), (n, m)| (t + n, a + m));
    let mut each: Vec<String> = supply
        .iter()
        .take(NAMED_NODES)
        .map(|(node, (n, m))| format!("{node}: {m} of {n} allocated"))
        .collect();
    if supply.len() > NAMED_NODES {
        each.push(format!("and {} more", supply.len() - NAMED_NODES));
    }
    let nodes = if supply.len() == 1 {
        "node publishes"
    } else {
        "nodes publish"
    };
    let head = format!(
        "{} {nodes} devices of DeviceClass {class} ({})",
        supply.len(),
        each.join(", ")
    );
    let free = total - taken;
    let are = if free == 1 { "is" } else { "are" };
    if free == 0 {
        format!(
            "{head}; every one is allocated. Free a device, or move more GPU nodes to the dra plane"
        )
    } else if i64::try_from(free).unwrap_or(i64::MAX) < wanted {
        format!(
            "{head}; {free} {are} free and the pod's claims ask {wanted}. Free devices, or move \
             more GPU nodes to the dra plane"
        )
    } else {
        format!(
            "{head}; {free} {are} free, but the claim's selectors or the pod's node constraints \
             rule them out"
        )
    }
}

/// What the Event says of a class the claims name that does not exist: the GPU classes there
/// are (`ours`), the closest first when it is a near miss.
pub fn missing_note(class: &str, ours: &[String]) -> String {
    let near = ours
        .iter()
        .map(|c| (edit_distance(class, c), c))
        .filter(|(d, _)| *d <= 3)
        .min();
    let hint = near.map_or(String::new(), |(_, c)| format!(" (did you mean {c}?)"));
    format!(
        "DeviceClass {class} does not exist{hint}; the GPU DeviceClasses here: {}",
        ours.join(", ")
    )
}

/// Levenshtein distance of two short names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// What the cluster holds that an explanation reads.
#[derive(Clone, Copy, Debug)]
pub struct World<'a> {
    /// Names of the DeviceClasses there are.
    pub device_classes: &'a [String],
    /// The GPUClasses (each derives DeviceClasses of ours).
    pub gpu_classes: &'a [GPUClass],
    /// ResourceSlices of our driver.
    pub slices: &'a [ResourceSlice],
    /// Every ResourceClaim (the allocated ones count as taken devices).
    pub claims: &'a [ResourceClaim],
}

/// Why a pod waits: the Event's reason and one note per class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// `DeviceClassNotFound` when a claim names a class that does not exist, else
    /// `GPUsUnavailable`.
    pub reason: &'static str,
    /// One sentence per DeviceClass asked for, the missing ones first.
    pub notes: Vec<String>,
}

/// Whether any of the pod's claims is still unallocated and asks a DeviceClass for devices (only
/// then is there something to explain).
pub fn waits_for_devices(pod_claims: &[ResourceClaim]) -> bool {
    pod_claims
        .iter()
        .any(|c| unallocated(c) && !classes_wanted(c).is_empty())
}

fn unallocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .is_none()
}

/// Why a pod whose claims are `pod_claims` waits for devices of our classes, or `None` when its
/// unallocated claims ask none of ours and name no missing class.
pub fn explain(pod_claims: &[ResourceClaim], world: World<'_>) -> Option<Explanation> {
    let mut classes: BTreeMap<String, i64> = BTreeMap::new();
    for claim in pod_claims.iter().filter(|c| unallocated(c)) {
        for (class, count) in classes_wanted(claim) {
            *classes.entry(class).or_insert(0) += count;
        }
    }
    let ours: Vec<String> = world
        .device_classes
        .iter()
        .filter(|c| selection(c, world.gpu_classes).is_some())
        .cloned()
        .collect();
    let mut missing = Vec::new();
    let mut supplied = Vec::new();
    for (class, wanted) in &classes {
        if !world.device_classes.contains(class) {
            missing.push(missing_note(class, &ours));
        } else if let Some(criteria) = selection(class, world.gpu_classes) {
            let supply = supply(&criteria, world.slices, world.claims);
            supplied.push(note(class, *wanted, &supply));
        }
    }
    let reason = if missing.is_empty() {
        "GPUsUnavailable"
    } else {
        "DeviceClassNotFound"
    };
    let notes: Vec<String> = missing.into_iter().chain(supplied).collect();
    (!notes.is_empty()).then_some(Explanation { reason, notes })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(node: &str, devices: &[(&str, &str)]) -> ResourceSlice {
        let devices: Vec<_> = devices
            .iter()
            .map(|(name, kind)| json!({"name": name, "attributes": {"type": {"string": kind}}}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": format!("{node}-0")},
            "spec": {"driver": DRIVER_NAME, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}))
        .unwrap()
    }

    fn claim(class: &str, allocated: &[(&str, &str)]) -> ResourceClaim {
        let results: Vec<_> = allocated
            .iter()
            .map(|(pool, device)| json!({"request": "gpu", "driver": DRIVER_NAME, "pool": pool, "device": device}))
            .collect();
        let mut claim = json!({"metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": class}},
                {"name": "other", "firstAvailable": [{"name": "a", "deviceClassName": "example.com"}]}]}}});
        if !results.is_empty() {
            claim["status"] = json!({"allocation": {"devices": {"results": results}}});
        }
        serde_json::from_value(claim).unwrap()
    }

    #[test]
    fn every_class_a_claim_names_is_wanted_and_ours_are_told_apart() {
        let wanted = classes_wanted(&claim(o::DEVICE_CLASS_MIG, &[]));
        assert_eq!(
            wanted,
            BTreeMap::from([
                ("example.com".to_owned(), 1),
                (o::DEVICE_CLASS_MIG.to_owned(), 1)
            ])
        );
        let h100: GPUClass = serde_json::from_value(json!({
            "apiVersion": "gpu-operator-rs.dev/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": "h100"},
            "spec": {"selector": {"productNames": ["NVIDIA H100 80GB HBM3"]}}}))
        .unwrap();
        assert!(selection("example.com", &[]).is_none());
        assert_eq!(
            selection(o::DEVICE_CLASS_MIG, &[]),
            Some(vec![Criterion::Type("mig")])
        );
        let of_class = selection("h100.gpu-operator-rs.dev", &[h100]).expect("a GPUClass's class");
        assert!(of_class.contains(&Criterion::Type("gpu")), "{of_class:?}");
    }

    #[test]
    fn a_missing_class_is_named_with_the_closest_of_ours() {
        let ours = [
            o::DEVICE_CLASS_GPU.to_owned(),
            o::DEVICE_CLASS_MIG.to_owned(),
        ];
        assert_eq!(
            missing_note("gpu.nvidia.co", &ours),
            "DeviceClass gpu.nvidia.co does not exist (did you mean gpu.nvidia.com?); the GPU \
             DeviceClasses here: gpu.nvidia.com, mig.nvidia.com"
        );
        assert!(!missing_note("tpu.example.com", &ours).contains("did you mean"));
    }

    #[test]
    fn supply_counts_each_nodes_devices_of_the_type_and_those_taken() {
        let slices = [
            slice("a", &[("gpu-0", "gpu"), ("gpu-1", "gpu"), ("mig-0", "mig")]),
            slice("b", &[("gpu-0", "gpu")]),
        ];
        let mut admin = claim(o::DEVICE_CLASS_GPU, &[("a", "gpu-1")]);
        let results = admin.status.as_mut().unwrap().allocation.as_mut().unwrap();
        results.devices.as_mut().unwrap().results.as_mut().unwrap()[0].admin_access = Some(true);
        let claims = [
            claim(o::DEVICE_CLASS_GPU, &[("a", "gpu-0"), ("b", "gpu-0")]),
            claim(o::DEVICE_CLASS_MIG, &[("a", "mig-0")]),
            admin,
        ];
        let gpus = supply(&[Criterion::Type("gpu")], &slices, &claims);
        assert_eq!(
            gpus,
            Supply::from([("a".into(), (2, 1)), ("b".into(), (1, 1))])
        );
        assert_eq!(
            note(o::DEVICE_CLASS_GPU, 1, &gpus),
            "2 nodes publish devices of DeviceClass gpu.nvidia.com (a: 1 of 2 allocated, b: 1 of \
             1 allocated); 1 is free, but the claim's selectors or the pod's node constraints \
             rule them out"
        );
        assert!(note(o::DEVICE_CLASS_GPU, 2, &gpus)
            .ends_with("1 is free and the pod's claims ask 2. Free devices, or move more GPU nodes to the dra plane"));
        let taken = supply(&[Criterion::Type("gpu")], &slices[1..], &claims);
        assert!(note(o::DEVICE_CLASS_GPU, 1, &taken).ends_with(
            "(b: 1 of 1 allocated); every one is allocated. Free a device, or move more GPU \
             nodes to the dra plane"
        ));
        let none = supply(&[Criterion::Type("vfio")], &slices, &claims);
        assert!(
            note(o::DEVICE_CLASS_VFIO, 1, &none)
                .starts_with("no node publishes devices of DeviceClass vfio.gpu.nvidia.com")
        );
    }

    #[test]
    fn a_pod_is_explained_only_once_the_scheduler_gave_up_on_it() {
        let pod = |node: Option<&str>, reason: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"},
                "spec": {"containers": [], "nodeName": node,
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason}],
                           "resourceClaimStatuses": [{"name": "t", "resourceClaimName": "p-gpu-x"}],
                           "extendedResourceClaimStatus": {"resourceClaimName": "p-extended",
                                                           "requestMappings": []}}}))
            .unwrap()
        };
        assert!(unschedulable(&pod(None, "Unschedulable")));
        assert!(!unschedulable(&pod(None, "SchedulingGated")));
        assert!(!unschedulable(&pod(Some("n"), "Unschedulable")));
    }

    #[test]
    fn a_pod_is_explained_by_its_unallocated_claims_missing_classes_first() {
        let slices = [slice("a", &[("gpu-0", "gpu")])];
        let taken = claim(o::DEVICE_CLASS_GPU, &[("a", "gpu-0")]);
        let classes = [o::DEVICE_CLASS_GPU.to_owned(), "example.com".to_owned()];
        let world = World {
            device_classes: &classes,
            gpu_classes: &[],
            slices: &slices,
            claims: std::slice::from_ref(&taken),
        };
        let waiting = claim(o::DEVICE_CLASS_GPU, &[]);
        assert!(waits_for_devices(std::slice::from_ref(&waiting)));
        let why = explain(std::slice::from_ref(&waiting), world).expect("explained");
        assert_eq!(why.reason, "GPUsUnavailable");
        assert_eq!(
            why.notes,
            [
                "1 node publishes devices of DeviceClass gpu.nvidia.com (a: 1 of 1 allocated); every \
              one is allocated. Free a device, or move more GPU nodes to the dra plane"
            ]
        );
        assert!(!waits_for_devices(std::slice::from_ref(&taken)));
        assert_eq!(
            explain(std::slice::from_ref(&taken), world),
            None,
            "nothing waits"
        );
        let typo = claim("gpu.nvidia.co", &[]);
        let why = explain(&[waiting, typo], world).expect("explained");
        assert_eq!(why.reason, "DeviceClassNotFound");
        assert!(
            why.notes[0].starts_with(
                "DeviceClass gpu.nvidia.co does not exist (did you mean gpu.nvidia.com?)"
            ),
            "{:?}",
            why.notes
        );
        assert_eq!(why.notes.len(), 2);
    }
}
