//! GPU discovery for a node, shared by the validator and the kubelet plugin.
//!
//! - [`root`]: find the NVIDIA driver, on the host first and then in the container driver root, and
//!   work out the paths the `driver-ready` file carries.
//! - [`driver_files`]: the user-space libraries, binaries, firmware, IPC sockets and device nodes
//!   a GPU container needs, found under a probed driver root.
//! - [`driver_paths`]: the driver and dev roots, on the host and in this container: one type for
//!   the file, a probed driver and the plugins.
//! - [`driver_ready`]: that file's format, an atomic writer and a parser.
//! - [`nvml`]: an NVML session loaded from the probed root's `libnvidia-ml.so.1` (never from the
//!   default library search path), reading a plain [`model`] of GPUs and MIG devices, and device
//!   events.
//! - [`partitioning`]: dynamic MIG, one NVML step per call (MIG mode, GPU and compute instances
//!   created, listed, destroyed).
//! - [`pcie`]: a PCI function's PCIe root, from the sysfs link naming it.
//! - [`health`]: which NVML faults make a GPU unhealthy, how badly, and when it recovers;
//!   [`monitor`]: NVML events and periodic probes, read on a thread of their own.
//! - `testing` (feature `test-support`): fake driver roots carrying the mock NVML.
#![forbid(unsafe_code)]

pub mod atomic;
pub mod driver_files;
pub mod driver_paths;
pub mod driver_ready;
pub mod health;
pub mod model;
pub mod monitor;
pub mod nvml;
pub mod partitioning;
pub mod pcie;
pub mod root;
#[cfg(feature = "test-support")]
pub mod testing;

pub use driver_paths::DriverPaths;
pub use driver_ready::DriverReady;
pub use model::{
    CudaVersion, Gpu, Inventory, MigDevice, MigMode, MigPlacement, MigProfile, UnreadableGpu,
};
pub use nvml::{DeviceEvent, EventKind, EventWatch, InitMode, NvmlError, NvmlSession};
pub use root::{DriverLocation, DriverRoot, ProbeError, ProbeSettings, SearchedRoot};
