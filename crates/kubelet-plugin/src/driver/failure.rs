//! Why one claim could not be prepared or unprepared.

use crate::claim;
use crate::opaque::Interval;
/// Why one claim could not be prepared or unprepared. The message goes to the kubelet (and the
/// pod's events); [`ClaimFailure::reason`] labels the `claim_errors_total` metric.
#[derive(Debug, thiserror::Error)]
pub enum ClaimFailure {
    /// The claim is not in the API.
    #[error("not found in the API")]
    NotFound,
    /// Reading the claim from the API failed.
    #[error("reading it from the API failed: {0}")]
    Api(String),
    /// The claim's allocation or config cannot be served on this node.
    #[error(transparent)]
    Invalid(#[from] claim::ClaimError),
    /// An exclusive device is held by another prepared claim.
    #[error("device {device} is already prepared for claim {holder}")]
    DeviceInUse {
        /// The device.
        device: String,
        /// The claim holding it.
        holder: String,
    },
    /// The checkpoint could not be written.
    #[error("writing the checkpoint failed: {0}")]
    Checkpoint(String),
    /// The claim's CDI spec could not be written.
    #[error("writing the CDI spec failed: {0}")]
    CdiWrite(String),
    /// The claim's CDI spec could not be removed.
    #[error("removing the CDI spec failed: {0}")]
    CdiRemove(String),
    /// The claim was unprepared while its prepare ran.
    #[error("unprepared while it was being prepared")]
    Unprepared,
    /// Another prepared claim set another time-slice interval on a GPU this claim shares.
    #[error(
        "GPU {gpu} is time-sliced with interval {held} for claim {holder}; this claim asks for {asked} (claims sharing a GPU must agree on its interval)"
    )]
    TimeSliceConflict {
        /// The physical GPU's UUID.
        gpu: String,
        /// The interval this claim asks for.
        asked: Interval,
        /// The claim that set the other interval.
        holder: String,
        /// The interval it set.
        held: Interval,
    },
    /// Setting or restoring a GPU's time-slice interval failed.
    #[error("setting the time-slice interval of GPU {gpu} failed: {reason}")]
    TimeSlice {
        /// The physical GPU's UUID.
        gpu: String,
        /// What failed.
        reason: String,
    },
    /// The claim's MPS control daemon could not be started or stopped.
    #[error("MPS control daemon: {0}")]
    Mps(String),
    /// A MIG partition of the claim could not be made or destroyed.
    #[error("MIG partition {device}: {reason}")]
    Partition {
        /// The partition's device name.
        device: String,
        /// What failed.
        reason: String,
    },
}

impl ClaimFailure {
    /// The metric label of this kind of failure.
    pub fn reason(&self) -> &'static str {
        match self {
            ClaimFailure::NotFound => "not_found",
            ClaimFailure::Api(_) => "api",
            ClaimFailure::Invalid(_) => "invalid_claim",
            ClaimFailure::DeviceInUse { .. } => "device_in_use",
            ClaimFailure::Checkpoint(_) => "checkpoint",
            ClaimFailure::CdiWrite(_) | ClaimFailure::CdiRemove(_) => "cdi",
            ClaimFailure::Unprepared => "unprepared",
            ClaimFailure::TimeSliceConflict { .. } => "time_slice_conflict",
            ClaimFailure::TimeSlice { .. } => "time_slice",
            ClaimFailure::Mps(_) => "mps_daemon",
            ClaimFailure::Partition { .. } => "mig_partition",
        }
    }
}
