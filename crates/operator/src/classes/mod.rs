//! The GPUClass controller: derives a DeviceClass per variant of each class, prunes those a class
//! no longer offers, reports in the class's status the names pods ask for and what each variant
//! matches among the published devices, and keeps a deleted class's DeviceClasses while claims
//! use them. Writes happen only when something changed; the published devices are read from a
//! watch of the `gpu.nvidia.com` ResourceSlices, whose changes recount every class.

use std::sync::Arc;
use std::time::Duration;

use api::GPUClass;
use api::contract::DRIVER_NAME;
use api::gpuclass::{CLASS_LABEL, FINALIZER, GPUClassStatus};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config};
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use service::events::EventPublisher;

use crate::controller::discovery::FeatureCache;
use crate::events::RECONCILE;
use crate::features::Feature;

pub mod render;

use api::gpuclass::variants::{self, Invalid, Variant};

/// Field manager of the controller's writes.
const FIELD_MANAGER: &str = "gpu-operator";
/// How soon a class refused for an extended resource another class holds looks again.
const TAKEN_RECHECK: Duration = Duration::from_secs(30);

/// Why a reconcile of a class failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The API's answer.
        source: kube::Error,
    },
    /// Whether the apiserver serves extended resources is not known yet.
    #[error("cannot tell whether the apiserver serves DeviceClass extendedResourceName: {0}")]
    FeatureUnknown(String),
    /// The class is being deleted and claims still use its DeviceClasses.
    #[error("GPUClass {0} is being deleted; claims still use its DeviceClasses")]
    InUse(String),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Api { what, source }
}

struct Context {
    client: kube::Client,
    features: Arc<FeatureCache>,
    /// The published devices of our driver, as a watch keeps them.
    slices: Store<ResourceSlice>,
    /// The derived DeviceClasses, as a watch keeps them.
    device_classes: Store<DeviceClass>,
    events: EventPublisher,
}

impl Context {
    async fn event(&self, class: &GPUClass, type_: EventType, reason: &str, note: String) {
        let regarding = class.object_ref(&());
        self.events
            .tell(&regarding, type_, reason, RECONCILE, note)
            .await;
    }

    /// Writes `status` unless the class already shows it. Returns whether it wrote.
    async fn write_status(&self, class: &GPUClass, status: GPUClassStatus) -> Result<bool, Error> {
        if class.status.as_ref() == Some(&status) {
            return Ok(false);
        }
        let name = class.name_any();
        Api::<GPUClass>::all(self.client.clone())
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": status})),
            )
            .await
            .map_err(api_err(format!("writing the status of GPUClass {name}")))?;
        Ok(true)
    }

    /// Whether the apiserver serves `DeviceClass.spec.extendedResourceName`.
    async fn extended_resources(&self) -> Result<bool, Error> {
        self.features
            .get()
            .await
            .served(Feature::ExtendedResource)
            .map_err(Error::FeatureUnknown)
    }

    /// The names of the DeviceClasses derived from the class named `class`.
    async fn derived(&self, class: &str) -> Vec<String> {
        self.device_classes.wait_until_ready().await.ok();
        self.device_classes
            .state()
            .iter()
            .filter(|c| c.labels().get(CLASS_LABEL).map(String::as_str) == Some(class))
            .map(|c| c.name_any())
            .collect()
    }
}

/// `namespace/name` of the claims that ask for any of `classes`, at most `limit` of them, and
/// how many there are.
async fn claims_using(
    client: &kube::Client,
    classes: &[String],
    limit: usize,
) -> Result<(Vec<String>, usize), Error> {
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err("listing ResourceClaims"))?;
    let using: Vec<String> = claims
        .items
        .iter()
        .filter(|claim| {
            claim
                .spec
                .devices
                .iter()
                .flat_map(|d| d.requests.iter().flatten())
                .any(|r| {
                    let exact = r.exactly.iter().map(|e| &e.device_class_name);
                    let sub = r
                        .first_available
                        .iter()
                        .flatten()
                        .map(|s| &s.device_class_name);
                    exact.chain(sub).any(|name| classes.contains(name))
                })
        })
        .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
        .collect();
    let total = using.len();
    Ok((using.into_iter().take(limit).collect(), total))
}

async fn reconcile(class: Arc<GPUClass>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<GPUClass> = Api::all(ctx.client.clone());
    finalizer(&api, FINALIZER, class, |event| async {
        match event {
            finalizer::Event::Apply(class) => apply(&ctx, &class).await,
            finalizer::Event::Cleanup(class) => release(&ctx, &class).await,
        }
    })
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    })
}

