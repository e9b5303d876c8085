//! GPU node discovery: finds a node's NVIDIA GPUs as NFD does (PCI functions in sysfs) and, where
//! the driver is loaded, describes them as GPU feature discovery does (NVML), as node labels with
//! those projects' names, so that a cluster without NFD and GFD still has its GPU nodes found and
//! rules written for them keep working.
//!
//! - [`pci`]: the node's PCI functions and which are NVIDIA GPUs.
//! - [`labels`]: the labels a node should carry for what was found (pure).
//! - [`plan`]: the change to the node's metadata, touching only labels this agent owns (pure).
//! - [`scan`]: one look at the node (PCI, then NVML).
//! - [`agent`]: the watch, the scans and the writes.
#![forbid(unsafe_code)]

pub mod agent;
pub mod labels;
pub mod pci;
pub mod plan;
pub mod scan;
