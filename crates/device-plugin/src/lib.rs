//! The `gpu-device-plugin` library: the kubelet's device-plugin API v1beta1 for NVIDIA GPUs,
//! from the same discovery and CDI edits as the DRA plugin.
//!
//! Pure decisions: [`plan`] (resources and device IDs from the inventory, MIG strategies,
//! time-slicing replicas), [`allocate`] (preferred allocations and what a container gets),
//! [`state`] (the device lists sent to the kubelet), [`cdi::spec`]. Device health (which NVML
//! events make a GPU unhealthy, recovery with damping, the NVML monitor) is shared with the DRA
//! plugin, in `gpu_discovery::health` and `gpu_discovery::monitor`.
//! I/O edges: [`serve`] (sockets and registration, across kubelet restarts), [`grpc`] (the
//! service), [`cdi::write`], [`metrics`], and [`app`], which wires them for the binary from
//! [`config`].
#![forbid(unsafe_code)]

pub mod allocate;
pub mod app;
pub mod cdi;
pub mod config;
pub mod grpc;
pub mod metrics;
pub mod physical_gpus;
pub mod plan;
pub mod proto;
pub mod serve;
pub mod state;
