//! A `libnvidia-ml.so.1` stand-in serving GPU topologies from profile files; built by the mock-NVML issue.
