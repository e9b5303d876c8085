//! The MIG calls `nvml-wrapper` 0.13 has no safe (or no working) call for, behind safe functions.
//!
//! A static MIG device's name carries its placement
//! (`gpu-<minor>-mig-<profile>-<giProfileId>-<start>`), and its CDI spec needs the GPU- and
//! compute-instance ids (the `nvidia-caps` access nodes live at `gpu<minor>/mig/gi<id>/ci<id>`).
//! NVML answers both through `nvmlDeviceGet{Gpu,Compute}InstanceId` on the MIG device and
//! `nvmlDeviceGetGpuInstanceById` + `nvmlGpuInstanceGetInfo` on its parent, but `nvml-wrapper`
//! exposes none of them safely; nor `nvmlDeviceGetAddressingMode`, which a device attribute needs.
//! Dynamic MIG creates and destroys GPU and compute instances and lists what a GPU holds, none of
//! which `nvml-wrapper` offers; its `possible_placements` returns an empty list (it never sets the
//! length of the vector NVML fills). This crate is that small audited unsafe surface: it takes
//! `nvml-wrapper` devices, calls the symbols of the library those devices were loaded from, and
//! returns plain values or `nvml-wrapper`'s own errors.

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDeviceAddressingMode_t, nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_ATS,
    nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM,
    nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
};
use std::os::raw::c_uint;

/// Where a MIG device sits on its GPU, and which instances back it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigInstance {
    /// GPU-instance id (`nvidia-smi mig -lgi` ID).
    pub gpu_instance_id: u32,
    /// Compute-instance id within the GPU instance.
    pub compute_instance_id: u32,
    /// The GPU instance's profile id, as NVML reports it for the instance.
    pub gpu_instance_profile_id: u32,
    /// First memory slice of the GPU instance.
    pub placement_start: u32,
    /// Number of memory slices the GPU instance spans.
    pub placement_size: u32,
}

/// Reads the instance ids and placement of `mig`, a MIG device handle (from
/// [`Device::mig_device_by_index`]), from the library `mig` was loaded from.
///
/// Errors are NVML's: `NotSupported` or `InvalidArg` when `mig` is not a MIG device, `NotFound` when
/// its GPU instance is gone, `FailedToLoadSymbol` when the library lacks one of the calls (drivers
/// before R450).
pub fn mig_instance(mig: &Device<'_>) -> Result<MigInstance, NvmlError> {
    let lib = mig.nvml().lib();
    let parent = mig.mig_parent_device()?;
    let get_gi_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?;
    let get_ci_id = nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?;
    let get_gi = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_gi_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;

    // SAFETY: both handles come from live `Device`s that borrow the initialised `Nvml` whose library
    // the symbols were loaded from; NVML only reads a handle. Nothing here outlives those borrows.
    let (mig_handle, parent_handle) = unsafe { (mig.handle(), parent.handle()) };
    let mut gpu_instance_id: c_uint = 0;
    let mut compute_instance_id: c_uint = 0;
    // SAFETY: the symbols have the signatures of the NVML header nvml-wrapper-sys is generated from;
    // each out-pointer is a local `c_uint` that lives across the call.
    unsafe {
        nvml_try(get_gi_id(mig_handle, &mut gpu_instance_id))?;
        nvml_try(get_ci_id(mig_handle, &mut compute_instance_id))?;
    }
    let mut gpu_instance: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: as above; `gpu_instance` is a local out-pointer NVML fills with an opaque handle.
    unsafe { nvml_try(get_gi(parent_handle, gpu_instance_id, &mut gpu_instance))? };
    // SAFETY: `nvmlGpuInstanceInfo_t` is a plain C struct (a pointer and integers) for which all zero
    // bytes are a valid value; NVML overwrites it.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gpu_instance` was just returned by NVML for this parent; `info` is a local out-pointer.
    unsafe { nvml_try(get_gi_info(gpu_instance, &mut info))? };
    Ok(MigInstance {
        gpu_instance_id,
        compute_instance_id,
        gpu_instance_profile_id: info.profileId,
        placement_start: info.placement.start,
        placement_size: info.placement.size,
    })
}

/// Whether `a` and `b` are the same NVML device handle. An event names its device by handle, and
/// a GPU that has fallen off the bus answers no query (its UUID included): comparing handles
/// with the ones registered tells which GPU the event is about.
pub fn same_handle(a: &Device<'_>, b: &Device<'_>) -> bool {
    // SAFETY: the handles are only compared, never dereferenced or passed to NVML.
    unsafe { a.handle() == b.handle() }
}

/// How a GPU addresses system memory (`nvmlDeviceAddressingModeType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressingMode {
    /// Neither of the two below.
    None,
    /// Heterogeneous memory management.
    Hmm,
    /// Address translation services (Grace-based systems).
    Ats,
}

impl AddressingMode {
    /// The name NVML's tools and the upstream DRA driver's `addressingMode` attribute use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Hmm => "HMM",
            Self::Ats => "ATS",
        }
    }
}

