//! The compute time-slice, through the mock library's own calls (NVML publishes none; see the
//! crate's manifest). The library is the one `nvml-wrapper` loaded: opened again by the same
//! name with `RTLD_NOLOAD`, so nothing new is loaded.

use libloading::os::unix::{Library, RTLD_NOW, Symbol};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};
use std::os::raw::{c_int, c_uint};

/// glibc's `RTLD_NOLOAD` (`<dlfcn.h>`), which libloading does not name.
const RTLD_NOLOAD: c_int = 0x4;

type SetFn = unsafe extern "C" fn(nvmlDevice_t, c_uint) -> nvmlReturn_t;
type GetFn = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;

const SET: &[u8] = b"mockNvmlDeviceSetComputeTimeslice\0";
const GET: &[u8] = b"mockNvmlDeviceGetComputeTimeslice\0";

fn loaded() -> Result<Library, String> {
    // SAFETY: RTLD_NOLOAD only returns a library already loaded (by nvml-wrapper, whose
    // initialisers ran then); nothing is initialised again.
    unsafe { Library::open(Some("libnvidia-ml.so.1"), RTLD_NOW | RTLD_NOLOAD) }
        .map_err(|e| format!("libnvidia-ml.so.1 is not loaded: {e}"))
}

fn unsupported(e: libloading::Error) -> String {
    format!("Setting the compute time-slice is not supported by this driver library: {e}")
}

fn answer(ret: nvmlReturn_t) -> Result<(), String> {
    match ret {
        0 => Ok(()),
        4 => Err("Insufficient permissions to change the compute time-slice".into()),
        3 => Err("The compute time-slice is not supported on this device (MIG?)".into()),
        other => Err(format!("NVML error {other}")),
    }
}

/// Sets `device`'s compute time-slice (0–3).
pub fn set(device: &Device<'_>, value: c_uint) -> Result<(), String> {
    let lib = loaded()?;
    // SAFETY: the symbol is the mock's `mockNvmlDeviceSetComputeTimeslice`, whose signature is
    // `SetFn` (crates/mock-nvml/src/ffi_policy.rs).
    let call: Symbol<SetFn> = unsafe { lib.get(SET) }.map_err(unsupported)?;
    // SAFETY: the handle comes from a live `Device` borrowing the initialised `Nvml` of the same
    // library; the mock only reads it.
    answer(unsafe { call(device.handle(), value) })
}

/// Reads `device`'s compute time-slice.
pub fn get(device: &Device<'_>) -> Result<c_uint, String> {
    let lib = loaded()?;
    // SAFETY: as in `set`, for `mockNvmlDeviceGetComputeTimeslice` and `GetFn`.
    let call: Symbol<GetFn> = unsafe { lib.get(GET) }.map_err(unsupported)?;
    let mut value: c_uint = 0;
    // SAFETY: as in `set`; `value` is a local out-pointer that lives across the call.
    answer(unsafe { call(device.handle(), &mut value) })?;
    Ok(value)
}
