//! What the driver does when a process partitions a GPU: MIG mode changes and GPU- and
//! compute-instance creation and destruction, as rules over a GPU's [`MigRecord`].
//!
//! Pure functions: each changes the record it is given or answers the NVML code the driver would,
//! leaving the record as it was. The rules are the MIG user guide's: a GPU instance lives at one of
//! its profile's placements, two never share a memory slice, a profile has at most its instance
//! count, compute instances fit in their GPU instance's compute slices, a GPU instance with compute
//! instances cannot be destroyed, MIG mode cannot be turned off while instances exist.

use crate::profile::{GiProfile, MigSupport};
use crate::settings::{GpuInstanceRecord, MigRecord};
use crate::topology::compute_profile_slices;
use nvml_wrapper_sys::bindings::*;
use serde::Deserialize;

/// An NVML return code.
type Ret = nvmlReturn_t;

/// A step of partitioning a fault can be injected into: it then fails with
/// `NVML_ERROR_UNKNOWN` and changes nothing.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// `nvmlDeviceSetMigMode`.
    SetMigMode,
    /// `nvmlDeviceCreateGpuInstance[WithPlacement]`.
    CreateGpuInstance,
    /// `nvmlGpuInstanceCreateComputeInstance`.
    CreateComputeInstance,
    /// `nvmlComputeInstanceDestroy`.
    DestroyComputeInstance,
    /// `nvmlGpuInstanceDestroy`.
    DestroyGpuInstance,
}

impl Step {
    /// Reads the name a control file or `MOCK_NVML_MIG_FAIL` uses (`create-gpu-instance`).
    pub fn parse(name: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(name.trim().to_owned())).ok()
    }
}

const IN_USE: Ret = nvmlReturn_enum_NVML_ERROR_IN_USE;
const INSUFFICIENT_RESOURCES: Ret = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
const INVALID: Ret = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_FOUND: Ret = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const NOT_SUPPORTED: Ret = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const RESET_REQUIRED: Ret = nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
const SUCCESS: Ret = nvmlReturn_enum_NVML_SUCCESS;

/// Turns MIG mode on or off; answers the activation status. A model that needs a reset keeps the
/// change pending (`NVML_ERROR_RESET_REQUIRED`).
pub fn set_mode(support: &MigSupport, record: &mut MigRecord, enable: bool) -> Result<Ret, Ret> {
    if !enable && !record.gpu_instances.is_empty() {
        return Err(IN_USE);
    }
    record.pending = enable;
    if support.mode_change_needs_reset && record.current != enable {
        return Ok(RESET_REQUIRED);
    }
    record.current = enable;
    Ok(SUCCESS)
}

/// The GI profile with NVML profile id `profile_id`.
pub fn profile_by_id(support: &MigSupport, profile_id: u32) -> Result<&GiProfile, Ret> {
    support
        .profiles
        .iter()
        .find(|p| p.id == profile_id)
        .ok_or(INVALID)
}

/// Memory slices a GPU instance of the record covers.
fn covered(support: &MigSupport, gi: &GpuInstanceRecord) -> std::ops::Range<u32> {
    let size = profile_by_id(support, gi.profile_id).map_or(0, |p| p.placement_size);
    gi.start..gi.start + size
}

/// The placements of `profile` still free: not overlapping any GPU instance; none once the
/// profile's instance count is reached or MIG is off.
pub fn free_placements(support: &MigSupport, record: &MigRecord, profile: &GiProfile) -> Vec<u32> {
    let used = record
        .gpu_instances
        .iter()
        .filter(|gi| gi.profile_id == profile.id)
        .count();
    if !record.current || used >= profile.instances as usize {
        return Vec::new();
    }
    profile
        .placements
        .iter()
        .copied()
        .filter(|start| {
            let wanted = *start..*start + profile.placement_size;
            record.gpu_instances.iter().all(|gi| {
                let taken = covered(support, gi);
                wanted.end <= taken.start || taken.end <= wanted.start
            })
        })
        .collect()
}

