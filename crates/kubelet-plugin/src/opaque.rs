//! Opaque device configuration of the driver (`resource.nvidia.com/v1beta1`), decoded strictly:
//! unknown fields, kinds or versions are errors that name what was wrong.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `apiVersion` of the driver's configuration objects.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// A decoded configuration object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceConfig {
    /// `GpuConfig`: applies to full GPUs.
    Gpu(GpuConfig),
    /// `MigDeviceConfig`: applies to MIG devices.
    Mig(MigDeviceConfig),
}

/// `GpuConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuConfig {
    /// How the GPU is shared.
    pub sharing: Option<Sharing>,
}

/// `MigDeviceConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceConfig {
    /// How the MIG device is shared.
    pub sharing: Option<Sharing>,
}

/// Sharing settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sharing {
    /// The strategy.
    pub strategy: Strategy,
    /// Settings of `TimeSlicing`.
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Settings of `MPS`.
    pub mps_config: Option<MpsConfig>,
}

pub use node_agent::devices::Strategy;

/// `timeSlicingConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    /// Slice length.
    pub interval: Option<Interval>,
}

/// Time-slice lengths: how long a process keeps a time-sliced GPU before the next one runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Interval {
    /// The driver's default.
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

impl Interval {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn nvidia_smi_value(self) -> u32 {
        match self {
            Self::Default => 0,
            Self::Short => 1,
            Self::Medium => 2,
            Self::Long => 3,
        }
    }
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// `mpsConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsConfig {
    /// Default active thread percentage, 0–100.
    pub default_active_thread_percentage: Option<i64>,
    /// Default pinned memory limit (a quantity).
    pub default_pinned_device_memory_limit: Option<String>,
    /// Per-device pinned memory limits.
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<String, String>>,
    /// Allow several users.
    pub multi_user: Option<bool>,
}

/// Why a configuration object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON, or fields that do not belong.
    #[error("invalid {kind} configuration: {reason}")]
    Invalid {
        /// The kind, or `object` before it is known.
        kind: String,
        /// serde's message.
        reason: String,
    },
    /// Another API version.
    #[error("unsupported apiVersion {0:?}; expected {API_VERSION:?}")]
    ApiVersion(String),
    /// Another kind.
    #[error("unsupported kind {0:?}; expected GpuConfig or MigDeviceConfig")]
    Kind(String),
    /// A setting this plugin does not apply yet.
    #[error("{0} is not supported by this plugin yet")]
    Unsupported(String),
    /// A setting that cannot apply where it was asked for; the message says why.
    #[error("{0}")]
    Refused(String),
}

fn invalid(kind: &str, e: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        kind: kind.to_owned(),
        reason: e.to_string(),
    }
}

/// Decodes one configuration object from the JSON in an opaque config's `parameters`.
pub fn decode(bytes: &[u8]) -> Result<DeviceConfig, ConfigError> {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| invalid("object", e))?;
    let api_version = object.remove("apiVersion");
    let kind = object.remove("kind");
    match api_version.as_ref().and_then(|v| v.as_str()) {
        Some(API_VERSION) => {}
        Some(other) => return Err(ConfigError::ApiVersion(other.to_owned())),
        None => return Err(invalid("object", "apiVersion must be a string")),
    }
    let rest = serde_json::Value::Object(object);
    match kind.as_ref().and_then(|k| k.as_str()) {
        Some("GpuConfig") => serde_json::from_value(rest)
            .map(DeviceConfig::Gpu)
            .map_err(|e| invalid("GpuConfig", e)),
        Some("MigDeviceConfig") => serde_json::from_value(rest)
            .map(DeviceConfig::Mig)
            .map_err(|e| invalid("MigDeviceConfig", e)),
        Some(other) => Err(ConfigError::Kind(other.to_owned())),
        None => Err(invalid("object", "kind must be a string")),
    }
}

