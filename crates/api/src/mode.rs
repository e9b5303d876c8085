//! Which software stack serves a GPU node.

use std::fmt;
use std::str::FromStr;

/// The value of the node label `nvidia.com/gpu-operator.resource-allocation.mode`, and of the
/// operator env `DEFAULT_GPU_ALLOCATION_MODE`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationMode {
    /// GPUs are published as ResourceSlices by the DRA kubelet plugin and allocated through claims.
    Dra,
    /// GPUs are advertised as extended resources (`nvidia.com/gpu`) by the device plugin.
    DevicePlugin,
}

impl AllocationMode {
    /// Every mode, in the order error messages list them.
    pub const ALL: [AllocationMode; 2] = [AllocationMode::Dra, AllocationMode::DevicePlugin];

    /// The other mode.
    pub const fn other(self) -> Self {
        match self {
            AllocationMode::Dra => AllocationMode::DevicePlugin,
            AllocationMode::DevicePlugin => AllocationMode::Dra,
        }
    }

    /// The label value for this mode.
    pub const fn as_str(self) -> &'static str {
        match self {
            AllocationMode::Dra => "dra",
            AllocationMode::DevicePlugin => "device-plugin",
        }
    }
}

impl fmt::Display for AllocationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of the allocation modes; its message names the allowed values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid allocation mode {value:?}: allowed values are \"dra\" and \"device-plugin\"")]
pub struct ParseAllocationModeError {
    /// The rejected input.
    pub value: String,
}

impl FromStr for AllocationMode {
    type Err = ParseAllocationModeError;

    /// Parses the exact, case-sensitive label value.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocationMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == s)
            .ok_or_else(|| ParseAllocationModeError {
                value: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_the_label_values() {
        for mode in AllocationMode::ALL {
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.as_str());
        }
    }

    #[test]
    fn parses_the_two_label_values() {
        assert_eq!("dra".parse(), Ok(AllocationMode::Dra));
        assert_eq!("device-plugin".parse(), Ok(AllocationMode::DevicePlugin));
    }

    #[test]
    fn rejects_anything_else_naming_both_allowed_values() {
        for bad in ["DRA", "", "gpu", "device_plugin", " dra"] {
            let err = bad.parse::<AllocationMode>().unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("\"dra\""), "{msg}");
            assert!(msg.contains("\"device-plugin\""), "{msg}");
            assert!(
                msg.contains(&format!("{bad:?}")),
                "message names the bad value: {msg}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for mode in AllocationMode::ALL {
            assert_eq!(mode.to_string().parse(), Ok(mode));
        }
    }
}
