//! Exported NVML functions: device attributes (names, ids, PCI, memory, clocks, modes).

// NVML's C names are kept as they are in the header and in the bindings.
#![allow(non_snake_case, non_upper_case_globals)]

use super::*;

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
