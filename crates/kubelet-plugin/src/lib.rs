//! The `gpu-kubelet-plugin` library: the kubelet's DRA protocol on Unix sockets, the crash-safe
//! prepare/unprepare core with its checkpoint and CDI specs, and the ResourceSlices of a node.
#![forbid(unsafe_code)]

pub mod app;
pub mod atomic;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod client;
pub mod config;
pub mod devices;
pub mod driver;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod opaque;
pub mod proto;
pub mod publish;
pub mod registration;
pub mod server;
pub mod slices;
pub mod sockets;
#[cfg(test)]
mod testutil;
pub mod types;
