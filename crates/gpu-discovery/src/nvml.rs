//! An NVML session opened from a driver root's library, and what it reads.

use crate::model::{self, CudaVersion, Gpu, Inventory, MigDevice, MigMode, UnreadableGpu};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError as RawError;
use nvml_wrapper::struct_wrappers::device::ProfileInfo;
use nvml_wrapper::{Device, EventSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of the NVML header nvml-wrapper 0.13 is built from.
pub(crate) const GPU_INSTANCE_PROFILE_COUNT: u32 = 17;
/// `NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1` and `_2_SLICE_REV1`: the `+me` profiles.
const MEDIA_EXTENSION_PROFILES: [u32; 2] = [7, 8];
const MIB: u64 = 1 << 20;

/// How NVML is initialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitMode {
    /// Initialise NVML and attach the GPUs.
    Full,
    /// Initialise without touching GPUs (`NVML_INIT_FLAG_NO_GPUS | NO_ATTACH`), for GPUs bound to
    /// vfio-pci; only system queries (driver version) are meaningful then.
    NoGpus,
}

/// An NVML failure, with the library it came from.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded (missing, not ELF, missing `nvmlInit`).
    #[error("cannot load NVML from {library}: {source}")]
    Load {
        /// The library path.
        library: PathBuf,
        /// nvml-wrapper's error.
        source: RawError,
    },
    /// `nvmlInit` found no kernel driver.
    #[error("NVML from {library}: the NVIDIA kernel driver is not loaded")]
    DriverNotLoaded {
        /// The library path.
        library: PathBuf,
    },
    /// The library and the kernel module are different driver versions.
    #[error(
        "NVML from {library}: library and kernel module versions differ (NVML_ERROR_LIB_RM_VERSION_MISMATCH)"
    )]
    VersionMismatch {
        /// The library path.
        library: PathBuf,
    },
    /// No permission to talk to the driver.
    #[error("NVML from {library}: no permission to access the NVIDIA driver")]
    NoPermission {
        /// The library path.
        library: PathBuf,
    },
    /// The GPU has no room for the MIG instance asked for (`NVML_ERROR_INSUFFICIENT_RESOURCES`).
    #[error(
        "NVML from {library}: {call} on {device}: no room on the GPU (NVML_ERROR_INSUFFICIENT_RESOURCES: the placement is taken or the profile's instances are all in use)"
    )]
    NoRoom {
        /// The library path.
        library: PathBuf,
        /// The call.
        call: &'static str,
        /// The GPU.
        device: String,
    },
    /// A GPU has fallen off the bus.
    #[error("NVML from {library}: GPU {device} is lost (NVML_ERROR_GPU_IS_LOST)")]
    GpuLost {
        /// The library path.
        library: PathBuf,
        /// The GPU (index or UUID).
        device: String,
    },
    /// Any other failed call.
    #[error("NVML from {library}: {call} on {device} failed: {source}")]
    Call {
        /// The library path.
        library: PathBuf,
        /// The nvml-wrapper method.
        call: &'static str,
        /// What it was called on.
        device: String,
        /// nvml-wrapper's error.
        source: RawError,
    },
}

/// An open NVML, loaded from one library file; shut down on drop.
#[derive(Debug)]
pub struct NvmlSession {
    nvml: Nvml,
    library: PathBuf,
}

/// A device event read from an [`EventWatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEvent {
    /// UUID of the GPU the event is about.
    pub uuid: String,
    /// What happened.
    pub kind: EventKind,
}

/// Kinds of device events watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A critical XID error, with its number when NVML knows it.
    Xid(Option<u64>),
    /// A double-bit ECC error.
    DoubleBitEcc,
    /// A single-bit ECC error.
    SingleBitEcc,
}

/// Registered interest in XID and ECC events of every GPU of a session.
#[derive(Debug)]
pub struct EventWatch<'a> {
    session: &'a NvmlSession,
    set: EventSet<'a>,
    /// The GPUs watched, with their UUID read at registration: a GPU lost since answers no
    /// query, so its events are matched by handle.
    watched: Vec<(Device<'a>, String)>,
    /// GPUs left out of the watch because NVML could not read them (a lost GPU), with why.
    pub skipped: Vec<NvmlError>,
}

impl NvmlSession {
    /// Loads `library` (an absolute path, so the default search path is never used) and
    /// initialises NVML.
    pub fn open(library: &Path, mode: InitMode) -> Result<Self, NvmlError> {
        let flags = match mode {
            InitMode::Full => InitFlags::empty(),
            InitMode::NoGpus => InitFlags::NO_GPUS | InitFlags::NO_ATTACH,
        };
        let nvml = Nvml::builder()
            .lib_path(library.as_os_str())
            .flags(flags)
            .init()
            .map_err(|e| init_error(library, e))?;
        Ok(Self {
            nvml,
            library: library.to_path_buf(),
        })
    }

