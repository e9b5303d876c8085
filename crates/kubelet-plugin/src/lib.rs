//! The `gpu-kubelet-plugin` library: the kubelet's DRA protocol on Unix sockets, the crash-safe
//! prepare/unprepare core with its checkpoint and CDI specs, and the ResourceSlices of a node.
//!
//! Pure decisions: [`claim`] (what a ResourceClaim asks of this node), [`slices`] (the slices of
//! a device table) with [`consumable`] (devices many claims consume), [`cdi::claim_spec`], [`checkpoint::decode`]/[`checkpoint::recover`],
//! [`opaque`] (driver configs), [`devices`] (names and placements from the inventory),
//! [`sharing`] (which GPUs are published in shares for GPU classes), [`partitions`] (dynamic MIG:
//! the partitions a GPU offers and the counters that keep them apart),
//! [`device_health`] (taints and the kubelet's health stream from the GPUs' health).
//! I/O edges: [`driver`] (prepare/unprepare with the claim GET), [`time_slice`] (the driver's
//! `nvidia-smi` for time-slice intervals), [`prefetch`] (claims read ahead
//! from a watch of the node's pods), [`ledger`] (the claim table and
//! its group-committed checkpoint), [`publish`] (slice reconciliation),
//! [`server`]/[`grpc`]/[`registration`] (the kubelet's sockets), [`liveness`] (gRPC
//! liveness, apart from GPU health in [`device_health`]), [`metrics`] with [`upstream_metrics`], and [`app`], which wires them for the binary from [`config`].
#![forbid(unsafe_code)]

pub mod app;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod claim_status;
pub mod class_watch;
pub mod config;
pub mod consumable;
pub mod device_health;
pub mod devices;
pub mod driver;
pub mod driver_tools;
pub mod grpc;
pub mod grpc_uds;
pub mod keyed_locks;
pub mod ledger;
pub mod liveness;
pub mod metrics;
pub mod mps;
pub mod mps_pods;
pub mod opaque;
pub mod partitioner;
pub mod partitions;
pub mod physical_gpus;
pub mod prefetch;
pub mod proto;
pub mod publish;
pub mod registration;
pub mod server;
pub mod sharing;
pub mod slices;
#[cfg(test)]
mod testutil;
pub mod time_slice;
pub mod types;
pub mod upstream_metrics;
pub mod withdraw;
