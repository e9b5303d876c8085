//! The base both node agents stand on, the DRA kubelet plugin (`kubelet-plugin`) and the device
//! plugin (`device-plugin`): what they must do alike so a container gets the same GPU on either
//! plane, and what they would otherwise each keep a copy of.
//!
//! Pure: [`devices`] (the device model: whole GPUs and MIG devices, their names), the spec
//! builders of [`cdi`]. I/O edges: [`cdi::SpecWriter`] (the driver's files and atomic spec
//! files), [`sockets`] (private Unix sockets for the kubelet), [`kubelet_client`] (gRPC over a
//! Unix socket), [`gpu_health`] (the NVML monitor's observations folded into GPU health),
//! [`driver_change`] (a driver replaced under the running agent), and
//! [`flags`], the command-line flags every node agent takes.
#![forbid(unsafe_code)]

pub mod cdi;
pub mod devices;
pub mod driver_change;
pub mod flags;
pub mod gpu_health;
pub mod kubelet_client;
pub mod sockets;