/// Reads `device`'s addressing mode. `Ok(None)` where the library lacks the call (drivers before
/// R570) or NVML answers `NotSupported` (a platform without coherent memory access); a value NVML
/// did not define is `UnexpectedVariant`.
pub fn addressing_mode(device: &Device<'_>) -> Result<Option<AddressingMode>, NvmlError> {
    let Ok(get) = nvml_sym(device.nvml().lib().nvmlDeviceGetAddressingMode.as_ref()) else {
        return Ok(None);
    };
    let mut mode = nvmlDeviceAddressingMode_t {
        // NVML_STRUCT_VERSION(DeviceAddressingMode, 1): the struct's size, version 1 in the top byte.
        version: size_of::<nvmlDeviceAddressingMode_t>() as c_uint | (1 << 24),
        value: 0,
    };
    // SAFETY: the handle comes from a live `Device` borrowing the initialised `Nvml` whose library
    // the symbol was loaded from; `mode` is a local out-pointer of the header's type.
    match nvml_try(unsafe { get(device.handle(), &mut mode) }) {
        Ok(()) => {}
        Err(NvmlError::NotSupported) => return Ok(None),
        Err(e) => return Err(e),
    }
    #[allow(non_upper_case_globals)]
    match mode.value {
        nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE => {
            Ok(Some(AddressingMode::None))
        }
        nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM => {
            Ok(Some(AddressingMode::Hmm))
        }
        nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_ATS => {
            Ok(Some(AddressingMode::Ats))
        }
        other => Err(NvmlError::UnexpectedVariant(other)),
    }
}

/// Where a GPU instance sits: its first memory slice and how many it spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Memory slices spanned.
    pub size: u32,
}

/// A GPU instance on a GPU and its compute instances, as NVML lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    /// GPU-instance id.
    pub id: u32,
    /// GPU-instance profile id (`nvidia-smi mig -lgip` ID).
    pub profile_id: u32,
    /// Where it sits.
    pub placement: Placement,
    /// Ids of its compute instances.
    pub compute_instances: Vec<u32>,
}

