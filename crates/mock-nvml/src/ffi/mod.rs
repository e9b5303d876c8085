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

mod attributes;
mod events;
mod mig;
mod partition;

// The tests call the exported functions by name, as a C caller would.
#[cfg(test)]
pub(crate) use {attributes::*, events::*, mig::*, partition::*};

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
