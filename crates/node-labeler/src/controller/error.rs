//! Why reconciling a node failed.

use api::AllocationMode;

/// Why reconciling a node failed; the label is the metric's `error` value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Patching the node's labels or annotations failed (a 409 means it changed under us and is
    /// retried).
    #[error("patching node {node}: {source}")]
    Patch {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Cordoning or uncordoning the node failed.
    #[error("{what} node {node}: {source}")]
    Cordon {
        /// `cordoning` or `uncordoning`.
        what: &'static str,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading or evicting the pods that hold the old plane's GPUs failed.
    #[error("draining node {node}: {source}")]
    Drain {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading what a plane offers on the node (its ResourceSlices, or its allocatable GPUs)
    /// failed.
    #[error("reading what the {plane} plane offers on node {node}: {source}")]
    Offers {
        /// The plane.
        plane: AllocationMode,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Error {
    pub(super) fn metric_label(&self) -> &'static str {
        match self {
            Error::Patch { .. } => "patch",
            Error::Cordon { .. } => "cordon",
            Error::Drain { .. } => "drain",
            Error::Offers { .. } => "offers",
        }
    }
}