    /// The library this session was loaded from.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// Driver version.
    pub fn driver_version(&self) -> Result<String, NvmlError> {
        self.nvml
            .sys_driver_version()
            .map_err(|e| self.err("sys_driver_version", "system", e))
    }

    /// CUDA driver version.
    pub fn cuda_driver_version(&self) -> Result<CudaVersion, NvmlError> {
        self.nvml
            .sys_cuda_driver_version()
            .map(CudaVersion::from_nvml)
            .map_err(|e| self.err("sys_cuda_driver_version", "system", e))
    }

    /// Number of GPUs.
    pub fn device_count(&self) -> Result<u32, NvmlError> {
        self.nvml
            .device_count()
            .map_err(|e| self.err("device_count", "system", e))
    }

    /// Reads every GPU and MIG device. A GPU that cannot be read (lost, a query or one of its
    /// MIG devices failing) is listed in `unreadable` and the others are still read; only what
    /// concerns the whole driver (count, versions) fails the call.
    pub fn inventory(&self) -> Result<Inventory, NvmlError> {
        let mut gpus = Vec::new();
        let mut unreadable = Vec::new();
        for index in 0..self.device_count()? {
            match self.gpu(index) {
                Ok(gpu) => gpus.push(gpu),
                Err(e) => unreadable.push(UnreadableGpu {
                    index,
                    lost: matches!(e, NvmlError::GpuLost { .. }),
                    error: e.to_string(),
                }),
            }
        }
        Ok(Inventory {
            driver_version: self.driver_version()?,
            cuda_driver_version: self.cuda_driver_version()?,
            gpus,
            unreadable,
        })
    }

