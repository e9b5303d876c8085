//! The exported functions called in-process, the way a C caller would, against shipped profiles.
// NVML's C names are kept as they are in the header and in the bindings.
#![allow(non_upper_case_globals)]

use crate::config::{Config, EccEvent, EccKind, Faults, XidEvent};
use crate::ffi::*;
use crate::ffi_policy::*;
use crate::state;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, CString, c_char, c_uint};
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

/// The library state is process-wide, so these tests take turns.
static TURN: Mutex<()> = Mutex::new(());

struct Session(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for Session {
    fn drop(&mut self) {
        while nvmlShutdown() == nvmlReturn_enum_NVML_SUCCESS {}
    }
}

fn start(profile: &str, gpu_count: u32, faults: Faults) -> Session {
    let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = Config {
        profile: Some(profile.into()),
        gpu_count: Some(gpu_count),
        faults,
        ..Config::default()
    };
    assert_eq!(state::init_with(cfg), nvmlReturn_enum_NVML_SUCCESS);
    Session(turn)
}

fn device(index: c_uint) -> nvmlDevice_t {
    let mut d = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(index, &mut d) },
        nvmlReturn_enum_NVML_SUCCESS
    );
    d
}

fn uuid(d: nvmlDevice_t) -> String {
    let mut buf = [0 as c_char; 96];
    // SAFETY: `buf` holds 96 bytes.
    assert_eq!(
        unsafe { nvmlDeviceGetUUID(d, buf.as_mut_ptr(), 96) },
        nvmlReturn_enum_NVML_SUCCESS
    );
    // SAFETY: NUL-terminated by the call.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn mig(parent: nvmlDevice_t, index: c_uint) -> Result<nvmlDevice_t, nvmlReturn_t> {
    let mut d = null_mut();
    // SAFETY: valid out-pointer.
    match unsafe { nvmlDeviceGetMigDeviceHandleByIndex(parent, index, &mut d) } {
        nvmlReturn_enum_NVML_SUCCESS => Ok(d),
        e => Err(e),
    }
}

#[test]
fn mig_devices_report_their_instance_ids_and_placements() {
    let _s = start("a100-sxm4-40gb-mig-mixed", 2, Faults::default());
    let gpu = device(1);
    let (mut current, mut pending) = (0, 0);
    // SAFETY: valid out-pointers.
    assert_eq!(
        unsafe { nvmlDeviceGetMigMode(gpu, &mut current, &mut pending) },
        0
    );
    assert_eq!((current, pending), (1, 1));
    let expected = [(1, 9, 0, 4), (5, 14, 4, 2), (13, 19, 6, 1)];
    for (slot, (gi_id, profile_id, start, size)) in expected.into_iter().enumerate() {
        let m = mig(gpu, slot as c_uint).unwrap();
        let (mut gi, mut ci) = (0, 7);
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(nvmlDeviceGetGpuInstanceId(m, &mut gi), 0);
            assert_eq!(nvmlDeviceGetComputeInstanceId(m, &mut ci), 0);
        }
        assert_eq!((gi, ci), (gi_id, 0));
        let mut instance = null_mut();
        // SAFETY: valid out-pointers; the info struct is plain data.
        let info = unsafe {
            assert_eq!(nvmlDeviceGetGpuInstanceById(gpu, gi, &mut instance), 0);
            let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
            assert_eq!(nvmlGpuInstanceGetInfo(instance, &mut info), 0);
            info
        };
        assert_eq!(
            (
                info.id,
                info.profileId,
                info.placement.start,
                info.placement.size
            ),
            (gi_id, profile_id, start, size)
        );
        assert_eq!(info.device, gpu);
        let mut parent = null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(
            unsafe { nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, &mut parent) },
            0
        );
        assert_eq!(parent, gpu);
    }
    assert_eq!(mig(gpu, 3), Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND));
}

