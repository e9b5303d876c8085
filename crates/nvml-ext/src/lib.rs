//! The MIG queries `nvml-wrapper` 0.13 has no safe call for, behind safe functions.
//!
//! A static MIG device's name carries its placement (`gpu-<minor>-mig-<profile>-<giProfileId>-<start>`),
//! and its CDI spec needs the GPU- and compute-instance ids (the `nvidia-caps` access nodes live at
//! `gpu<minor>/mig/gi<id>/ci<id>`). NVML answers both through `nvmlDeviceGet{Gpu,Compute}InstanceId`
//! on the MIG device and `nvmlDeviceGetGpuInstanceById` + `nvmlGpuInstanceGetInfo` on its parent, but
//! `nvml-wrapper` exposes none of them safely; nor `nvmlDeviceGetAddressingMode`, which a device
//! attribute needs. This crate is that small audited unsafe surface: it takes
//! `nvml-wrapper` devices, calls the symbols of the library those devices were loaded from, and returns
//! plain values or `nvml-wrapper`'s own errors.

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlDeviceAddressingMode_t, nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_ATS,
    nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM,
    nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t,
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
