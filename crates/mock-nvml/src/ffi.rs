//! The exported NVML C functions.
//!
//! Safety contract, the same as NVML's: every pointer argument is null or valid for the access the
//! NVML header describes (string buffers for `length` bytes). Null out-pointers are answered with
//! `NVML_ERROR_INVALID_ARGUMENT`, handles the mock did not issue likewise.

// NVML's C names are kept as they are in the header and in the bindings.
#![allow(non_snake_case, non_upper_case_globals)]

use crate::handles::Handle;
use crate::profile::{AddressingMode, GiProfile, MigSupport};
use crate::state::{self, Device, Ret, Session};
use crate::topology::Gpu;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};

pub(crate) const SUCCESS: Ret = nvmlReturn_enum_NVML_SUCCESS;
pub(crate) const INVALID: Ret = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub(crate) const NOT_SUPPORTED: Ret = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: Ret = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: Ret = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const MIB: u64 = 1 << 20;

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> Ret {
    if out.is_null() {
        return INVALID;
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    SUCCESS
}

/// Copies `text` and a NUL into `buf`, which holds `length` bytes.
///
/// # Safety
/// `buf` is null or valid for `length` bytes of writes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, text: &str) -> Ret {
    if buf.is_null() {
        return INVALID;
    }
    if text.len() + 1 > length as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` holds at least `text.len() + 1` bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
        buf.add(text.len()).write(0);
    }
    SUCCESS
}

/// Reads a caller's C string.
///
/// # Safety
/// `text` is null or a valid NUL-terminated string.
unsafe fn read_str<'a>(text: *const c_char) -> Option<&'a str> {
    if text.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(text) }.to_str().ok()
}

fn handle_ptr<T>(handle: Handle) -> *mut T {
    std::ptr::without_provenance_mut(handle.encode())
}

pub(crate) fn collapse(result: Result<Ret, Ret>) -> Ret {
    result.unwrap_or_else(|e| e)
}

/// Resolves `device` and writes what `f` computes through `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn query<T>(
    device: nvmlDevice_t,
    out: *mut T,
    f: impl FnOnce(&Session, Device<'_>) -> Result<T, Ret>,
) -> Ret {
    collapse(state::with_session(|s| {
        let value = f(s, s.device(device as usize)?)?;
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(out, value) })
    }))
}

pub(crate) fn gpu_only(device: Device<'_>) -> Result<&Gpu, Ret> {
    match device {
        Device::Gpu(g) => Ok(g),
        Device::Mig(..) => Err(NOT_SUPPORTED),
    }
}

fn mig_capable(s: &Session) -> Result<&MigSupport, Ret> {
    s.topology.profile.mig.as_ref().ok_or(NOT_SUPPORTED)
}

fn profile_by_index(s: &Session, index: c_uint) -> Result<&GiProfile, Ret> {
    let mig = mig_capable(s)?;
    if index >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID);
    }
    mig.profiles
        .iter()
        .find(|p| p.index == index)
        .ok_or(NOT_SUPPORTED)
}

// --- Library lifetime and errors -------------------------------------------------------------

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlInit_v2() -> Ret {
    state::init()
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlInit() -> Ret {
    state::init()
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    state::init()
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlShutdown() -> Ret {
    state::shutdown()
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    error_text(result).as_ptr()
}

fn error_text(result: Ret) -> &'static CStr {
    match result {
        nvmlReturn_enum_NVML_SUCCESS => c"Success",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            c"RM has detected an NVML/RM version mismatch."
        }
        _ => c"Unknown Error",
    }
}

