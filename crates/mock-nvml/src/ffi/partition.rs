//! Exported NVML functions that partition a GPU: MIG mode changes, GPU and compute instances
//! created, listed and destroyed. The rules are [`crate::partitioning`]'s; the state is kept
//! across processes (see [`crate::settings`]).

// NVML's C names are kept as they are in the header and in the bindings.
#![allow(non_snake_case, non_upper_case_globals)]

use super::*;
use crate::partitioning::{self, Step};
use crate::settings::GpuInstanceRecord;
use crate::topology::compute_profile_slices;

/// The GPU and GPU instance a GPU-instance handle names.
pub(crate) fn gpu_instance_of(
    s: &Session,
    instance: nvmlGpuInstance_t,
) -> Result<(&Gpu, &GpuInstanceRecord), Ret> {
    let Some(Handle::GpuInstance { gpu, id }) = Handle::decode(instance as usize) else {
        return Err(INVALID);
    };
    let g = s.topology.gpu(gpu).ok_or(INVALID)?;
    s.check_alive(gpu)?;
    let gi = partitioning::gpu_instance(&g.mig, id).map_err(|_| INVALID)?;
    Ok((g, gi))
}

/// The GPU index, GPU-instance id and compute-instance id a compute-instance handle names, once
/// checked to exist.
fn compute_instance_of(
    s: &Session,
    instance: nvmlComputeInstance_t,
) -> Result<(u32, u32, u32), Ret> {
    let Some(Handle::ComputeInstance { gpu, gi, ci }) = Handle::decode(instance as usize) else {
        return Err(INVALID);
    };
    let g = s.topology.gpu(gpu).ok_or(INVALID)?;
    s.check_alive(gpu)?;
    let record = partitioning::gpu_instance(&g.mig, gi).map_err(|_| INVALID)?;
    if !record.compute_instances.iter().any(|(c, _)| *c == ci) {
        return Err(INVALID);
    }
    Ok((gpu, gi, ci))
}

