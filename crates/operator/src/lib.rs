//! The GPU operator: reconciles the `GPUCluster` singleton into the DRA stack's operands and
//! reports in its status whether they work; derives DeviceClasses from `GPUClass`es.

pub mod classes;
pub mod cleanup;
pub mod controller;
pub mod coverage;
pub mod devices;
pub mod diff;
pub mod events;
pub mod features;
pub mod fleet;
pub mod pending;
pub mod pod_creation;
pub mod pod_failures;
pub mod quotas;
pub mod render;
pub mod status;