// --- System ----------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    collapse(state::with_session(|s| {
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put_str(version, length, &s.topology.profile.driver_version) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> Ret {
    collapse(state::with_session(|s| {
        let p = &s.topology.profile;
        let text = format!("{}.{}", p.cuda_driver_version / 1000, p.driver_version);
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put_str(version, length, &text) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    collapse(state::with_session(|s| {
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(version, s.topology.profile.cuda_driver_version) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

// --- Device handles --------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    collapse(state::with_session(|s| {
        let n = s.topology.gpus.len() as c_uint;
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(count, n) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> Ret {
    collapse(state::with_session(|s| {
        let gpu = s.topology.gpu(index).ok_or(INVALID)?;
        s.check_alive(gpu.index)?;
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(device, handle_ptr(Handle::Gpu(gpu.index))) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    let Some(uuid) = (unsafe { read_str(uuid) }) else {
        return INVALID;
    };
    collapse(state::with_session(|s| {
        let handle = s
            .topology
            .gpus
            .iter()
            .find_map(|g| {
                if g.uuid == uuid {
                    return Some(Handle::Gpu(g.index));
                }
                let slot = g.migs.iter().position(|m| m.uuid == uuid)?;
                Some(Handle::Mig {
                    gpu: g.index,
                    slot: slot as u32,
                })
            })
            .ok_or(NOT_FOUND)?;
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(device, handle_ptr(handle)) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    let Some(wanted) = (unsafe { read_str(bus_id) }) else {
        return INVALID;
    };
    let wanted = normalise_bus_id(wanted);
    collapse(state::with_session(|s| {
        let gpu = s
            .topology
            .gpus
            .iter()
            .find(|g| normalise_bus_id(&g.pci_bus_id) == wanted)
            .ok_or(NOT_FOUND)?;
        s.check_alive(gpu.index)?;
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(device, handle_ptr(Handle::Gpu(gpu.index))) })
    }))
}

/// NVML accepts bus ids with a 4- or 8-digit domain in either case.
fn normalise_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) => {
            format!(
                "{:08x}:{rest}",
                u32::from_str_radix(domain, 16).unwrap_or(u32::MAX)
            )
        }
        None => id,
    }
}

// --- Device attributes -----------------------------------------------------------------------

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    collapse(state::with_session(|s| {
        let product = &s.topology.profile.name;
        let text = match s.device(device as usize)? {
            Device::Gpu(_) => product.clone(),
            Device::Mig(_, m) => format!("{product} MIG {}", m.profile.name),
        };
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put_str(name, length, &text) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    collapse(state::with_session(|s| {
        let text = match s.device(device as usize)? {
            Device::Gpu(g) => &g.uuid,
            Device::Mig(_, m) => &m.uuid,
        };
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put_str(uuid, length, text) })
    }))
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe { query(device, index, |_, d| Ok(d.gpu().index)) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe { query(device, minor, |_, d| Ok(gpu_only(d)?.minor)) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, pci, |s, d| {
            Ok(pci_info(d.gpu(), s.topology.profile.pci_device_id))
        })
    }
}

fn pci_info(gpu: &Gpu, device_id: u32) -> nvmlPciInfo_t {
    let mut legacy = [0 as c_char; 16];
    let mut full = [0 as c_char; 32];
    let short = format!("{:04X}:{:02X}:00.0", gpu.pci_domain, gpu.pci_bus);
    for (dst, src) in legacy.iter_mut().zip(short.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in full.iter_mut().zip(gpu.pci_bus_id.bytes()) {
        *dst = src as c_char;
    }
    nvmlPciInfo_t {
        busIdLegacy: legacy,
        domain: gpu.pci_domain,
        bus: gpu.pci_bus,
        device: 0,
        pciDeviceId: (device_id << 16) | 0x10de,
        pciSubSystemId: (0x1463 << 16) | 0x10de,
        busId: full,
    }
}

fn memory_mib(s: &Session, d: Device<'_>) -> u64 {
    match d {
        Device::Gpu(_) => s.topology.profile.memory_mib,
        Device::Mig(_, m) => m.profile.memory_mib,
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, memory, |s, d| {
            let total = memory_mib(s, d) * MIB;
            let reserved = if matches!(d, Device::Gpu(_)) {
                512 * MIB
            } else {
                0
            };
            Ok(nvmlMemory_v2_t {
                version: 0x0200_0028,
                total,
                reserved,
                free: total - reserved,
                used: 0,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, memory, |s, d| {
            let total = memory_mib(s, d) * MIB;
            Ok(nvmlMemory_t {
                total,
                free: total,
                used: 0,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut nvmlBrandType_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe { query(device, brand, |s, _| Ok(s.topology.profile.brand)) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe { query(device, arch, |s, _| Ok(s.topology.profile.architecture)) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    if minor.is_null() {
        return INVALID;
    }
    // SAFETY: forwarded caller contract; `minor` was checked for null.
    unsafe {
        query(device, major, |s, _| {
            let [ma, mi] = s.topology.profile.compute_capability;
            minor.write(mi);
            Ok(ma)
        })
    }
}

/// `NVML_STRUCT_VERSION(DeviceAddressingMode, 1)`: the struct's size and version 1 in the top byte.
const ADDRESSING_MODE_V1: c_uint = size_of::<nvmlDeviceAddressingMode_t>() as c_uint | (1 << 24);

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetAddressingMode(
    device: nvmlDevice_t,
    mode: *mut nvmlDeviceAddressingMode_t,
) -> Ret {
    if mode.is_null() {
        return INVALID;
    }
    // SAFETY: non-null and valid for reads and writes by the caller's contract.
    if unsafe { (*mode).version } != ADDRESSING_MODE_V1 {
        return nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: as above; `value` is a field of the caller's struct. A MIG device answers for its GPU.
    unsafe {
        query(device, &raw mut (*mode).value, |s, _| {
            match s.topology.profile.addressing_mode.ok_or(NOT_SUPPORTED)? {
                AddressingMode::None => {
                    Ok(nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE)
                }
                AddressingMode::Hmm => {
                    Ok(nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM)
                }
                AddressingMode::Ats => {
                    Ok(nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_ATS)
                }
            }
        })
    }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe {
        query(device, attributes, |s, d| {
            let p = match d {
                Device::Mig(_, m) => &m.profile,
                Device::Gpu(_) => {
                    let full = mig_capable(s)
                        .ok()
                        .and_then(|m| m.profiles.iter().max_by_key(|p| p.slices));
                    return Ok(nvmlDeviceAttributes_t {
                        multiprocessorCount: s.topology.profile.multiprocessors,
                        sharedCopyEngineCount: full.map_or(0, |p| p.copy_engines),
                        sharedDecoderCount: full.map_or(0, |p| p.decoders),
                        sharedEncoderCount: full.map_or(0, |p| p.encoders),
                        sharedJpegCount: full.map_or(0, |p| p.jpeg),
                        sharedOfaCount: full.map_or(0, |p| p.ofa),
                        gpuInstanceSliceCount: 0,
                        computeInstanceSliceCount: 0,
                        memorySizeMB: s.topology.profile.memory_mib,
                    });
                }
            };
            Ok(nvmlDeviceAttributes_t {
                multiprocessorCount: p.multiprocessors,
                sharedCopyEngineCount: p.copy_engines,
                sharedDecoderCount: p.decoders,
                sharedEncoderCount: p.encoders,
                sharedJpegCount: p.jpeg,
                sharedOfaCount: p.ofa,
                gpuInstanceSliceCount: p.slices,
                computeInstanceSliceCount: p.slices,
                memorySizeMB: p.memory_mib,
            })
        })
    }
}

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
            gpu_only(d)?;
            mig_capable(s)?;
            let mode = c_uint::from(s.topology.mig_enabled());
            pending.write(mode);
            Ok(mode)
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
        query(device, mig, |s, d| {
            let gpu = gpu_only(d).map_err(|_| INVALID)?;
            if !s.topology.mig_enabled() {
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
            gpu.migs
                .iter()
                .find(|m| m.gpu_instance_id == id)
                .ok_or(NOT_FOUND)?;
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
        let Some(Handle::GpuInstance { gpu, id }) = Handle::decode(instance as usize) else {
            return Err(INVALID);
        };
        let g = s.topology.gpu(gpu).ok_or(INVALID)?;
        s.check_alive(gpu)?;
        let m = g
            .migs
            .iter()
            .find(|m| m.gpu_instance_id == id)
            .ok_or(INVALID)?;
        let value = nvmlGpuInstanceInfo_t {
            device: handle_ptr(Handle::Gpu(gpu)),
            id,
            profileId: m.profile.id,
            placement: nvmlGpuInstancePlacement_t {
                start: m.start,
                size: m.profile.placement_size,
            },
        };
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(info, value) })
    }))
}

// --- Events ----------------------------------------------------------------------------------

const SUPPORTED_EVENTS: u64 = (nvmlEventTypeXidCriticalError
    | nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError) as u64;

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    // SAFETY: forwarded caller contract.
    unsafe { query(device, types, |_, _| Ok(SUPPORTED_EVENTS)) }
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    if set.is_null() {
        return INVALID;
    }
    collapse(state::with_session(|s| {
        let n = s.create_event_set();
        // SAFETY: forwarded caller contract.
        Ok(unsafe { put(set, handle_ptr(Handle::EventSet(n))) })
    }))
}

fn event_set_number(set: nvmlEventSet_t) -> Result<u32, Ret> {
    match Handle::decode(set as usize) {
        Some(Handle::EventSet(n)) => Ok(n),
        _ => Err(INVALID),
    }
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    let result = state::with_session(|s| {
        let gpu = gpu_only(s.device(device as usize)?)?.index;
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NOT_SUPPORTED);
        }
        s.register(event_set_number(set)?, gpu, types)?;
        Ok(SUCCESS)
    });
    state::notify_events();
    collapse(result)
}

#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    if data.is_null() {
        return INVALID;
    }
    let waited = event_set_number(set).and_then(|n| state::wait_event(n, timeout_ms));
    match waited {
        Ok((device, event)) => {
            let value = nvmlEventData_t {
                device: handle_ptr(device),
                eventType: event.event_type,
                eventData: event.data,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            };
            // SAFETY: forwarded caller contract.
            unsafe { put(data, value) }
        }
        Err(e) => e,
    }
}

#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    collapse(state::with_session(|s| {
        s.free_event_set(event_set_number(set)?)?;
        Ok(SUCCESS)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_across_domain_width_and_case() {
        assert_eq!(
            normalise_bus_id("0000:0f:00.0"),
            normalise_bus_id("00000000:0F:00.0")
        );
        assert_ne!(
            normalise_bus_id("0000:0f:00.0"),
            normalise_bus_id("0000:07:00.0")
        );
    }

    #[test]
    fn strings_that_do_not_fit_are_refused() {
        let mut buf = [0 as c_char; 4];
        // SAFETY: `buf` holds 4 bytes.
        assert_eq!(
            unsafe { put_str(buf.as_mut_ptr(), 4, "abcd") },
            INSUFFICIENT_SIZE
        );
        // SAFETY: as above.
        assert_eq!(unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }, SUCCESS);
        assert_eq!(buf[3], 0);
    }

    #[test]
    fn every_code_the_mock_returns_has_a_text() {
        for code in [
            INVALID,
            NOT_SUPPORTED,
            NOT_FOUND,
            INSUFFICIENT_SIZE,
            nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        ] {
            assert_ne!(error_text(code), c"Unknown Error");
        }
    }
}