/// Writes `items` into a caller's array after the count, NVML's way: `count` receives how many
/// there are; too small an array (by `room`) is `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `count` is valid for a write; `out` is null or holds `room` entries.
unsafe fn put_list<T>(out: *mut T, room: usize, count: *mut c_uint, items: Vec<T>) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe { count.write(items.len() as c_uint) };
    if out.is_null() {
        return INVALID;
    }
    if items.len() > room {
        return INSUFFICIENT_SIZE;
    }
    for (i, item) in items.into_iter().enumerate() {
        // SAFETY: `out` holds `room` entries and `i < room`.
        unsafe { out.add(i).write(item) };
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activation: *mut nvmlReturn_t,
) -> Ret {
    state::wait_out_stall(Step::SetMigMode);
    if activation.is_null() || mode > NVML_DEVICE_MIG_ENABLE {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let gpu = gpu_only(s.device(device as usize)?)?.index;
        let status = s.partition(gpu, Step::SetMigMode, |support, record| {
            partitioning::set_mode(support, record, mode == NVML_DEVICE_MIG_ENABLE)
        })?;
        // SAFETY: non-null, valid by the caller's contract.
        Ok(unsafe { put(activation, status) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, count, |s, d| {
            let gpu = gpu_only(d)?;
            if !gpu.mig.current {
                return Err(NOT_SUPPORTED);
            }
            let support = mig_capable(s)?;
            let profile = partitioning::profile_by_id(support, profile_id)?;
            // Each free placement could take one more instance, up to the profile's count.
            let used = gpu
                .mig
                .gpu_instances
                .iter()
                .filter(|gi| gi.profile_id == profile_id)
                .count() as u32;
            let free = partitioning::free_placements(support, &gpu.mig, profile).len() as u32;
            Ok(free.min(profile.instances.saturating_sub(used)))
        })
    }
}

fn create_gpu_instance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    start: Option<u32>,
    instance: *mut nvmlGpuInstance_t,
) -> Ret {
    state::wait_out_stall(Step::CreateGpuInstance);
    if instance.is_null() {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let gpu = gpu_only(s.device(device as usize)?)?.index;
        let id = s.partition(gpu, Step::CreateGpuInstance, |support, record| {
            partitioning::create_gpu_instance(support, record, profile_id, start)
        })?;
        // SAFETY: non-null, valid by the caller's contract.
        Ok(unsafe { put(instance, handle_ptr(Handle::GpuInstance { gpu, id })) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    instance: *mut nvmlGpuInstance_t,
) -> Ret {
    create_gpu_instance(device, profile_id, None, instance)
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    instance: *mut nvmlGpuInstance_t,
) -> Ret {
    if placement.is_null() {
        return INVALID;
    }
    // SAFETY: non-null, valid for a read by the caller's contract.
    let placement = unsafe { placement.read() };
    let size_ok = state::with_session(|s| {
        let support = mig_capable(s)?;
        let profile = partitioning::profile_by_id(support, profile_id)?;
        Ok(profile.placement_size == placement.size)
    });
    match size_ok {
        Ok(true) => create_gpu_instance(device, profile_id, Some(placement.start), instance),
        Ok(false) => INVALID,
        Err(e) => e,
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceDestroy(instance: nvmlGpuInstance_t) -> Ret {
    state::wait_out_stall(Step::DestroyGpuInstance);
    collapse(state::with_session(|s| {
        let (gpu, id) = {
            let (g, gi) = gpu_instance_of(s, instance)?;
            (g.index, gi.id)
        };
        s.partition(gpu, Step::DestroyGpuInstance, |_, record| {
            partitioning::destroy_gpu_instance(record, id)
        })?;
        Ok(SUCCESS)
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    if count.is_null() {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let gpu = gpu_only(s.device(device as usize)?)?;
        if !gpu.mig.current {
            return Err(NOT_SUPPORTED);
        }
        let profile = partitioning::profile_by_id(mig_capable(s)?, profile_id)?;
        let found: Vec<nvmlGpuInstance_t> = gpu
            .mig
            .gpu_instances
            .iter()
            .filter(|gi| gi.profile_id == profile_id)
            .map(|gi| {
                handle_ptr(Handle::GpuInstance {
                    gpu: gpu.index,
                    id: gi.id,
                })
            })
            .collect();
        // NVML's contract: the array holds as many entries as the profile allows instances.
        // SAFETY: `count` is non-null; `instances` is null or holds that many.
        Ok(unsafe { put_list(instances, profile.instances as usize, count, found) })
    }))
}

/// `nvmlComputeInstanceProfileInfo_t` of compute-instance profile `profile` in a GPU instance of
/// `gi_profile`: the instance's engines, its SMs in proportion to the slices.
fn compute_profile_info(
    gi_profile: &GiProfile,
    profile: c_uint,
) -> Result<nvmlComputeInstanceProfileInfo_t, Ret> {
    let slices = compute_profile_slices(profile).ok_or(INVALID)?;
    if slices > gi_profile.slices {
        return Err(NOT_SUPPORTED);
    }
    Ok(nvmlComputeInstanceProfileInfo_t {
        id: profile,
        sliceCount: slices,
        instanceCount: gi_profile.slices / slices,
        multiprocessorCount: gi_profile.multiprocessors * slices / gi_profile.slices.max(1),
        sharedCopyEngineCount: gi_profile.copy_engines,
        sharedDecoderCount: gi_profile.decoders,
        sharedEncoderCount: gi_profile.encoders,
        sharedJpegCount: gi_profile.jpeg,
        sharedOfaCount: gi_profile.ofa,
    })
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    instance: nvmlGpuInstance_t,
    profile: c_uint,
    engine_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    if engine_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let (_, gi) = gpu_instance_of(s, instance)?;
        let gi_profile = partitioning::profile_by_id(mig_capable(s)?, gi.profile_id)?;
        let value = compute_profile_info(gi_profile, profile)?;
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(info, value) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    collapse(state::with_session(|s| {
        let (_, gi) = gpu_instance_of(s, instance)?;
        let slices = compute_profile_slices(profile_id).ok_or(INVALID)?;
        let free = partitioning::free_compute_slices(mig_capable(s)?, gi);
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(count, free / slices) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> Ret {
    state::wait_out_stall(Step::CreateComputeInstance);
    if compute.is_null() {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let (gpu, gi) = {
            let (g, gi) = gpu_instance_of(s, instance)?;
            (g.index, gi.id)
        };
        let ci = s.partition(gpu, Step::CreateComputeInstance, |support, record| {
            partitioning::create_compute_instance(support, record, gi, profile_id)
        })?;
        let handle = handle_ptr(Handle::ComputeInstance { gpu, gi, ci });
        // SAFETY: non-null, valid by the caller's contract.
        Ok(unsafe { put(compute, handle) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlComputeInstanceDestroy(compute: nvmlComputeInstance_t) -> Ret {
    state::wait_out_stall(Step::DestroyComputeInstance);
    collapse(state::with_session(|s| {
        let (gpu, gi, ci) = compute_instance_of(s, compute)?;
        s.partition(gpu, Step::DestroyComputeInstance, |_, record| {
            partitioning::destroy_compute_instance(record, gi, ci)
        })?;
        Ok(SUCCESS)
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    computes: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    if count.is_null() {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let (g, gi) = gpu_instance_of(s, instance)?;
        let gi_profile = partitioning::profile_by_id(mig_capable(s)?, gi.profile_id)?;
        let room = compute_profile_info(gi_profile, profile_id)?.instanceCount;
        let found: Vec<nvmlComputeInstance_t> = gi
            .compute_instances
            .iter()
            .filter(|(_, p)| *p == profile_id)
            .map(|(ci, _)| {
                handle_ptr(Handle::ComputeInstance {
                    gpu: g.index,
                    gi: gi.id,
                    ci: *ci,
                })
            })
            .collect();
        // SAFETY: `count` is non-null; `computes` is null or holds the profile's instance count.
        Ok(unsafe { put_list(computes, room as usize, count, found) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    instance: nvmlGpuInstance_t,
    id: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> Ret {
    collapse(state::with_session(|s| {
        let (g, gi) = gpu_instance_of(s, instance)?;
        if !gi.compute_instances.iter().any(|(c, _)| *c == id) {
            return Err(NOT_FOUND);
        }
        let handle = handle_ptr(Handle::ComputeInstance {
            gpu: g.index,
            gi: gi.id,
            ci: id,
        });
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(compute, handle) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    collapse(state::with_session(|s| {
        let (gpu, gi, ci) = compute_instance_of(s, compute)?;
        let g = s.topology.gpu(gpu).ok_or(INVALID)?;
        let record = partitioning::gpu_instance(&g.mig, gi)?;
        let profile_id = record
            .compute_instances
            .iter()
            .find(|(c, _)| *c == ci)
            .map(|(_, p)| *p)
            .ok_or(INVALID)?;
        let slot = g
            .migs
            .iter()
            .position(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
            .ok_or(INVALID)?;
        let value = nvmlComputeInstanceInfo_t {
            device: handle_ptr(Handle::Mig {
                gpu,
                slot: slot as u32,
            }),
            gpuInstance: handle_ptr(Handle::GpuInstance { gpu, id: gi }),
            id: ci,
            profileId: profile_id,
            placement: nvmlComputeInstancePlacement_t {
                start: 0,
                size: compute_profile_slices(profile_id).unwrap_or(0),
            },
        };
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(info, value) })
    }))
}
