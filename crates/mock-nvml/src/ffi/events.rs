//! Exported NVML functions: event sets and the events the mock injects.

// NVML's C names are kept as they are in the header and in the bindings.
#![allow(non_snake_case, non_upper_case_globals)]

use super::*;

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
