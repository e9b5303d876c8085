//! Exported NVML functions: MIG mode, GPU- and compute-instance profiles and instances.

// NVML's C names are kept as they are in the header and in the bindings.
#![allow(non_snake_case, non_upper_case_globals)]

use super::partition::gpu_instance_of;
use super::*;
use crate::partitioning;

// --- MIG -------------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    if pending.is_null() {
        return INVALID;
    }
    // SAFETY: forwarded caller contract; `pending` was checked for null.
    unsafe {
        query(device, current, |s, d| {
            let gpu = gpu_only(d)?;
            mig_capable(s)?;
            pending.write(c_uint::from(gpu.mig.pending));
            Ok(c_uint::from(gpu.mig.current))
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, count, |s, d| {
            gpu_only(d)?;
            Ok(mig_capable(s)?.max_devices)
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, mig, |_, d| {
            let gpu = gpu_only(d).map_err(|_| INVALID)?;
            if !gpu.mig.current {
                return Err(INVALID);
            }
            gpu.migs.get(index as usize).ok_or(NOT_FOUND)?;
            Ok(handle_ptr(Handle::Mig {
                gpu: gpu.index,
                slot: index,
            }))
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, is_mig, |_, d| {
            Ok(c_uint::from(matches!(d, Device::Mig(..))))
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(mig, device, |_, d| match d {
            Device::Mig(g, _) => Ok(handle_ptr(Handle::Gpu(g.index))),
            Device::Gpu(_) => Err(INVALID),
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, id, |_, d| match d {
            Device::Mig(_, m) => Ok(m.gpu_instance_id),
            Device::Gpu(_) => Err(NOT_SUPPORTED),
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, id, |_, d| match d {
            Device::Mig(_, m) => Ok(m.compute_instance_id),
            Device::Gpu(_) => Err(NOT_SUPPORTED),
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, info, |s, d| {
            gpu_only(d)?;
            let p = profile_by_index(s, profile)?;
            Ok(nvmlGpuInstanceProfileInfo_t {
                id: p.id,
                isP2pSupported: 0,
                sliceCount: p.slices,
                instanceCount: p.instances,
                multiprocessorCount: p.multiprocessors,
                copyEngineCount: p.copy_engines,
                decoderCount: p.decoders,
                encoderCount: p.encoders,
                jpegCount: p.jpeg,
                ofaCount: p.ofa,
                memorySizeMB: p.memory_mib,
            })
        })
    }
}

/// Takes the profile *id* (as reported in the profile info), like NVML.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    if count.is_null() {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        gpu_only(s.device(device as usize)?)?;
        let p = mig_capable(s)?
            .profiles
            .iter()
            .find(|p| p.id == profile_id)
            .ok_or(INVALID)?;
        // SAFETY: `count` is non-null and valid by the caller's contract.
        let room = unsafe { count.read() } as usize;
        // SAFETY: as above.
        unsafe { count.write(p.placements.len() as c_uint) };
        if placements.is_null() {
            return Ok(SUCCESS);
        }
        if room < p.placements.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (i, start) in p.placements.iter().enumerate() {
            let placement = nvmlGpuInstancePlacement_t {
                start: *start,
                size: p.placement_size,
            };
            // SAFETY: `placements` holds `room` entries and `i < room`.
            unsafe { placements.add(i).write(placement) };
        }
        Ok(SUCCESS)
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    instance: *mut nvmlGpuInstance_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, instance, |_, d| {
            let gpu = gpu_only(d)?;
            if !gpu.mig.current {
                return Err(NOT_SUPPORTED);
            }
            partitioning::gpu_instance(&gpu.mig, id)?;
            Ok(handle_ptr(Handle::GpuInstance { gpu: gpu.index, id }))
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> Ret {
    collapse(state::with_session(|s| {
        let (g, gi) = gpu_instance_of(s, instance)?;
        let profile = partitioning::profile_by_id(mig_capable(s)?, gi.profile_id)?;
        let value = nvmlGpuInstanceInfo_t {
            device: handle_ptr(Handle::Gpu(g.index)),
            id: gi.id,
            profileId: gi.profile_id,
            placement: nvmlGpuInstancePlacement_t {
                start: gi.start,
                size: profile.placement_size,
            },
        };
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(info, value) })
    }))
}
