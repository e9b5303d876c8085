//! Which optional APIs and DRA features the cluster serves.

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{DynamicObject, PostParams};

use crate::features::{Feature, Probe, Support};

/// What the discovery API says about the cluster.
#[derive(Clone, Copy, Debug)]
pub(super) struct Served {
    pub(super) dra: bool,
    pub(super) service_monitors: bool,
}

pub(super) async fn served(client: &kube::Client) -> Served {
    let has = |group: &str, version: &str, plural: &str| {
        let client = client.clone();
        let (group, version, plural) = (group.to_owned(), version.to_owned(), plural.to_owned());
        async move {
            let gv = format!("/apis/{group}/{version}");
            let request = http::Request::get(gv)
                .body(Vec::new())
                .expect("a valid request");
            match client
                .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList>(request)
                .await
            {
                Ok(list) => list.resources.iter().any(|r| r.name == plural),
                Err(_) => false,
            }
        }
    };
    Served {
        dra: has("resource.k8s.io", "v1", "deviceclasses").await,
        service_monitors: has("monitoring.coreos.com", "v1", "servicemonitors").await,
    }
}

/// How long a probe of the apiserver's DRA features is trusted: a gate switched on by an apiserver
/// upgrade shows within this; a probe that failed is retried sooner.
const FEATURES_FRESH: Duration = Duration::from_secs(600);
const FEATURES_RETRY: Duration = Duration::from_secs(60);
/// How long the discovery answer (is the DRA API, are ServiceMonitors served) is trusted.
const SERVED_FRESH: Duration = Duration::from_secs(60);

/// The apiserver's DRA features as last probed, shared by the controllers.
pub struct FeatureCache {
    client: kube::Client,
    probed: tokio::sync::Mutex<Option<(Instant, Support)>>,
}

impl std::fmt::Debug for FeatureCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureCache").finish_non_exhaustive()
    }
}

impl FeatureCache {
    /// A cache that probes through `client` when first asked.
    pub fn new(client: kube::Client) -> Self {
        FeatureCache {
            client,
            probed: tokio::sync::Mutex::new(None),
        }
    }

    /// What the apiserver serves of each DRA feature, probed again once the last answer is stale.
    pub(crate) async fn get(&self) -> Support {
        let mut cached = self.probed.lock().await;
        if let Some((at, support)) = cached.as_ref() {
            let all_known = support.0.values().all(|p| !matches!(p, Probe::Unknown(_)));
            let fresh = if all_known {
                FEATURES_FRESH
            } else {
                FEATURES_RETRY
            };
            if at.elapsed() < fresh {
                return support.clone();
            }
        }
        let support = features(&self.client).await;
        *cached = Some((Instant::now(), support.clone()));
        support
    }
}

impl super::Context {
    /// Which optional APIs are served, asked again once the last answer is a minute old.
    pub(super) async fn served(&self) -> Served {
        let mut cached = self.served.lock().await;
        match cached.as_ref() {
            Some((at, served)) if at.elapsed() < SERVED_FRESH => *served,
            _ => {
                let served = served(&self.client).await;
                *cached = Some((Instant::now(), served));
                served
            }
        }
    }
}

/// What the apiserver serves of each DRA feature, found by server-side dry-run creates of objects
/// that set the feature's field: an apiserver with the feature's gate off drops the field and
/// still accepts the object; one that serves the field in another shape refuses it (422).
/// Nothing is stored. The ResourceSlice probes name a driver and a node
/// no plugin uses.
pub(super) async fn features(client: &kube::Client) -> Support {
    use serde_json::json;
    let slice = |spec: serde_json::Value| {
        let mut spec = spec;
        spec["driver"] = json!("probe.gpu-operator-rs.dev");
        spec["nodeName"] = json!("gpu-operator-feature-probe");
        spec["pool"] = json!({"name": "probe", "generation": 0, "resourceSliceCount": 1});
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"generateName": "gpu-operator-probe-"}, "spec": spec})
    };
    let device = |fields: serde_json::Value| {
        let mut device = fields;
        device["name"] = json!("gpu-0");
        slice(json!({"devices": [device]}))
    };
    let probes = [
        (
            Feature::ExtendedResource,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                   "metadata": {"generateName": "gpu-operator-probe-"},
                   "spec": {"extendedResourceName": "gpu-operator-rs.dev/probe"}}),
            "/spec/extendedResourceName",
        ),
        (
            Feature::DeviceTaints,
            device(
                json!({"taints": [{"key": "gpu-operator-rs.dev/probe", "effect": "NoSchedule"}]}),
            ),
            "/spec/devices/0/taints",
        ),
        (
            Feature::ConsumableCapacity,
            device(json!({"allowMultipleAllocations": true})),
            "/spec/devices/0/allowMultipleAllocations",
        ),
        // A device drawing on a counter set of another slice of its pool, as the plugin
        // publishes shares; 1.34 refuses it (422), wanting the set in the device's own slice.
        (
            Feature::PartitionableDevices,
            device(
                json!({"consumesCounters": [{"counterSet": "probe", "counters": {"memory": {"value": "1"}}}]}),
            ),
            "/spec/devices/0/consumesCounters",
        ),
        (
            Feature::BindingConditions,
            device(json!({"bindsToNode": true, "bindingConditions": ["probe"],
                          "bindingFailureConditions": ["probe-failed"]})),
            "/spec/devices/0/bindingConditions",
        ),
    ];
    let mut support = Support::default();
    for (feature, object, field) in probes {
        support
            .0
            .insert(feature, dry_run(client, object, field).await);
    }
    support
}

/// Creates `object` by server-side dry-run and says whether the answer kept `field` (a JSON
/// pointer).
async fn dry_run(client: &kube::Client, object: serde_json::Value, field: &str) -> Probe {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let resource = super::apply::resource("resource.k8s.io/v1", &kind);
    let object: DynamicObject = match serde_json::from_value(object) {
        Ok(o) => o,
        Err(e) => return Probe::Unknown(e.to_string()),
    };
    let params = PostParams {
        dry_run: true,
        field_manager: Some(super::FIELD_MANAGER.into()),
    };
    match Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&params, &object)
        .await
    {
        Ok(answer) => match serde_json::to_value(&answer) {
            Ok(v) if v.pointer(field).is_some_and(|f| !f.is_null()) => Probe::Served,
            Ok(_) => Probe::Missing,
            Err(e) => Probe::Unknown(e.to_string()),
        },
        Err(kube::Error::Api(status)) if status.code == 422 => Probe::Refused(status.message),
        Err(e) => Probe::Unknown(format!("a dry-run create of a {kind} failed: {e}")),
    }
}