#[test]
fn possible_placements_follow_the_profile_and_the_buffer_protocol() {
    let _s = start("a100-sxm4-40gb", 1, Faults::default());
    let gpu = device(0);
    let mut count: c_uint = 0;
    let mut buf = [nvmlGpuInstancePlacement_t {
        start: 99,
        size: 99,
    }; 8];
    // SAFETY: valid pointers; `buf` holds `count` entries when passed.
    unsafe {
        assert_eq!(
            nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 9, null_mut(), &mut count),
            0
        );
        assert_eq!(count, 2);
        count = 1;
        assert_eq!(
            nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 9, buf.as_mut_ptr(), &mut count),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        count = 8;
        assert_eq!(
            nvmlDeviceGetGpuInstancePossiblePlacements_v2(gpu, 15, buf.as_mut_ptr(), &mut count),
            0
        );
    }
    let got: Vec<_> = buf[..count as usize]
        .iter()
        .map(|p| (p.start, p.size))
        .collect();
    assert_eq!(got, vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
    // MIG is off on this profile, so there are no MIG devices to hand out.
    assert_eq!(
        mig(gpu, 0),
        Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    );
}

#[test]
fn unknown_handles_and_names_get_nvml_errors() {
    let _s = start("l4", 1, Faults::default());
    let bogus = std::ptr::without_provenance_mut::<nvmlDevice_st>(0x1234);
    let mut minor = 0;
    let (mut current, mut pending) = (0, 0);
    let mut d = null_mut();
    let unknown = CString::new("GPU-00000000-0000-0000-0000-000000000000").unwrap();
    let bus = CString::new("0000:07:00.0").unwrap();
    // SAFETY: valid out-pointers and C strings.
    unsafe {
        assert_eq!(
            nvmlDeviceGetMinorNumber(bogus, &mut minor),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMinorNumber(null_mut(), &mut minor),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(1, &mut d),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByUUID(unknown.as_ptr(), &mut d),
            nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetMigMode(device(0), &mut current, &mut pending),
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(nvmlDeviceGetHandleByPciBusId_v2(bus.as_ptr(), &mut d), 0);
    }
    assert_eq!(d, device(0));
    let known = CString::new(uuid(d)).unwrap();
    let mut again = null_mut();
    // SAFETY: valid out-pointer and C string.
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByUUID(known.as_ptr(), &mut again) },
        0
    );
    assert_eq!(again, d);
}

#[test]
fn init_is_counted_and_calls_after_the_last_shutdown_are_uninitialised() {
    let s = start("t4", 1, Faults::default());
    assert_eq!(nvmlInit_v2(), 0);
    assert_eq!(nvmlShutdown(), 0);
    let mut count = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, 0);
    assert_eq!(count, 1);
    assert_eq!(nvmlShutdown(), 0);
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { nvmlDeviceGetCount_v2(&mut count) },
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
    );
    assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    drop(s);
}