/// The placements a GPU-instance profile (by the id its profile info reports) can take on
/// `device`. NVML lists them whether or not MIG is on (drivers from R550; older ones answer
/// `NotSupported` while it is off).
pub fn possible_placements(
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<Placement>, NvmlError> {
    let get = nvml_sym(
        device
            .nvml()
            .lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut count: c_uint = 0;
    // SAFETY: the handle comes from a live `Device` borrowing the initialised `Nvml` whose library
    // the symbol was loaded from; a null array asks for the count only, written to a local.
    unsafe {
        nvml_try(get(
            device.handle(),
            profile_id,
            std::ptr::null_mut(),
            &mut count,
        ))?;
    }
    let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: as above; `placements` holds `count` entries and NVML writes at most that many,
    // reporting how many it wrote in `count`.
    unsafe {
        nvml_try(get(
            device.handle(),
            profile_id,
            placements.as_mut_ptr(),
            &mut count,
        ))?;
    }
    placements.truncate(count as usize);
    Ok(placements
        .into_iter()
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

/// Creates a GPU instance of profile `profile_id` at `placement` on `device` (MIG on); answers
/// its id. An occupied placement is NVML's `InsufficientResources`.
pub fn create_gpu_instance(
    device: &Device<'_>,
    profile_id: u32,
    placement: Placement,
) -> Result<u32, NvmlError> {
    let lib = device.nvml().lib();
    let create = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    let wanted = nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut instance: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: the handle comes from a live `Device` borrowing the initialised `Nvml` whose library
    // the symbols were loaded from; `wanted` and `instance` are locals that outlive the call.
    unsafe { nvml_try(create(device.handle(), profile_id, &wanted, &mut instance))? };
    // SAFETY: `nvmlGpuInstanceInfo_t` is plain C data for which all zero bytes are valid; NVML
    // overwrites it. `instance` was just returned by NVML.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { nvml_try(get_info(instance, &mut info))? };
    Ok(info.id)
}

/// The GPU instance `gi` of `device`.
fn gpu_instance_handle(device: &Device<'_>, gi: u32) -> Result<nvmlGpuInstance_t, NvmlError> {
    let get = nvml_sym(device.nvml().lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut instance: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: the handle comes from a live `Device` borrowing the initialised `Nvml` whose library
    // the symbol was loaded from; `instance` is a local out-pointer.
    unsafe { nvml_try(get(device.handle(), gi, &mut instance))? };
    Ok(instance)
}

/// Creates, in GPU instance `gi` of `device`, a compute instance of the compute-instance profile
/// `profile` (an `NVML_COMPUTE_INSTANCE_PROFILE_*` value) with shared engines; answers its id.
pub fn create_compute_instance(
    device: &Device<'_>,
    gi: u32,
    profile: u32,
) -> Result<u32, NvmlError> {
    let lib = device.nvml().lib();
    let get_profile = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
    let create = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let get_info = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let instance = gpu_instance_handle(device, gi)?;
    // SAFETY: plain C data for which all zero bytes are valid; NVML overwrites it.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `instance` was just returned by NVML for this device; `info` is a local.
    unsafe {
        nvml_try(get_profile(
            instance,
            profile,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        ))?;
    }
    let mut compute: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: as above; the profile id is the one NVML reported; `compute` is a local.
    unsafe { nvml_try(create(instance, info.id, &mut compute))? };
    // SAFETY: plain C data for which all zero bytes are valid; NVML overwrites it.
    let mut created: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `compute` was just returned by NVML; `created` is a local.
    unsafe { nvml_try(get_info(compute, &mut created))? };
    Ok(created.id)
}

/// Destroys compute instance `ci` of GPU instance `gi` on `device`. One already gone is NVML's
/// `NotFound`.
pub fn destroy_compute_instance(device: &Device<'_>, gi: u32, ci: u32) -> Result<(), NvmlError> {
    let lib = device.nvml().lib();
    let get = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
    let destroy = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())?;
    let instance = gpu_instance_handle(device, gi)?;
    let mut compute: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: `instance` was just returned by NVML for this device; `compute` is a local.
    unsafe { nvml_try(get(instance, ci, &mut compute))? };
    // SAFETY: `compute` was just returned by NVML.
    unsafe { nvml_try(destroy(compute)) }
}

/// Destroys GPU instance `gi` on `device` (its compute instances destroyed first). One already
/// gone is NVML's `NotFound`.
pub fn destroy_gpu_instance(device: &Device<'_>, gi: u32) -> Result<(), NvmlError> {
    let destroy = nvml_sym(device.nvml().lib().nvmlGpuInstanceDestroy.as_ref())?;
    let instance = gpu_instance_handle(device, gi)?;
    // SAFETY: `instance` was just returned by NVML for this device.
    unsafe { nvml_try(destroy(instance)) }
}

/// Every GPU instance on `device` of the given GPU-instance profile ids, with the ids of its
/// compute instances (any compute-instance profile), ordered by id. MIG off: none.
pub fn gpu_instances(
    device: &Device<'_>,
    profile_ids: &[u32],
) -> Result<Vec<GpuInstance>, NvmlError> {
    let lib = device.nvml().lib();
    let list = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    let get_profile = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
    let list_compute = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let get_compute_info = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let mut found = Vec::new();
    for &profile_id in profile_ids {
        // NVML wants room for as many instances as a profile allows; no GPU has more than 8.
        let mut instances: [nvmlGpuInstance_t; 8] = [std::ptr::null_mut(); 8];
        let mut count: c_uint = instances.len() as c_uint;
        // SAFETY: the handle comes from a live `Device` borrowing the initialised `Nvml`;
        // `instances` holds 8 entries and `count` is a local.
        match nvml_try(unsafe {
            list(
                device.handle(),
                profile_id,
                instances.as_mut_ptr(),
                &mut count,
            )
        }) {
            Ok(()) => {}
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(e),
        }
        for &instance in instances.iter().take(count as usize) {
            // SAFETY: plain C data, all-zero valid; NVML overwrites it. `instance` came from NVML.
            let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { nvml_try(get_info(instance, &mut info))? };
            let mut compute_instances = Vec::new();
            for ci_profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
                // SAFETY: plain C data, all-zero valid; NVML overwrites it.
                let mut ci_info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `instance` came from NVML; `ci_info` is a local.
                let known = unsafe {
                    get_profile(
                        instance,
                        ci_profile,
                        NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                        &mut ci_info,
                    )
                };
                if nvml_try(known).is_err() {
                    continue;
                }
                let mut computes: [nvmlComputeInstance_t; 8] = [std::ptr::null_mut(); 8];
                let mut n: c_uint = computes.len() as c_uint;
                // SAFETY: `computes` holds 8 entries (a GPU instance has at most 8 compute
                // slices); `n` is a local.
                unsafe {
                    nvml_try(list_compute(
                        instance,
                        ci_info.id,
                        computes.as_mut_ptr(),
                        &mut n,
                    ))?
                };
                for &compute in computes.iter().take(n as usize) {
                    // SAFETY: plain C data, all-zero valid; NVML overwrites it.
                    let mut c: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                    // SAFETY: `compute` came from NVML; `c` is a local.
                    unsafe { nvml_try(get_compute_info(compute, &mut c))? };
                    compute_instances.push(c.id);
                }
            }
            compute_instances.sort_unstable();
            compute_instances.dedup();
            found.push(GpuInstance {
                id: info.id,
                profile_id: info.profileId,
                placement: Placement {
                    start: info.placement.start,
                    size: info.placement.size,
                },
                compute_instances,
            });
        }
    }
    found.sort_by_key(|gi| gi.id);
    Ok(found)
}
