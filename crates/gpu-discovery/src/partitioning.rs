//! Dynamic MIG on a GPU: MIG mode turned on, GPU and compute instances created at a placement,
//! listed and destroyed. Each call is one NVML step, so a caller can record what it is about to
//! create before it does (and roll back what a crash left half made).

use crate::model::MigPlacement;
use crate::nvml::{NvmlError, NvmlSession};
use nvml_wrapper::error::NvmlError as RawError;

/// What changing a GPU's MIG mode did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigModeChange {
    /// The GPU was in that mode already.
    Unchanged,
    /// The GPU is in that mode now.
    Changed,
    /// The change waits for a GPU reset (Ampere): the mode in force stays until then.
    NeedsReset,
    /// The GPU is busy (processes or MIG instances on it) and kept its mode.
    InUse,
}

/// A GPU instance on a GPU and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    /// GPU-instance id.
    pub id: u32,
    /// GPU-instance profile id.
    pub profile_id: u32,
    /// Where it sits.
    pub placement: MigPlacement,
    /// Ids of its compute instances.
    pub compute_instances: Vec<u32>,
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` value of the compute instance spanning a whole GPU
/// instance of `slices` compute slices (the header's order: 1, 2, 3, 4, 7, 8, 6 slices).
pub fn compute_profile_for(slices: u32) -> Option<u32> {
    [1, 2, 3, 4, 7, 8, 6]
        .iter()
        .position(|s| *s == slices)
        .map(|i| i as u32)
}

// NVML return codes an activation status carries (`nvmlReturn_t`).
const RESET_REQUIRED: u32 = 16;
const IN_USE: u32 = 19;

impl NvmlSession {
    /// Turns MIG on (`on`) or off for the GPU with `uuid`. The call itself may succeed while the
    /// activation does not (a reset pending, the GPU busy): the answer says which.
    pub fn set_mig(&self, uuid: &str, on: bool) -> Result<MigModeChange, NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        let mode = device
            .mig_mode()
            .map_err(|e| self.err("mig_mode", uuid, e))?;
        if (mode.current == 1) == on {
            return Ok(MigModeChange::Unchanged);
        }
        let status = match device.set_mig_mode(on) {
            Ok(status) => status,
            Err(RawError::InUse) => return Ok(MigModeChange::InUse),
            Err(e) => return Err(self.err("set_mig_mode", uuid, e)),
        };
        Ok(match status {
            0 => MigModeChange::Changed,
            RESET_REQUIRED => MigModeChange::NeedsReset,
            IN_USE => MigModeChange::InUse,
            other => {
                return Err(self.err("set_mig_mode", uuid, RawError::UnexpectedVariant(other)));
            }
        })
    }

    /// Creates a GPU instance of profile `profile_id` at `placement` on the GPU with `uuid`;
    /// answers its id.
    pub fn create_gpu_instance(
        &self,
        uuid: &str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        let placement = nvml_ext::Placement {
            start: placement.start,
            size: placement.size,
        };
        nvml_ext::create_gpu_instance(&device, profile_id, placement)
            .map_err(|e| self.err("create_gpu_instance", uuid, e))
    }

    /// Creates the compute instance spanning all `slices` of GPU instance `gi` on the GPU with
    /// `uuid`; answers its id.
    pub fn create_compute_instance(
        &self,
        uuid: &str,
        gi: u32,
        slices: u32,
    ) -> Result<u32, NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        let profile = compute_profile_for(slices)
            .ok_or_else(|| self.err("create_compute_instance", uuid, RawError::InvalidArg))?;
        nvml_ext::create_compute_instance(&device, gi, profile)
            .map_err(|e| self.err("create_compute_instance", uuid, e))
    }

    /// Destroys compute instance `ci` of GPU instance `gi` on the GPU with `uuid`; one already
    /// gone (or its GPU instance gone) is no error.
    pub fn destroy_compute_instance(&self, uuid: &str, gi: u32, ci: u32) -> Result<(), NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        match nvml_ext::destroy_compute_instance(&device, gi, ci) {
            Ok(()) | Err(RawError::NotFound | RawError::InvalidArg) => Ok(()),
            Err(e) => Err(self.err("destroy_compute_instance", uuid, e)),
        }
    }

    /// Destroys GPU instance `gi` on the GPU with `uuid`; one already gone is no error.
    pub fn destroy_gpu_instance(&self, uuid: &str, gi: u32) -> Result<(), NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        match nvml_ext::destroy_gpu_instance(&device, gi) {
            Ok(()) | Err(RawError::NotFound) => Ok(()),
            Err(e) => Err(self.err("destroy_gpu_instance", uuid, e)),
        }
    }

    /// The GPU instances on the GPU with `uuid` of the profiles `profile_ids`, with their compute
    /// instances; none while MIG is off.
    pub fn gpu_instances(
        &self,
        uuid: &str,
        profile_ids: &[u32],
    ) -> Result<Vec<GpuInstance>, NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        let found = nvml_ext::gpu_instances(&device, profile_ids)
            .map_err(|e| self.err("gpu_instances", uuid, e))?;
        Ok(found
            .into_iter()
            .map(|gi| GpuInstance {
                id: gi.id,
                profile_id: gi.profile_id,
                placement: MigPlacement {
                    start: gi.placement.start,
                    size: gi.placement.size,
                },
                compute_instances: gi.compute_instances,
            })
            .collect())
    }

    /// Turns MIG off on the GPU with `uuid` if it is on and holds no GPU instance of any profile
    /// it offers; answers whether it did.
    pub fn release_mig(&self, uuid: &str) -> Result<bool, NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        let mode = device
            .mig_mode()
            .map_err(|e| self.err("mig_mode", uuid, e))?;
        if mode.current != 1 {
            return Ok(false);
        }
        let profiles: Vec<u32> = (0..crate::nvml::GPU_INSTANCE_PROFILE_COUNT)
            .filter_map(|i| device.profile_info(i).ok().map(|p| p.id))
            .collect();
        if !self.gpu_instances(uuid, &profiles)?.is_empty() {
            return Ok(false);
        }
        Ok(self.set_mig(uuid, false)? == MigModeChange::Changed)
    }

    /// The UUID of the MIG device of compute instance `ci` in GPU instance `gi` on the GPU with
    /// `uuid`.
    pub fn mig_device_uuid(&self, uuid: &str, gi: u32, ci: u32) -> Result<String, NvmlError> {
        let device = self.device_by_uuid(uuid)?;
        let count = device
            .mig_device_count()
            .map_err(|e| self.err("mig_device_count", uuid, e))?;
        for slot in 0..count {
            let mig = match device.mig_device_by_index(slot) {
                Ok(m) => m,
                Err(RawError::NotFound) => continue,
                Err(e) => return Err(self.err("mig_device_by_index", uuid, e)),
            };
            let ids =
                nvml_ext::mig_instance(&mig).map_err(|e| self.err("mig_instance", uuid, e))?;
            if (ids.gpu_instance_id, ids.compute_instance_id) == (gi, ci) {
                return mig.uuid().map_err(|e| self.err("uuid", uuid, e));
            }
        }
        Err(self.err("mig_device_uuid", uuid, RawError::NotFound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compute_instance_spans_its_gpu_instance() {
        assert_eq!(compute_profile_for(1), Some(0));
        assert_eq!(compute_profile_for(3), Some(2));
        assert_eq!(compute_profile_for(7), Some(4));
        assert_eq!(compute_profile_for(6), Some(6));
        assert_eq!(compute_profile_for(5), None);
    }
}