    /// Starts watching XID and ECC events (those each GPU supports) on every GPU. A GPU NVML cannot
    /// read is left out (listed in [`EventWatch::skipped`]) and the others are still watched; only
    /// a failure to make or fill the event set fails the call.
    pub fn watch_events(&self) -> Result<EventWatch<'_>, NvmlError> {
        let wanted = EventTypes::CRITICAL_XID_ERROR
            | EventTypes::DOUBLE_BIT_ECC_ERROR
            | EventTypes::SINGLE_BIT_ECC_ERROR;
        let mut set = self
            .nvml
            .create_event_set()
            .map_err(|e| self.err("create_event_set", "system", e))?;
        let mut skipped = Vec::new();
        let mut watched = Vec::new();
        for index in 0..self.device_count()? {
            let what = format!("GPU {index}");
            let supported = self
                .nvml
                .device_by_index(index)
                .map_err(|e| self.err("device_by_index", &what, e))
                .and_then(|device| {
                    let types = device
                        .supported_event_types()
                        .map_err(|e| self.err("supported_event_types", &what, e))?;
                    let uuid = device.uuid().map_err(|e| self.err("uuid", &what, e))?;
                    Ok((device, types, uuid))
                });
            let (device, supported, uuid) = match supported {
                Ok(found) => found,
                Err(e) => {
                    skipped.push(e);
                    continue;
                }
            };
            // NVML frees the set when registering fails, so that failure ends the watch.
            set = device
                .register_events(wanted & supported, set)
                .map_err(|e| self.err("register_events", &what, e.error))?;
            watched.push((device, uuid));
        }
        Ok(EventWatch {
            session: self,
            set,
            watched,
            skipped,
        })
    }

    fn gpu(&self, index: u32) -> Result<Gpu, NvmlError> {
        let what = format!("GPU {index}");
        let call = |name, e| self.err(name, &what, e);
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|e| call("device_by_index", e))?;
        let uuid = device.uuid().map_err(|e| call("uuid", e))?;
        let cc = device
            .cuda_compute_capability()
            .map_err(|e| call("cuda_compute_capability", e))?;
        let memory_bytes = match device.memory_info() {
            Ok(m) => Some(m.total),
            Err(RawError::NotSupported) => None,
            Err(e) => return Err(call("memory_info", e)),
        };
        let mig_mode = match device.mig_mode() {
            Ok(m) if m.current == 1 => MigMode::Enabled,
            Ok(_) => MigMode::Disabled,
            Err(RawError::NotSupported) => MigMode::NotSupported,
            Err(e) => return Err(call("mig_mode", e)),
        };
        let minor = device.minor_number().map_err(|e| call("minor_number", e))?;
        let gpu_mib = memory_bytes.map_or(0, |b| b / MIB);
        let mig_devices = match mig_mode {
            MigMode::Enabled => self.mig_devices(&device, &uuid, minor, gpu_mib)?,
            _ => Vec::new(),
        };
        let mig_profiles = match mig_mode {
            MigMode::NotSupported => Vec::new(),
            _ => mig_profiles(&device, gpu_mib),
        };
        Ok(Gpu {
            index,
            minor,
            product_name: device.name().map_err(|e| call("name", e))?,
            brand: brand_name(device.brand().map_err(|e| call("brand", e))?),
            architecture: architecture_name(
                device.architecture().map_err(|e| call("architecture", e))?,
            ),
            cuda_compute_capability: CudaVersion {
                major: cc.major as u32,
                minor: cc.minor as u32,
            },
            memory_bytes,
            pci_bus_id: model::normalise_pci_bus_id(
                &device.pci_info().map_err(|e| call("pci_info", e))?.bus_id,
            ),
            pcie_root: None,
            addressing_mode: self.addressing_mode(&device, &uuid),
            mig_mode,
            mig_devices,
            mig_profiles,
            uuid,
        })
    }

    /// The GPU's addressing mode, for a device attribute: a failure is logged and leaves it out,
    /// never hiding the GPU.
    fn addressing_mode(&self, device: &Device<'_>, uuid: &str) -> Option<String> {
        match nvml_ext::addressing_mode(device) {
            Ok(mode) => mode.map(|m| m.as_str().to_owned()),
            Err(e) => {
                tracing::warn!(gpu = uuid, error = %self.err("addressing_mode", uuid, e), "addressing mode unknown; attribute left out");
                None
            }
        }
    }

    fn mig_devices(
        &self,
        parent: &Device<'_>,
        parent_uuid: &str,
        parent_minor: u32,
        gpu_mib: u64,
    ) -> Result<Vec<MigDevice>, NvmlError> {
        let call = |name, e| self.err(name, parent_uuid, e);
        let profiles: Vec<(u32, ProfileInfo)> = (0..GPU_INSTANCE_PROFILE_COUNT)
            .filter_map(|i| parent.profile_info(i).ok().map(|p| (i, p)))
            .collect();
        let about = Parent {
            uuid: parent_uuid,
            minor: parent_minor,
            memory_mib: gpu_mib,
            profiles: &profiles,
        };
        let max = parent
            .mig_device_count()
            .map_err(|e| call("mig_device_count", e))?;
        let mut found = Vec::new();
        for slot in 0..max {
            let mig = match parent.mig_device_by_index(slot) {
                Ok(d) => d,
                Err(RawError::NotFound) => continue,
                Err(e) => return Err(call("mig_device_by_index", e)),
            };
            found.push(self.mig_device(&mig, slot, &about)?);
        }
        Ok(found)
    }

    fn mig_device(
        &self,
        mig: &Device<'_>,
        slot: u32,
        parent: &Parent<'_>,
    ) -> Result<MigDevice, NvmlError> {
        let what = format!("MIG device {slot} of {}", parent.uuid);
        let call = |name, e| self.err(name, &what, e);
        let uuid = mig.uuid().map_err(|e| call("uuid", e))?;
        let name = mig.name().map_err(|e| call("name", e))?;
        let attrs = mig.attributes().map_err(|e| call("attributes", e))?;
        let instance = nvml_ext::mig_instance(mig).map_err(|e| call("mig_instance", e))?;
        let (index, info) = parent
            .profiles
            .iter()
            .find(|(_, p)| p.id == instance.gpu_instance_profile_id)
            .ok_or_else(|| call("profile_info", RawError::NotFound))?;
        let profile = match model::mig_profile_from_name(&name) {
            Some(p) => p.to_owned(),
            None => model::mig_profile_name(
                attrs.gpu_instance_slice_count,
                attrs.memory_size_mb,
                parent.memory_mib,
                MEDIA_EXTENSION_PROFILES.contains(index),
            ),
        };
        Ok(MigDevice {
            parent_uuid: parent.uuid.to_owned(),
            parent_minor: parent.minor,
            index: slot,
            profile,
            gpu_instance_profile_id: info.id,
            gpu_instance_id: instance.gpu_instance_id,
            compute_instance_id: instance.compute_instance_id,
            placement_start: instance.placement_start,
            placement_size: instance.placement_size,
            slices: attrs.gpu_instance_slice_count,
            memory_bytes: mig.memory_info().map_err(|e| call("memory_info", e))?.total,
            multiprocessors: attrs.multiprocessor_count,
            copy_engines: attrs.shared_copy_engine_count,
            decoders: attrs.shared_decoder_count,
            encoders: attrs.shared_encoder_count,
            jpeg_engines: attrs.shared_jpeg_count,
            ofa_engines: attrs.shared_ofa_count,
            uuid,
        })
    }

    /// The GPU (or MIG device) with this UUID.
    pub(crate) fn device_by_uuid(&self, uuid: &str) -> Result<Device<'_>, NvmlError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|e| self.err("device_by_uuid", uuid, e))
    }

    /// An nvml-wrapper error as this session's error, naming the call and what it was on.
    pub(crate) fn err(&self, call: &'static str, device: &str, e: RawError) -> NvmlError {
        let library = self.library.clone();
        match e {
            RawError::GpuLost => NvmlError::GpuLost {
                library,
                device: device.to_owned(),
            },
            RawError::DriverNotLoaded => NvmlError::DriverNotLoaded { library },
            RawError::LibRmVersionMismatch => NvmlError::VersionMismatch { library },
            RawError::NoPermission => NvmlError::NoPermission { library },
            // nvml-wrapper 0.13 has no variant for NVML_ERROR_INSUFFICIENT_RESOURCES (23).
            RawError::UnexpectedVariant(23) => NvmlError::NoRoom {
                library,
                call,
                device: device.to_owned(),
            },
            source => NvmlError::Call {
                library,
                call,
                device: device.to_owned(),
                source,
            },
        }
    }
}

