//! Pods the scheduler cannot place because no device of one of our DeviceClasses is free: a Warning
//! Event on the pod that names the class, the nodes that publish such devices and how many of them
//! are taken, told once per pod. The scheduler's own message says only that claims cannot be
//! allocated. A claim naming a DeviceClass that does not exist (a typo such as `gpu.nvidia.co`) gets
//! an Event too, naming the GPU classes there are. The decisions are `api::pending`'s; this is the
//! watch around them.

use std::collections::HashSet;

use api::pending::{explain, unschedulable, waits_for_devices};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Resource, ResourceExt};
use service::events::EventPublisher;

use crate::devices::Devices;

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
    let mut pod_claims = Vec::new();
    for name in api::pods::claim_names(pod) {
        pod_claims.extend(claims_here.get_opt(name).await?);
    }
    if !waits_for_devices(&pod_claims) {
        return Ok(false);
    }
    let devices = Devices::read(client).await?;
    let Some(why) = explain(&pod_claims, devices.world()) else {
        return Ok(false);
    };
    let event = Event {
        type_: EventType::Warning,
        reason: why.reason.into(),
        note: Some(why.notes.join("; ")),
        action: "Scheduling".into(),
        secondary: None,
    };
    events
        .try_publish(&event, &pod.object_ref(&()))
        .await
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    Ok(true)
}