impl DeviceConfig {
    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Gpu(_) => "GpuConfig",
            Self::Mig(_) => "MigDeviceConfig",
        }
    }

    fn sharing(&self) -> Option<&Sharing> {
        match self {
            Self::Gpu(c) => c.sharing.as_ref(),
            Self::Mig(c) => c.sharing.as_ref(),
        }
    }

    /// The sharing strategy the configuration names, if any.
    pub fn strategy(&self) -> Option<Strategy> {
        self.sharing().map(|s| s.strategy)
    }

    /// Checks that this plugin can honour the settings on a share of a GPU: time-slicing (with
    /// any interval, set on the whole card), or MPS (its limits come from the share's memory; the
    /// class's `mpsConfig` is not applied).
    pub fn check_supported_on_share(&self) -> Result<(), ConfigError> {
        match self.sharing() {
            Some(Sharing {
                mps_config: Some(_),
                ..
            }) => Err(ConfigError::Unsupported(
                "mpsConfig on a share (its limits follow the memory the share consumed)".into(),
            )),
            Some(Sharing {
                strategy: Strategy::Mps,
                time_slicing_config: Some(_),
                ..
            }) => Err(ConfigError::Unsupported(
                "timeSlicingConfig with strategy MPS".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The time-slice interval the configuration asks for, if it names one.
    pub fn time_slice(&self) -> Option<Interval> {
        match self.sharing()? {
            Sharing {
                strategy: Strategy::TimeSlicing,
                time_slicing_config: Some(TimeSlicingConfig { interval, .. }),
                ..
            } => *interval,
            _ => None,
        }
    }

    /// The MPS settings of a configuration with strategy MPS (none given: the defaults).
    pub fn mps(&self) -> Option<MpsConfig> {
        match self.sharing()? {
            Sharing {
                strategy: Strategy::Mps,
                mps_config,
                ..
            } => Some(mps_config.clone().unwrap_or_default()),
            _ => None,
        }
    }

    /// Checks that this plugin can honour the settings on a device a claim holds alone: no
    /// sharing, time-slicing (an interval on a full GPU only: the driver sets it per card), or
    /// MPS (a control daemon for the claim, [`crate::mps`]).
    pub fn check_supported(&self) -> Result<(), ConfigError> {
        match self.sharing() {
            None => Ok(()),
            Some(Sharing {
                strategy: Strategy::Mps,
                time_slicing_config: Some(_),
                ..
            }) => Err(ConfigError::Unsupported(
                "timeSlicingConfig with strategy MPS".into(),
            )),
            Some(Sharing {
                strategy: Strategy::Mps,
                ..
            }) => Ok(()),
            Some(Sharing {
                mps_config: Some(_),
                ..
            }) => Err(ConfigError::Unsupported(
                "mpsConfig with strategy TimeSlicing".into(),
            )),
            Some(_) => match (self, self.time_slice()) {
                (Self::Mig(_), Some(i)) if i != Interval::Default => {
                    Err(ConfigError::Refused(format!(
                        "time-slicing interval {i} on a MIG device: the driver sets intervals per full GPU"
                    )))
                }
                _ => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn gpu_and_mig_configs_decode() {
        let gpu = decode(
            br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig",
                 "sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}"#,
        )
        .unwrap();
        assert_eq!(gpu.kind(), "GpuConfig");
        assert_eq!(gpu.check_supported(), Ok(()));
        assert_eq!(gpu.time_slice(), Some(Interval::Long));
        let mig =
            decode(br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig"}"#)
                .unwrap();
        assert_eq!(mig, DeviceConfig::Mig(MigDeviceConfig::default()));
        assert_eq!(mig.check_supported(), Ok(()));
        let mig_short = decode(
            br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig",
                 "sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Short"}}}"#,
        )
        .unwrap();
        let refused = mig_short.check_supported().unwrap_err().to_string();
        assert!(refused.contains("per full GPU"), "{refused}");
    }

    #[test]
    fn intervals_map_to_the_values_nvidia_smi_takes() {
        let values = [
            Interval::Default,
            Interval::Short,
            Interval::Medium,
            Interval::Long,
        ]
        .map(Interval::nvidia_smi_value);
        assert_eq!(values, [0, 1, 2, 3]);
    }

    #[test]
    fn strictness_names_the_problem() {
        let unknown = decode(
            br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharng":{}}"#,
        )
        .unwrap_err();
        assert!(unknown.to_string().contains("sharng"), "{unknown}");
        assert_eq!(
            decode(br#"{"apiVersion":"v9","kind":"GpuConfig"}"#),
            Err(ConfigError::ApiVersion("v9".into()))
        );
        assert_eq!(
            decode(br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"Nope"}"#),
            Err(ConfigError::Kind("Nope".into()))
        );
        let mps = decode(
            br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}"#,
        )
        .unwrap();
        assert_eq!(mps.check_supported(), Ok(()));
        assert_eq!(mps.mps(), Some(MpsConfig::default()));
        let both = decode(
            br#"{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","timeSlicingConfig":{}}}"#,
        )
        .unwrap();
        assert!(
            both.check_supported()
                .unwrap_err()
                .to_string()
                .contains("timeSlicingConfig")
        );
    }

    #[test]
    fn a_share_takes_time_slicing_or_mps_but_not_settings_it_cannot_apply() {
        let config = |sharing: &str| {
            decode(format!(r#"{{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{sharing}}}"#).as_bytes())
                .unwrap()
        };
        let mps = config(r#"{"strategy":"MPS"}"#);
        assert_eq!(mps.strategy(), Some(super::Strategy::Mps));
        assert_eq!(mps.check_supported_on_share(), Ok(()));
        assert_eq!(
            mps.check_supported(),
            Ok(()),
            "MPS on a GPU one claim holds: a daemon for the claim"
        );
        let limits =
            config(r#"{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50}}"#);
        let refused = limits.check_supported_on_share().unwrap_err().to_string();
        assert!(refused.contains("mpsConfig on a share"), "{refused}");
        let long = config(r#"{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}"#);
        assert_eq!(long.check_supported_on_share(), Ok(()));
        assert_eq!(long.time_slice(), Some(Interval::Long));
        assert_eq!(mps.time_slice(), None);
        assert_eq!(
            config(r#"{"strategy":"TimeSlicing"}"#).check_supported_on_share(),
            Ok(())
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes).map(|c| c.check_supported());
        }

        #[test]
        fn arbitrary_json_objects_never_panic(
            kind in prop_oneof![Just("GpuConfig".to_owned()), Just("MigDeviceConfig".to_owned()), ".*"],
            strategy in prop_oneof![Just("TimeSlicing".to_owned()), Just("MPS".to_owned()), ".*"],
            interval in prop_oneof![Just("Default".to_owned()), Just("Long".to_owned()), ".*"],
            extra in ".{0,8}",
        ) {
            let json = serde_json::json!({
                "apiVersion": API_VERSION,
                "kind": kind,
                "sharing": {"strategy": strategy, "timeSlicingConfig": {"interval": interval}},
                extra: 1,
            });
            let _ = decode(json.to_string().as_bytes()).map(|c| c.check_supported());
        }
    }
}