impl EventWatch<'_> {
    /// The next event, or `None` when none arrives within `timeout`.
    pub fn next(&self, timeout: Duration) -> Result<Option<DeviceEvent>, NvmlError> {
        let millis = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let data = match self.set.wait(millis) {
            Ok(d) => d,
            Err(RawError::Timeout) => return Ok(None),
            Err(e) => return Err(self.session.err("event wait", "event set", e)),
        };
        let known = self
            .watched
            .iter()
            .find(|(device, _)| nvml_ext::same_handle(device, &data.device));
        let uuid = match known {
            Some((_, uuid)) => uuid.clone(),
            None => data
                .device
                .uuid()
                .map_err(|e| self.session.err("uuid", "event device", e))?,
        };
        let kind = if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            EventKind::Xid(match data.event_data {
                Some(XidError::Value(v)) => Some(v),
                _ => None,
            })
        } else if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            EventKind::DoubleBitEcc
        } else {
            EventKind::SingleBitEcc
        };
        Ok(Some(DeviceEvent { uuid, kind }))
    }
}

/// The GPU-instance profiles `device` offers and their placements. A profile NVML will not
/// describe (not offered, or MIG off on a driver before R550) is left out.
fn mig_profiles(device: &Device<'_>, gpu_mib: u64) -> Vec<model::MigProfile> {
    (0..GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|index| {
            let info = device.profile_info(index).ok()?;
            let placements = nvml_ext::possible_placements(device, info.id).ok()?;
            let memory_mib = info.memory_size_mb;
            Some(model::MigProfile {
                index,
                id: info.id,
                name: model::mig_profile_name(
                    info.slice_count,
                    memory_mib,
                    gpu_mib,
                    MEDIA_EXTENSION_PROFILES.contains(&index),
                ),
                slices: info.slice_count,
                instances: info.instance_count,
                memory_bytes: memory_mib * MIB,
                multiprocessors: info.multiprocessor_count,
                copy_engines: info.copy_engine_count,
                decoders: info.decoder_count,
                encoders: info.encoder_count,
                jpeg_engines: info.jpeg_count,
                ofa_engines: info.ofa_count,
                placements: placements
                    .into_iter()
                    .map(|p| model::MigPlacement {
                        start: p.start,
                        size: p.size,
                    })
                    .collect(),
            })
        })
        .collect()
}

/// What MIG device reads need to know about their GPU.
struct Parent<'a> {
    uuid: &'a str,
    minor: u32,
    memory_mib: u64,
    /// `(NVML profile index, info)` of every GPU-instance profile the GPU offers.
    profiles: &'a [(u32, ProfileInfo)],
}

fn init_error(library: &Path, e: RawError) -> NvmlError {
    let library = library.to_path_buf();
    match e {
        RawError::DriverNotLoaded => NvmlError::DriverNotLoaded { library },
        RawError::LibRmVersionMismatch => NvmlError::VersionMismatch { library },
        RawError::NoPermission => NvmlError::NoPermission { library },
        source @ (RawError::LibloadingError(_) | RawError::FailedToLoadSymbol(_)) => {
            NvmlError::Load { library, source }
        }
        source => NvmlError::Call {
            library,
            call: "init",
            device: "system".into(),
            source,
        },
    }
}

/// Brand as the DRA `brand` attribute spells it.
fn brand_name(brand: Brand) -> String {
    format!("{brand:?}")
}

/// Architecture as the DRA `architecture` attribute spells it.
fn architecture_name(arch: DeviceArchitecture) -> String {
    match arch {
        DeviceArchitecture::Ada => "Ada Lovelace".to_owned(),
        other => format!("{other:?}"),
    }
}
