//! Pods the scheduler cannot place because no device of one of our DeviceClasses is free: a Warning
//! Event on the pod that names the class, the nodes that publish such devices and how many of them
//! are taken, told once per pod. The scheduler's own message says only that claims cannot be
//! allocated. Our classes are the built-in ones and those derived from GPUClasses. A claim naming a
//! DeviceClass that does not exist (a typo such as `gpu.nvidia.co`) gets an Event too, naming the
//! GPU classes there are. The decisions are pure; [`run`] is the watch around them.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use api::GPUClass;
use api::contract::{DRIVER_NAME, objects as o};
use api::gpuclass::variants::{Criterion, variants};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Resource, ResourceExt};
use service::events::EventPublisher;

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

/// The ResourceClaims the pod uses, by name in its namespace: named in its spec, made from its
/// templates, or made by the scheduler for an extended resource.
pub fn claim_names(pod: &Pod) -> BTreeSet<String> {
    let named = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.clone());
    let status = pod.status.as_ref();
    let generated = status
        .into_iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.clone());
    let extended = status
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.clone());
    named.chain(generated).chain(extended).collect()
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
            api::contract::labels::ALLOCATION_MODE
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
    let nodes = if supply.len() == 1 { "node" } else { "nodes" };
    let head = format!(
        "{} {nodes} publish devices of DeviceClass {class} ({})",
        supply.len(),
        each.join(", ")
    );
    let free = total - taken;
    if free == 0 {
        format!(
            "{head}; every one is allocated. Free a device, or move more GPU nodes to the dra plane"
        )
    } else if i64::try_from(free).unwrap_or(i64::MAX) < wanted {
        format!(
            "{head}; {free} are free and the pod's claims ask {wanted}. Free devices, or move \
             more GPU nodes to the dra plane"
        )
    } else {
        format!(
            "{head}; {free} are free, but the claim's selectors or the pod's node constraints \
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

/// Watches unscheduled Pending pods and tells each one that waits for our devices why, once.
pub async fn run(client: kube::Client, events: EventPublisher) {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields("status.phase=Pending,spec.nodeName=");
    let mut told: HashSet<String> = HashSet::new();
    let mut stream = std::pin::pin!(watcher(pods, config).default_backoff());
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                let uid = pod.uid().unwrap_or_default();
                if told.contains(&uid) || !unschedulable(&pod) {
                    continue;
                }
                match tell(&client, &events, &pod).await {
                    Ok(true) => {
                        told.insert(uid);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(pod = %pod.name_any(), error = %e, "explaining a pending pod")
                    }
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                told.remove(&pod.uid().unwrap_or_default());
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "pending pods watch"),
        }
    }
}

/// Publishes the Event for `pod` when it waits for devices of our classes, or its claims name a
/// DeviceClass that does not exist; whether it did.
async fn tell(client: &kube::Client, events: &EventPublisher, pod: &Pod) -> kube::Result<bool> {
    let ns = pod.namespace().unwrap_or_default();
    let claims_here: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let mut classes: BTreeMap<String, i64> = BTreeMap::new();
    for name in claim_names(pod) {
        if let Some(claim) = claims_here.get_opt(&name).await? {
            let unallocated = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .is_none();
            if unallocated {
                for (class, count) in classes_wanted(&claim) {
                    *classes.entry(class).or_insert(0) += count;
                }
            }
        }
    }
    if classes.is_empty() {
        return Ok(false);
    }
    let existing: Vec<String> =
        Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
    // Without the GPUClass CRD (or its read failing) only the built-in classes are ours.
    let gpu_classes = Api::<GPUClass>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let ours: Vec<String> = existing
        .iter()
        .filter(|c| selection(c, &gpu_classes).is_some())
        .cloned()
        .collect();
    let mut missing = Vec::new();
    let mut wanted_here = Vec::new();
    for (class, wanted) in &classes {
        if !existing.contains(class) {
            missing.push(missing_note(class, &ours));
        } else if let Some(criteria) = selection(class, &gpu_classes) {
            wanted_here.push((class, *wanted, criteria));
        }
    }
    let mut notes = missing.clone();
    if !wanted_here.is_empty() {
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
            .await?
            .items;
        let claims = Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        notes.extend(wanted_here.iter().map(|(class, wanted, criteria)| {
            note(class, *wanted, &supply(criteria, &slices, &claims))
        }));
    }
    if notes.is_empty() {
        return Ok(false);
    }
    let reason = if missing.is_empty() {
        "GPUsUnavailable"
    } else {
        "DeviceClassNotFound"
    };
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(notes.join("; ")),
        action: "Scheduling".into(),
        secondary: None,
    };
    events
        .try_publish(&event, &pod.object_ref(&()))
        .await
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    Ok(true)
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
             1 allocated); 1 are free, but the claim's selectors or the pod's node constraints \
             rule them out"
        );
        assert!(note(o::DEVICE_CLASS_GPU, 2, &gpus)
            .ends_with("1 are free and the pod's claims ask 2. Free devices, or move more GPU nodes to the dra plane"));
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
        assert_eq!(
            claim_names(&pod(None, "Unschedulable")),
            BTreeSet::from(["shared".into(), "p-gpu-x".into(), "p-extended".into()])
        );
    }
}
