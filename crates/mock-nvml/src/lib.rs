//! A `libnvidia-ml.so.1` for machines without GPUs.
//!
//! Built as a `cdylib` whose soname is `libnvidia-ml.so.1`, it exports the NVML C functions that
//! `nvml-wrapper` calls for discovery, MIG and health events, and serves a topology read from a
//! profile (see `profiles/`): a shipped name or a profile file, a GPU count, and injected faults,
//! all set in a control file or env vars (see [`config`]). Place it in a fake driver root as
//! `usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1` with a `mock-nvml.json` beside it and load it
//! through `dlopen` like the real library. All state sits behind one mutex, so callers may use it
//! from any thread. What a real driver keeps per GPU across processes (compute mode, compute
//! time-slice) lives in a file (see [`settings`]).

mod config;
mod ffi;
mod ffi_policy;
#[cfg(test)]
mod ffi_tests;
mod handles;
mod partitioning;
mod profile;
mod settings;
mod state;
mod topology;
