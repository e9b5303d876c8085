//! The GPU's compute policy: `nvmlDevice{Get,Set}ComputeMode`, and the compute time-slice that
//! `nvidia-smi compute-policy --set-timeslice` changes. NVML publishes no call for the time-slice
//! (the real `nvidia-smi` reaches the driver through a private interface), so the mock exports
//! its own pair, `mockNvmlDevice{Get,Set}ComputeTimeslice`, for the local cluster's stand-in
//! `nvidia-smi`. Values persist across processes (see [`crate::settings`]).

// NVML's C names are kept as they are in the header.
#![allow(non_snake_case)]

use crate::ffi::{INVALID, SUCCESS, collapse, gpu_only, query};
use crate::settings::{MAX_TIMESLICE, StoreError};
use crate::state::{self, Ret};
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_uint;

fn change(device: nvmlDevice_t, f: impl FnOnce(&mut crate::settings::GpuSettings)) -> Ret {
    collapse(state::with_session(|s| {
        let uuid = gpu_only(s.device(device as usize)?)?.uuid.clone();
        s.settings.update(&uuid, f).map_err(|e| match e {
            StoreError::NoPermission => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        })?;
        Ok(SUCCESS)
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, mode, |s, d| {
            Ok(s.settings.get(&gpu_only(d)?.uuid).compute_mode)
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    mode: nvmlComputeMode_t,
) -> Ret {
    if mode >= nvmlComputeMode_enum_NVML_COMPUTEMODE_COUNT {
        return INVALID;
    }
    change(device, |s| s.compute_mode = mode)
}

/// The GPU's compute time-slice: 0 default, 1 short, 2 medium, 3 long.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn mockNvmlDeviceGetComputeTimeslice(
    device: nvmlDevice_t,
    timeslice: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, timeslice, |s, d| {
            Ok(s.settings.get(&gpu_only(d)?.uuid).timeslice)
        })
    }
}

/// Sets the GPU's compute time-slice (0–3); MIG devices answer `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn mockNvmlDeviceSetComputeTimeslice(
    device: nvmlDevice_t,
    timeslice: c_uint,
) -> Ret {
    if timeslice > MAX_TIMESLICE {
        return INVALID;
    }
    change(device, |s| s.timeslice = timeslice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused_before_any_lookup() {
        assert_eq!(
            mockNvmlDeviceSetComputeTimeslice(std::ptr::null_mut(), 4),
            INVALID
        );
        assert_eq!(nvmlDeviceSetComputeMode(std::ptr::null_mut(), 4), INVALID);
    }
}
