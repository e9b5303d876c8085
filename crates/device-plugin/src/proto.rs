//! Generated gRPC code for the kubelet's device-plugin API v1beta1 (`proto/deviceplugin`).
#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

tonic::include_proto!("v1beta1");

/// The API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// `Device.health` of a device that may be allocated.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device the kubelet must not allocate.
pub const UNHEALTHY: &str = "Unhealthy";
/// The kubelet's registration socket, in the device-plugins directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
