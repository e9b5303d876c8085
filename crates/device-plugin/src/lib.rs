//! The `gpu-device-plugin` library: the kubelet's device-plugin API v1beta1 for NVIDIA GPUs,
//! from the same discovery and CDI edits as the DRA plugin.
//!
//! Pure decisions: [`plan`] (resources and device IDs from the inventory, MIG strategies,
//! time-slicing replicas), [`allocate`] (preferred allocations and what a container gets),
//! [`health`] (which NVML events make a GPU unhealthy, recovery with damping), [`state`] (the
//! device lists sent to the kubelet), [`cdi::spec`].
//! I/O edges: [`serve`] (sockets and registration, across kubelet restarts), [`grpc`] (the
//! service), [`monitor`] (NVML events and probes on a thread), [`cdi::write`], [`metrics`], and
//! [`app`], which wires them for the binary from [`config`].
#![forbid(unsafe_code)]

pub mod allocate;
pub mod app;
pub mod cdi;
pub mod config;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod monitor;
pub mod plan;
pub mod proto;
pub mod serve;
pub mod state;