/// Puts the class's DeviceClasses in place, prunes those it no longer offers, reports.
async fn apply(ctx: &Context, class: &GPUClass) -> Result<Action, Error> {
    let now = Timestamp::now();
    let variants = match variants::variants(class) {
        Ok(v) => v,
        Err(invalid) => return refuse(ctx, class, &invalid, now).await,
    };
    let extended_resources = ctx.extended_resources().await?;
    let classes: Api<DeviceClass> = Api::all(ctx.client.clone());
    ctx.device_classes.wait_until_ready().await.ok();
    if extended_resources
        && let Some(taken) = render::resource_taken(class, &variants, &ctx.device_classes.state())
    {
        refuse(ctx, class, &taken, now).await?;
        // The other class may go, or change its name, without this one hearing of it.
        return Ok(Action::requeue(TAKEN_RECHECK));
    }
    for variant in &variants {
        let want = render::device_class(class, variant, extended_resources);
        // The watch's copy of ours; one not derived from a class is not in the watch, so an
        // absent one is looked up before it is created.
        let cached = ctx
            .device_classes
            .get(&ObjectRef::new(&variant.device_class));
        let live = match cached {
            Some(live) => Some((*live).clone()),
            None => classes
                .get_opt(&variant.device_class)
                .await
                .map_err(api_err(format!(
                    "reading DeviceClass {}",
                    variant.device_class
                )))?,
        };
        if let Some(live) = &live {
            if live.labels().get(CLASS_LABEL) != Some(&class.name_any()) {
                let invalid = Invalid {
                    class: class.name_any(),
                    field: "metadata.name",
                    reason: format!(
                        "DeviceClass {} exists and is not derived from this class; rename the \
                         class or delete that DeviceClass",
                        variant.device_class
                    ),
                };
                return refuse(ctx, class, &invalid, now).await;
            }
            if render::up_to_date(live, &want) {
                continue;
            }
        }
        classes
            .patch(
                &variant.device_class,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&want),
            )
            .await
            .map_err(api_err(format!(
                "applying DeviceClass {}",
                variant.device_class
            )))?;
        tracing::info!(class = %class.name_any(), device_class = %variant.device_class, "applied");
    }
    prune(ctx, class, &variants).await?;
    ctx.slices.wait_until_ready().await.ok();
    let slices = ctx.slices.state();
    let status = render::status(class, &variants, extended_resources, &slices, now);
    ctx.write_status(class, status).await?;
    Ok(Action::await_change())
}

/// Reports a class that cannot be derived, once per change.
async fn refuse(
    ctx: &Context,
    class: &GPUClass,
    invalid: &Invalid,
    now: Timestamp,
) -> Result<Action, Error> {
    if ctx
        .write_status(class, render::invalid_status(class, invalid, now))
        .await?
    {
        ctx.event(
            class,
            EventType::Warning,
            "InvalidSpec",
            invalid.to_string(),
        )
        .await;
    }
    Ok(Action::await_change())
}

/// Deletes the DeviceClasses of variants the class no longer offers, unless claims use them.
async fn prune(ctx: &Context, class: &GPUClass, variants: &[Variant]) -> Result<(), Error> {
    let stale: Vec<String> = ctx
        .derived(&class.name_any())
        .await
        .into_iter()
        .filter(|name| !variants.iter().any(|v| &v.device_class == name))
        .collect();
    for name in stale {
        let (_, total) = claims_using(&ctx.client, std::slice::from_ref(&name), 0).await?;
        if total > 0 {
            tracing::info!(device_class = %name, claims = total, "kept: claims use it");
            continue;
        }
        delete_device_class(ctx, &name).await?;
    }
    Ok(())
}

async fn delete_device_class(ctx: &Context, name: &str) -> Result<(), Error> {
    match Api::<DeviceClass>::all(ctx.client.clone())
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => {
            tracing::info!(device_class = %name, "deleted");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(api_err(format!("deleting DeviceClass {name}"))(e)),
    }
}

/// A deleted class: its DeviceClasses go once no claim uses them.
async fn release(ctx: &Context, class: &GPUClass) -> Result<Action, Error> {
    let names = ctx.derived(&class.name_any()).await;
    let (claims, total) = claims_using(&ctx.client, &names, 5).await?;
    if total > 0 {
        let mut shown = claims;
        if total > shown.len() {
            shown.push(format!("and {} more", total - shown.len()));
        }
        let status = render::blocked_status(class, &shown, Timestamp::now());
        let note = status.conditions[0].message.clone();
        if ctx.write_status(class, status).await? {
            ctx.event(class, EventType::Warning, "DeletionBlocked", note)
                .await;
        }
        return Err(Error::InUse(class.name_any()));
    }
    for name in &names {
        delete_device_class(ctx, name).await?;
    }
    Ok(Action::await_change())
}

fn error_policy(class: Arc<GPUClass>, error: &Error, _ctx: Arc<Context>) -> Action {
    if let Error::InUse(_) = error {
        return Action::requeue(Duration::from_secs(15));
    }
    tracing::warn!(class = %class.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the GPUClass controller until the process stops.
pub async fn run(client: kube::Client, features: Arc<FeatureCache>, events: EventPublisher) {
    let (slices, writer) = reflector::store();
    let driver = format!("spec.driver={DRIVER_NAME}");
    let slice_changes = reflector::reflector(
        writer,
        watcher(
            Api::<ResourceSlice>::all(client.clone()),
            watcher::Config::default().fields(&driver),
        ),
    )
    .default_backoff()
    .touched_objects()
    .filter_map(|r| async move { r.ok().map(|_| ()) });
    let (device_classes, writer) = reflector::store();
    let derived_changes = reflector::reflector(
        writer,
        watcher(
            Api::<DeviceClass>::all(client.clone()),
            watcher::Config::default().labels(CLASS_LABEL),
        ),
    )
    .default_backoff()
    .touched_objects();
    let ctx = Arc::new(Context {
        client: client.clone(),
        features,
        slices,
        device_classes,
        events,
    });
    Controller::new(Api::<GPUClass>::all(client), watcher::Config::default())
        .owns_stream(derived_changes)
        .reconcile_all_on(slice_changes)
        .with_config(Config::default().debounce(Duration::from_millis(500)))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "GPUClass reconcile");
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
