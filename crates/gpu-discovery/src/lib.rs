//! GPU discovery for a node: driver-root probing, an NVML session from that root, and a plain device model; built by the mock-NVML issue.