#[test]
fn events_go_to_sets_that_registered_their_gpu_and_type() {
    let faults = Faults {
        xid_events: vec![XidEvent { gpu: 1, xid: 79 }],
        ecc_events: vec![EccEvent {
            gpu: 0,
            kind: EccKind::DoubleBit,
        }],
        ..Faults::default()
    };
    let _s = start("h100-sxm5-80gb", 2, faults);
    let (mut only0, mut only1) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers; the event data struct is plain data.
    unsafe {
        assert_eq!(nvmlEventSetCreate(&mut only0), 0);
        assert_eq!(nvmlEventSetCreate(&mut only1), 0);
        let xid = u64::from(nvmlEventTypeXidCriticalError);
        assert_eq!(nvmlDeviceRegisterEvents(device(0), xid, only0), 0);
        assert_eq!(nvmlDeviceRegisterEvents(device(1), xid, only1), 0);
        let mut data: nvmlEventData_t = std::mem::zeroed();
        assert_eq!(
            nvmlEventSetWait_v2(only0, &mut data, 10),
            nvmlReturn_enum_NVML_ERROR_TIMEOUT
        );
        assert_eq!(nvmlEventSetWait_v2(only1, &mut data, 1000), 0);
        assert_eq!(
            (data.device, data.eventData, data.eventType),
            (device(1), 79, xid)
        );
        assert_eq!(
            nvmlEventSetWait_v2(only1, &mut data, 10),
            nvmlReturn_enum_NVML_ERROR_TIMEOUT
        );
        // GPU 0's double-bit ECC event waited for a set registered for that type.
        let dbe = u64::from(nvmlEventTypeDoubleBitEccError);
        assert_eq!(nvmlDeviceRegisterEvents(device(0), dbe, only0), 0);
        assert_eq!(nvmlEventSetWait_v2(only0, &mut data, 1000), 0);
        assert_eq!((data.device, data.eventType), (device(0), dbe));
        assert_eq!(nvmlEventSetFree(only0), 0);
        assert_eq!(
            nvmlEventSetFree(only0),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn the_compute_policy_is_kept_per_gpu_and_mig_devices_have_none() {
    let _s = start("a100-sxm4-40gb-mig-mixed", 2, Faults::default());
    let (gpu0, gpu1) = (device(0), device(1));
    let timeslice = |d| {
        let mut value: c_uint = 9;
        // SAFETY: valid out-pointer.
        let ret = unsafe { mockNvmlDeviceGetComputeTimeslice(d, &mut value) };
        (ret, value)
    };
    assert_eq!(timeslice(gpu0), (nvmlReturn_enum_NVML_SUCCESS, 0));
    assert_eq!(mockNvmlDeviceSetComputeTimeslice(gpu0, 1), 0);
    assert_eq!(timeslice(gpu0), (nvmlReturn_enum_NVML_SUCCESS, 1));
    assert_eq!(timeslice(gpu1), (nvmlReturn_enum_NVML_SUCCESS, 0));
    assert_eq!(
        mockNvmlDeviceSetComputeTimeslice(mig(gpu1, 0).unwrap(), 1),
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
    );
    assert_eq!(nvmlDeviceSetComputeMode(gpu1, 3), 0);
    let mut mode = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { nvmlDeviceGetComputeMode(gpu1, &mut mode) }, 0);
    assert_eq!(mode, 3);
}

#[test]
fn lost_gpus_answer_gpu_is_lost() {
    let faults = Faults {
        lost_gpus: vec![0],
        ..Faults::default()
    };
    let _s = start("gb200", 2, faults);
    let mut d = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(0, &mut d) },
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST
    );
    assert!(uuid(device(1)).starts_with("GPU-"));
}

#[test]
fn many_threads_read_at_once() {
    let _s = start("a100-sxm4-40gb-mig-mixed", 8, Faults::default());
    let expected: Vec<_> = (0..8).map(|i| uuid(device(i))).collect();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..200 {
                    for (i, want) in expected.iter().enumerate() {
                        let d = device(i as c_uint);
                        assert_eq!(&uuid(d), want);
                        assert!(mig(d, 2).is_ok());
                    }
                }
            });
        }
    });
}

#[test]
fn a_driver_root_of_another_version_reports_it() {
    let driver_version = |cfg: Config| {
        let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(state::init_with(cfg), nvmlReturn_enum_NVML_SUCCESS);
        let _session = Session(turn);
        let mut buf = [0 as c_char; 80];
        // SAFETY: a buffer of the length given.
        let ret = unsafe { nvmlSystemGetDriverVersion(buf.as_mut_ptr(), buf.len() as c_uint) };
        assert_eq!(ret, nvmlReturn_enum_NVML_SUCCESS);
        // SAFETY: NUL-terminated by the call.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    let profile = Config {
        profile: Some("l4".into()),
        ..Config::default()
    };
    assert_eq!(driver_version(profile.clone()), "580.95.05");
    let newer = Config {
        driver_version: Some("590.48.01".into()),
        ..profile
    };
    assert_eq!(driver_version(newer), "590.48.01");
}

/// Creates a GPU instance of `profile_id` at `start` (placement size `size`) on `gpu`.
fn create_gi(
    gpu: nvmlDevice_t,
    profile_id: c_uint,
    start: c_uint,
    size: c_uint,
) -> Result<nvmlGpuInstance_t, nvmlReturn_t> {
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi = null_mut();
    // SAFETY: valid pointers.
    match unsafe { nvmlDeviceCreateGpuInstanceWithPlacement(gpu, profile_id, &placement, &mut gi) }
    {
        nvmlReturn_enum_NVML_SUCCESS => Ok(gi),
        e => Err(e),
    }
}

/// Creates the compute instance spanning all of `gi`, `slices` compute slices, the way a caller
/// does: the profile info first, then the instance of the id it reports.
fn create_ci(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
) -> Result<nvmlComputeInstance_t, nvmlReturn_t> {
    // SAFETY: the info struct is plain data; valid out-pointers.
    unsafe {
        let mut info: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
        let ret = nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi,
            profile,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        );
        if ret != 0 {
            return Err(ret);
        }
        let mut ci = null_mut();
        match nvmlGpuInstanceCreateComputeInstance(gi, info.id, &mut ci) {
            nvmlReturn_enum_NVML_SUCCESS => Ok(ci),
            e => Err(e),
        }
    }
}