/// Creates a GPU instance of `profile_id` at `start` (`None`: the first free placement); answers
/// its id, the lowest one free.
pub fn create_gpu_instance(
    support: &MigSupport,
    record: &mut MigRecord,
    profile_id: u32,
    start: Option<u32>,
) -> Result<u32, Ret> {
    if !record.current {
        return Err(NOT_SUPPORTED);
    }
    let profile = profile_by_id(support, profile_id)?;
    if let Some(start) = start
        && !profile.placements.contains(&start)
    {
        return Err(INVALID);
    }
    let free = free_placements(support, record, profile);
    let start = match start {
        Some(s) if free.contains(&s) => s,
        Some(_) => return Err(INSUFFICIENT_RESOURCES),
        None => *free.first().ok_or(INSUFFICIENT_RESOURCES)?,
    };
    let id = (1..)
        .find(|id| record.gpu_instances.iter().all(|gi| gi.id != *id))
        .unwrap_or(1);
    record.gpu_instances.push(GpuInstanceRecord {
        id,
        profile_id,
        start,
        compute_instances: Vec::new(),
    });
    record.gpu_instances.sort_by_key(|gi| gi.id);
    Ok(id)
}

/// The GPU instance with id `gi`.
pub fn gpu_instance(record: &MigRecord, gi: u32) -> Result<&GpuInstanceRecord, Ret> {
    record
        .gpu_instances
        .iter()
        .find(|g| g.id == gi)
        .ok_or(NOT_FOUND)
}

/// Compute slices of GPU instance `gi` not yet in a compute instance.
pub fn free_compute_slices(support: &MigSupport, gi: &GpuInstanceRecord) -> u32 {
    let total = profile_by_id(support, gi.profile_id).map_or(0, |p| p.slices);
    let used: u32 = gi
        .compute_instances
        .iter()
        .filter_map(|(_, p)| compute_profile_slices(*p))
        .sum();
    total.saturating_sub(used)
}

/// Creates a compute instance of `ci_profile` (an `NVML_COMPUTE_INSTANCE_PROFILE_*` index) in GPU
/// instance `gi`; answers its id, the lowest one free.
pub fn create_compute_instance(
    support: &MigSupport,
    record: &mut MigRecord,
    gi: u32,
    ci_profile: u32,
) -> Result<u32, Ret> {
    let slices = compute_profile_slices(ci_profile).ok_or(INVALID)?;
    let instance = gpu_instance(record, gi).map_err(|_| INVALID)?;
    let gi_slices = profile_by_id(support, instance.profile_id)?.slices;
    if slices > gi_slices {
        return Err(NOT_SUPPORTED);
    }
    if slices > free_compute_slices(support, instance) {
        return Err(INSUFFICIENT_RESOURCES);
    }
    let id = (0..)
        .find(|id| instance.compute_instances.iter().all(|(c, _)| c != id))
        .unwrap_or(0);
    let instance = record
        .gpu_instances
        .iter_mut()
        .find(|g| g.id == gi)
        .ok_or(INVALID)?;
    instance.compute_instances.push((id, ci_profile));
    instance.compute_instances.sort();
    Ok(id)
}

/// Destroys compute instance `ci` of GPU instance `gi`.
pub fn destroy_compute_instance(record: &mut MigRecord, gi: u32, ci: u32) -> Result<(), Ret> {
    let instance = record
        .gpu_instances
        .iter_mut()
        .find(|g| g.id == gi)
        .ok_or(INVALID)?;
    let before = instance.compute_instances.len();
    instance.compute_instances.retain(|(c, _)| *c != ci);
    if instance.compute_instances.len() == before {
        return Err(INVALID);
    }
    Ok(())
}

