//! Server-side apply of the desired operands, and pruning of those no longer desired.

use std::collections::BTreeSet;

use api::GPUCluster;
use api::contract::labels as l;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::diff;
use crate::render::Object;

use super::{Context, Error, FIELD_MANAGER, MANAGED_SELECTOR, api_err};

/// The kinds the operator owns: (apiVersion, kind, namespaced).
pub(super) const OWNED_KINDS: [(&str, &str, bool); 9] = [
    ("apps/v1", "DaemonSet", true),
    ("v1", "ConfigMap", true),
    ("apps/v1", "Deployment", true),
    ("v1", "Service", true),
    ("resource.k8s.io/v1", "ResourceClaimTemplate", true),
    ("resource.k8s.io/v1", "DeviceClass", false),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        false,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        false,
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor", true),
];

pub(super) fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

impl Context {
    pub(super) fn dynamic(
        &self,
        api_version: &str,
        kind: &str,
        namespaced: bool,
    ) -> Api<DynamicObject> {
        let ar = resource(api_version, kind);
        if namespaced {
            Api::namespaced_with(self.client.clone(), &self.settings.namespace, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        }
    }
}

pub(super) fn owner_reference(gc: &GPUCluster) -> OwnerReference {
    gc.controller_owner_ref(&())
        .expect("a GPUCluster from the API has a name and uid")
}

pub(super) fn with_owner(object: &Object, owner: &OwnerReference) -> Value {
    let mut value = object.to_value();
    value["metadata"]["ownerReferences"] = json!([owner]);
    value
}

/// Applies `object` unless the live copy already holds everything we want. Returns the live object.
pub(super) async fn apply(
    ctx: &Context,
    gc: &GPUCluster,
    object: &Object,
    owner: &OwnerReference,
) -> Result<DynamicObject, Error> {
    let want = with_owner(object, owner);
    let (api_version, kind) = (
        want["apiVersion"].as_str().unwrap_or_default(),
        want["kind"].as_str().unwrap_or_default(),
    );
    let namespaced = want["metadata"].get("namespace").is_some();
    let api = ctx.dynamic(api_version, kind, namespaced);
    let name = want["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The watch's copy where the kind is watched; the API's otherwise (ServiceMonitor).
    let live = match ctx.operands.get(kind, &name) {
        Some(cached) => cached.map(|live| (*live).clone()),
        None => api
            .get_opt(&name)
            .await
            .map_err(api_err(format!("reading {}", object.id())))?,
    };
    if let Some(live) = &live {
        let live_value = serde_json::to_value(live).unwrap_or_default();
        if diff::contains(&live_value, &want, FIELD_MANAGER) {
            return Ok(live.clone());
        }
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api
        .patch(&name, &params, &Patch::Apply(&want))
        .await
        .map_err(api_err(format!("applying {}", object.id())))?;
    ctx.metrics.applies.inc();
    let verb = if live.is_some() { "Updated" } else { "Created" };
    tracing::info!(object = %object.id(), "{verb}");
    ctx.event(
        gc,
        EventType::Normal,
        verb,
        format!("{verb} {}", object.id()),
    )
    .await;
    Ok(applied)
}

/// Deletes owned objects that are no longer desired.
pub(super) async fn prune(
    ctx: &Context,
    gc: &GPUCluster,
    keep: &BTreeSet<String>,
    service_monitors: bool,
) -> Result<(), Error> {
    let uid = gc.uid().unwrap_or_default();
    for (api_version, kind, namespaced) in OWNED_KINDS {
        if kind == "ServiceMonitor" && !service_monitors {
            continue;
        }
        let api = ctx.dynamic(api_version, kind, namespaced);
        // Ours and not being deleted already: the watch's copy where the kind is watched.
        let prunable = |o: &kube::api::ObjectMeta| {
            let owned = o.owner_references.iter().flatten().any(|r| r.uid == uid);
            (owned && o.deletion_timestamp.is_none()).then(|| o.name.clone().unwrap_or_default())
        };
        let live: Vec<String> = match ctx.operands.all(kind) {
            Some(cached) => cached
                .iter()
                .filter_map(|o| prunable(&o.metadata))
                .collect(),
            None => api
                .list_metadata(&ListParams::default().labels(MANAGED_SELECTOR))
                .await
                .map_err(api_err(format!("listing {kind}s")))?
                .items
                .iter()
                .filter_map(|o| prunable(&o.metadata))
                .collect(),
        };
        for name in live {
            let id = format!("{kind}/{name}");
            if keep.contains(&id) {
                continue;
            }
            // Gone already (the watch had not shown it yet) is what pruning wants.
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(e) => return Err(api_err(format!("deleting {id}"))(e)),
            }
            ctx.metrics.deletes.inc();
            ctx.event(
                gc,
                EventType::Normal,
                "Deleted",
                format!("Deleted {id}: no longer in the GPUCluster spec"),
            )
            .await;
        }
    }
    Ok(())
}

pub(super) async fn ensure_admin_access_label(ctx: &Context) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let ns = &ctx.settings.namespace;
    let current = namespaces
        .get_metadata(ns)
        .await
        .map_err(api_err(format!("reading namespace {ns}")))?;
    if current
        .labels()
        .get(l::ADMIN_ACCESS_NAMESPACE)
        .map(String::as_str)
        != Some("true")
    {
        let patch = json!({"metadata": {"labels": {l::ADMIN_ACCESS_NAMESPACE: "true"}}});
        namespaces
            .patch_metadata(ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err(format!("labelling namespace {ns}")))?;
    }
    Ok(())
}
