//! Why a reconcile fails, as the metric label, the log and the error policy see it.

use api::contract::GPU_CLUSTER_FINALIZER;
use kube::runtime::finalizer;

/// Why a reconcile failed; the label is the metric's `error` value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, naming the object.
        action: String,
        /// The API error.
        source: kube::Error,
    },
    /// Whether the apiserver keeps `DeviceClass.spec.extendedResourceName` is not known, and
    /// guessing "no" would strip it from the live class.
    #[error(
        "asking whether DeviceClass.spec.extendedResourceName is served (a dry-run create): {0}"
    )]
    FeatureUnknown(String),
    /// Deletion waits for these claim-consuming DaemonSets to go before the kubelet plugin; the
    /// finalizer stays until then.
    #[error("waiting for {} to go before the kubelet plugin", .0.join(", "))]
    Draining(Vec<String>),
    /// The operand watches have not listed yet, so what is live is not known.
    #[error("the watches of the operands have not listed them yet")]
    NotSynced,
    /// Adding or removing the GPUCluster's finalizer failed.
    #[error("GPUCluster finalizer {GPU_CLUSTER_FINALIZER}: {0}")]
    Finalizer(String),
}

impl Error {
    pub(super) fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::FeatureUnknown(_) => "feature_unknown",
            Error::Draining(_) => "draining",
            Error::Finalizer(_) => "finalizer",
            Error::NotSynced => "not_synced",
        }
    }

    /// The reconcile's own error out of `kube::runtime::finalizer`'s wrapper.
    pub(super) fn from_finalizer(error: finalizer::Error<Error>) -> Error {
        match error {
            finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
            other => Error::Finalizer(other.to_string()),
        }
    }
}

pub(super) fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}
