//! The `GPUCluster` API and the names of the compatibility contract.
//!
//! Everything here is plain data: CRD types, constants for every label, annotation, env var, path and
//! object name that users and other components rely on, the allocation-mode enum and the image rule.
//! No I/O happens in this crate.

pub mod contract;
pub mod coverage;
pub mod driver_upgrade;
pub mod gpuclass;
pub mod gpucluster;
pub mod handover;
pub mod image;
pub mod mode;
pub mod pending;
pub mod physicalgpu;
pub mod pods;

pub use gpuclass::{GPUClass, GPUClassSpec, GPUClassStatus};
pub use gpucluster::{GPUCluster, GPUClusterSpec, GPUClusterStatus};
pub use image::{ImageError, ImageSpec};
pub use mode::{AllocationMode, ParseAllocationModeError};