/// Destroys GPU instance `gi`, which must hold no compute instance.
pub fn destroy_gpu_instance(record: &mut MigRecord, gi: u32) -> Result<(), Ret> {
    let instance = gpu_instance(record, gi).map_err(|_| INVALID)?;
    if !instance.compute_instances.is_empty() {
        return Err(IN_USE);
    }
    record.gpu_instances.retain(|g| g.id != gi);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::load;

    fn h100() -> (MigSupport, MigRecord) {
        let support = load("h100-sxm5-80gb").unwrap().mig.unwrap();
        let mut record = MigRecord::default();
        assert_eq!(set_mode(&support, &mut record, true), Ok(SUCCESS));
        (support, record)
    }

    const P_1G10: u32 = 19;
    const P_3G40: u32 = 9;
    const P_4G40: u32 = 5;
    const P_7G80: u32 = 0;
    const P_1G10_ME: u32 = 20;

    #[test]
    fn placements_never_overlap_and_the_whole_card_needs_every_slice() {
        let (support, mut record) = h100();
        let three = create_gpu_instance(&support, &mut record, P_3G40, Some(4)).unwrap();
        assert_eq!(
            create_gpu_instance(&support, &mut record, P_1G10, Some(5)),
            Err(INSUFFICIENT_RESOURCES),
            "slice 5 is inside the 3g at 4"
        );
        assert_eq!(
            create_gpu_instance(&support, &mut record, P_7G80, None),
            Err(INSUFFICIENT_RESOURCES)
        );
        let one = create_gpu_instance(&support, &mut record, P_1G10, None).unwrap();
        assert_eq!(gpu_instance(&record, one).unwrap().start, 0);
        assert_eq!(
            create_gpu_instance(&support, &mut record, P_4G40, Some(0)),
            Err(INSUFFICIENT_RESOURCES),
            "the 4g at 0 would cover the 1g"
        );
        assert_eq!((three, one), (1, 2), "the lowest free ids");
        assert_eq!(
            create_gpu_instance(&support, &mut record, P_3G40, Some(3)),
            Err(INVALID),
            "3 is no placement of a 3g"
        );
    }

    #[test]
    fn a_profile_stops_at_its_instance_count() {
        let (support, mut record) = h100();
        create_gpu_instance(&support, &mut record, P_1G10_ME, Some(0)).unwrap();
        assert_eq!(
            create_gpu_instance(&support, &mut record, P_1G10_ME, Some(1)),
            Err(INSUFFICIENT_RESOURCES),
            "one +me instance per GPU"
        );
    }

    #[test]
    fn compute_instances_fill_their_gpu_instance_and_block_its_destruction() {
        let (support, mut record) = h100();
        let gi = create_gpu_instance(&support, &mut record, P_3G40, Some(0)).unwrap();
        // NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE is 2; 4_SLICE (3) does not fit a 3g.
        assert_eq!(
            create_compute_instance(&support, &mut record, gi, 3),
            Err(NOT_SUPPORTED)
        );
        let ci = create_compute_instance(&support, &mut record, gi, 2).unwrap();
        assert_eq!(ci, 0);
        assert_eq!(
            create_compute_instance(&support, &mut record, gi, 0),
            Err(INSUFFICIENT_RESOURCES)
        );
        assert_eq!(destroy_gpu_instance(&mut record, gi), Err(IN_USE));
        assert_eq!(set_mode(&support, &mut record, false), Err(IN_USE));
        destroy_compute_instance(&mut record, gi, ci).unwrap();
        assert_eq!(destroy_compute_instance(&mut record, gi, ci), Err(INVALID));
        destroy_gpu_instance(&mut record, gi).unwrap();
        assert!(record.gpu_instances.is_empty());
        assert_eq!(set_mode(&support, &mut record, false), Ok(SUCCESS));
        assert_eq!(
            create_gpu_instance(&support, &mut record, P_1G10, None),
            Err(NOT_SUPPORTED),
            "MIG off"
        );
    }

    #[test]
    fn an_ampere_mode_change_waits_for_a_reset() {
        let support = load("a100-sxm4-40gb").unwrap().mig.unwrap();
        let mut record = MigRecord::default();
        assert_eq!(set_mode(&support, &mut record, true), Ok(RESET_REQUIRED));
        assert_eq!((record.current, record.pending), (false, true));
    }

    #[test]
    fn steps_are_named_as_the_control_file_names_them() {
        assert_eq!(
            Step::parse("create-compute-instance"),
            Some(Step::CreateComputeInstance)
        );
        assert_eq!(Step::parse("reset"), None);
    }
}