fn mig_on(gpu: nvmlDevice_t) -> nvmlReturn_t {
    let mut activation = 99;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { nvmlDeviceSetMigMode(gpu, 1, &mut activation) }, 0);
    activation
}

#[test]
fn a_gpu_is_partitioned_and_cleared_through_the_c_calls() {
    let _s = start("h100-sxm5-80gb", 1, Faults::default());
    let gpu = device(0);
    assert_eq!(
        create_gi(gpu, 9, 4, 4),
        Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        "MIG is off"
    );
    assert_eq!(mig_on(gpu), 0, "Hopper changes mode without a reset");
    let three = create_gi(gpu, 9, 4, 4).unwrap();
    assert_eq!(
        create_gi(gpu, 19, 5, 1),
        Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        create_gi(gpu, 9, 4, 2),
        Err(INVALID),
        "wrong placement size"
    );
    let three_ci = create_ci(three, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE).unwrap();
    let one = create_gi(gpu, 19, 0, 1).unwrap();
    create_ci(one, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE).unwrap();

    let uuids: Vec<String> = (0..2).map(|i| uuid(mig(gpu, i).unwrap())).collect();
    assert!(uuids.iter().all(|u| u.starts_with("MIG-")) && uuids[0] != uuids[1]);
    assert_eq!(mig(gpu, 2), Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND));

    // SAFETY: plain-data info struct; valid pointers and array sizes.
    unsafe {
        let mut info: nvmlComputeInstanceInfo_t = std::mem::zeroed();
        assert_eq!(nvmlComputeInstanceGetInfo_v2(three_ci, &mut info), 0);
        assert_eq!((info.gpuInstance, info.id, info.profileId), (three, 0, 2));
        let mut id = 0;
        assert_eq!(nvmlDeviceGetGpuInstanceId(info.device, &mut id), 0);
        assert_eq!(id, 1);

        let mut listed = [null_mut(); 2];
        let mut count = 0;
        assert_eq!(
            nvmlDeviceGetGpuInstances(gpu, 9, listed.as_mut_ptr(), &mut count),
            0
        );
        assert_eq!((count, listed[0]), (1, three));
        assert_eq!(
            nvmlGpuInstanceDestroy(three),
            nvmlReturn_enum_NVML_ERROR_IN_USE
        );
        assert_eq!(nvmlComputeInstanceDestroy(three_ci), 0);
        assert_eq!(nvmlGpuInstanceDestroy(three), 0);
        assert_eq!(nvmlGpuInstanceDestroy(three), INVALID, "already gone");
        let mut gi = null_mut();
        assert_eq!(
            nvmlDeviceGetGpuInstanceById(gpu, 1, &mut gi),
            nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        );
    }
    assert_eq!(uuid(mig(gpu, 0).unwrap()), uuids[1], "the 1g is left");
}

#[test]
fn an_injected_failure_fails_its_step_and_changes_nothing() {
    let faults = Faults {
        mig_failures: vec![crate::partitioning::Step::CreateComputeInstance],
        ..Faults::default()
    };
    let _s = start("h100-sxm5-80gb", 1, faults);
    let gpu = device(0);
    mig_on(gpu);
    let gi = create_gi(gpu, 14, 0, 2).unwrap();
    assert_eq!(
        create_ci(gi, NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE),
        Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
    );
    assert_eq!(mig(gpu, 0), Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND));
    // SAFETY: valid handle.
    assert_eq!(unsafe { nvmlGpuInstanceDestroy(gi) }, 0);
}

#[test]
fn an_ampere_gpu_keeps_its_mode_until_a_reset() {
    let _s = start("a100-sxm4-40gb", 1, Faults::default());
    let gpu = device(0);
    assert_eq!(mig_on(gpu), nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED);
    let (mut current, mut pending) = (9, 9);
    // SAFETY: valid out-pointers.
    assert_eq!(
        unsafe { nvmlDeviceGetMigMode(gpu, &mut current, &mut pending) },
        0
    );
    assert_eq!((current, pending), (0, 1));
}
