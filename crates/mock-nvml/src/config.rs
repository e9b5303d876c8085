//! What the library serves and which faults it injects: a control file, overridden by env vars.
//!
//! The control file is JSON, found at `$MOCK_NVML_CONFIG` or else as `mock-nvml.json` next to the
//! loaded library (so each fake driver root can carry its own), or else appended to the library
//! file itself (see [`EMBEDDED_MARKER`]). Every field is optional:
//! `{"profile": "h100-sxm5-80gb", "gpu_count": 2, "driver_version": "580.95.05", "visible_dev_dir": "/dev", "faults":
//! {"init_error": "driver-not-loaded", "lost_gpus": [1], "xid_events": [{"gpu": 0, "xid": 79}],
//! "ecc_events": [{"gpu": 1, "kind": "double-bit"}], "mig_failures": ["create-compute-instance"]}}`.
//! Env overrides: `MOCK_NVML_PROFILE`, `MOCK_NVML_GPU_COUNT`, `MOCK_NVML_INIT_ERROR`,
//! `MOCK_NVML_LOST_GPUS` (`0,2`), `MOCK_NVML_XID` (`gpu:xid,...`), `MOCK_NVML_ECC`
//! (`gpu:single-bit|double-bit,...`), `MOCK_NVML_MIG_FAIL` (`create-gpu-instance,...`),
//! `MOCK_NVML_MIG_STALL` (`create-compute-instance`).
//!
//! The profile and GPU count are read at the first `nvmlInit`. The control file is read again
//! whenever it changes while NVML is open; its faults then replace those in force, and its XID
//! events are queued again. Replace it atomically (write a temp file, rename) so that no half
//! file is ever read.

use serde::Deserialize;

/// Env var naming the control file.
pub const CONFIG_ENV: &str = "MOCK_NVML_CONFIG";
/// File name of the control file looked for next to the library.
pub const SIDECAR_NAME: &str = "mock-nvml.json";
/// Marks a control file appended to the library file itself, for a library bind-mounted alone (a
/// container given the driver's files through CDI has no sidecar): the file ends with
/// `\n#mock-nvml-config:<one line of JSON>\n`. A sidecar file wins over it.
pub const EMBEDDED_MARKER: &[u8] = b"\n#mock-nvml-config:";
/// How much of the library's end is searched for the embedded control file.
pub const EMBEDDED_MAX: u64 = 4096;

/// The control file embedded at the end of a library file, given that file's last bytes.
pub fn embedded(tail: &[u8]) -> Option<&str> {
    let start = tail
        .windows(EMBEDDED_MARKER.len())
        .rposition(|w| w == EMBEDDED_MARKER)?
        + EMBEDDED_MARKER.len();
    let line = &tail[start..];
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    std::str::from_utf8(line).ok()
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// A shipped profile name or a profile file path.
    #[serde(default)]
    pub profile: Option<String>,
    /// How many GPUs to serve; the profile's default when absent.
    #[serde(default)]
    pub gpu_count: Option<u32>,
    /// The driver version NVML reports (`580.95.05`); the profile's when absent. A fake driver
    /// root of another version says it here.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// Serve only the GPUs whose `<dir>/nvidia<minor>` exists, as the driver shows a container
    /// only the GPUs whose device nodes it was given (e.g. `/dev` on a real node of the local
    /// cluster); all GPUs when absent.
    #[serde(default)]
    pub visible_dev_dir: Option<String>,
    /// Faults to inject.
    #[serde(default)]
    pub faults: Faults,
}

/// Injected faults.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Make `nvmlInit*` fail.
    #[serde(default)]
    pub init_error: Option<InitFault>,
    /// Indices of GPUs that have fallen off the bus.
    #[serde(default)]
    pub lost_gpus: Vec<u32>,
    /// XID events waiting to be delivered to event sets.
    #[serde(default)]
    pub xid_events: Vec<XidEvent>,
    /// ECC error events waiting to be delivered to event sets.
    #[serde(default)]
    pub ecc_events: Vec<EccEvent>,
    /// Partitioning steps that fail (`create-gpu-instance`, `create-compute-instance`,
    /// `destroy-compute-instance`, `destroy-gpu-instance`, `set-mig-mode`).
    #[serde(default)]
    pub mig_failures: Vec<crate::partitioning::Step>,
    /// A partitioning step that hangs until the control file no longer names it (at most five
    /// minutes): what a test kills a caller in the middle of.
    #[serde(default)]
    pub mig_stall: Option<crate::partitioning::Step>,
}

/// How `nvmlInit*` fails.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum InitFault {
    /// `NVML_ERROR_DRIVER_NOT_LOADED`.
    DriverNotLoaded,
    /// `NVML_ERROR_LIB_RM_VERSION_MISMATCH`: library and kernel module disagree.
    VersionMismatch,
    /// `NVML_ERROR_NO_PERMISSION`.
    NoPermission,
}

/// One queued XID event.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct XidEvent {
    /// Index of the GPU that raised it.
    pub gpu: u32,
    /// The XID number.
    pub xid: u64,
}

/// One queued ECC error event.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EccEvent {
    /// Index of the GPU that raised it.
    pub gpu: u32,
    /// Which kind of ECC error.
    pub kind: EccKind,
}

/// Kinds of ECC error events.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum EccKind {
    /// A corrected single-bit error (`nvmlEventTypeSingleBitEccError`).
    SingleBit,
    /// An uncorrected double-bit error (`nvmlEventTypeDoubleBitEccError`).
    DoubleBit,
}

impl Config {
    /// Parses a control file.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// Applies env overrides; `get` looks a variable up (the process env in production).
    pub fn apply_env(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        if let Some(profile) = get("MOCK_NVML_PROFILE") {
            self.profile = Some(profile);
        }
        if let Some(count) = get("MOCK_NVML_GPU_COUNT") {
            let n = count
                .trim()
                .parse()
                .map_err(|_| format!("MOCK_NVML_GPU_COUNT={count:?}"))?;
            self.gpu_count = Some(n);
        }
        if let Some(init) = get("MOCK_NVML_INIT_ERROR") {
            self.faults.init_error = Some(parse_init_fault(&init)?);
        }
        if let Some(lost) = get("MOCK_NVML_LOST_GPUS") {
            self.faults.lost_gpus = parse_list(&lost, |s| s.parse().ok())
                .ok_or_else(|| format!("MOCK_NVML_LOST_GPUS={lost:?}"))?;
        }
        if let Some(xids) = get("MOCK_NVML_XID") {
            self.faults.xid_events = parse_list(&xids, parse_xid)
                .ok_or_else(|| format!("MOCK_NVML_XID={xids:?}, expected gpu:xid,..."))?;
        }
        if let Some(eccs) = get("MOCK_NVML_ECC") {
            self.faults.ecc_events = parse_list(&eccs, parse_ecc).ok_or_else(|| {
                format!("MOCK_NVML_ECC={eccs:?}, expected gpu:single-bit|double-bit,...")
            })?;
        }
        if let Some(step) = get("MOCK_NVML_MIG_STALL") {
            self.faults.mig_stall =
                Some(crate::partitioning::Step::parse(&step).ok_or_else(|| {
                    format!("MOCK_NVML_MIG_STALL={step:?}, expected a step name")
                })?);
        }
        if let Some(steps) = get("MOCK_NVML_MIG_FAIL") {
            self.faults.mig_failures =
                parse_list(&steps, crate::partitioning::Step::parse).ok_or_else(|| {
                    format!(
                        "MOCK_NVML_MIG_FAIL={steps:?}, expected set-mig-mode, create-gpu-instance, create-compute-instance, destroy-compute-instance or destroy-gpu-instance,..."
                    )
                })?;
        }
        Ok(self)
    }
}

fn parse_init_fault(value: &str) -> Result<InitFault, String> {
    match value.trim() {
        "driver-not-loaded" => Ok(InitFault::DriverNotLoaded),
        "version-mismatch" => Ok(InitFault::VersionMismatch),
        "no-permission" => Ok(InitFault::NoPermission),
        other => Err(format!(
            "MOCK_NVML_INIT_ERROR={other:?}, expected driver-not-loaded, version-mismatch or no-permission"
        )),
    }
}

fn parse_xid(item: &str) -> Option<XidEvent> {
    let (gpu, xid) = item.split_once(':')?;
    Some(XidEvent {
        gpu: gpu.trim().parse().ok()?,
        xid: xid.trim().parse().ok()?,
    })
}

fn parse_ecc(item: &str) -> Option<EccEvent> {
    let (gpu, kind) = item.split_once(':')?;
    let kind = match kind.trim() {
        "single-bit" => EccKind::SingleBit,
        "double-bit" => EccKind::DoubleBit,
        _ => return None,
    };
    Some(EccEvent {
        gpu: gpu.trim().parse().ok()?,
        kind,
    })
}

fn parse_list<T>(text: &str, item: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(&item)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_control_file_appended_to_the_library_is_found() {
        let mut lib = b"\x7fELF...binary\n#mock-nvml-config:{\"old\": 1}\n".to_vec();
        lib.extend_from_slice(b"more\n#mock-nvml-config:{\"gpu_count\": 2}\n");
        assert_eq!(embedded(&lib), Some("{\"gpu_count\": 2}"));
        assert_eq!(embedded(b"\x7fELF plain library"), None);
    }

    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_control_file_is_read_whole() {
        let cfg = Config::parse(
            r#"{"profile":"l4","gpu_count":3,"faults":{"init_error":"version-mismatch",
                "lost_gpus":[2],"xid_events":[{"gpu":1,"xid":79}]}}"#,
        )
        .unwrap();
        assert_eq!(cfg.profile.as_deref(), Some("l4"));
        assert_eq!(cfg.gpu_count, Some(3));
        assert_eq!(cfg.faults.init_error, Some(InitFault::VersionMismatch));
        assert_eq!(cfg.faults.lost_gpus, vec![2]);
        assert_eq!(cfg.faults.xid_events, vec![XidEvent { gpu: 1, xid: 79 }]);
    }

    #[test]
    fn env_overrides_the_file() {
        let cfg = Config::parse(r#"{"profile":"l4","gpu_count":3}"#).unwrap();
        let vars = [
            ("MOCK_NVML_PROFILE", "t4"),
            ("MOCK_NVML_GPU_COUNT", "2"),
            ("MOCK_NVML_INIT_ERROR", "driver-not-loaded"),
            ("MOCK_NVML_LOST_GPUS", "0, 1"),
            ("MOCK_NVML_XID", "1:48,0:79"),
            ("MOCK_NVML_ECC", "1:double-bit"),
            (
                "MOCK_NVML_MIG_FAIL",
                "create-gpu-instance, destroy-gpu-instance",
            ),
        ];
        let cfg = cfg.apply_env(env(&vars)).unwrap();
        assert_eq!(cfg.profile.as_deref(), Some("t4"));
        assert_eq!(cfg.gpu_count, Some(2));
        assert_eq!(cfg.faults.init_error, Some(InitFault::DriverNotLoaded));
        assert_eq!(cfg.faults.lost_gpus, vec![0, 1]);
        assert_eq!(cfg.faults.xid_events[0], XidEvent { gpu: 1, xid: 48 });
        assert_eq!(
            cfg.faults.ecc_events,
            vec![EccEvent {
                gpu: 1,
                kind: EccKind::DoubleBit
            }]
        );
        assert_eq!(
            cfg.faults.mig_failures,
            vec![
                crate::partitioning::Step::CreateGpuInstance,
                crate::partitioning::Step::DestroyGpuInstance
            ]
        );
    }

    #[test]
    fn bad_env_values_are_named() {
        let err = Config::default()
            .apply_env(env(&[("MOCK_NVML_XID", "1-48")]))
            .unwrap_err();
        assert!(err.contains("MOCK_NVML_XID"), "{err}");
        let err = Config::default()
            .apply_env(env(&[("MOCK_NVML_ECC", "0:triple-bit")]))
            .unwrap_err();
        assert!(err.contains("MOCK_NVML_ECC"), "{err}");
        let err = Config::default()
            .apply_env(env(&[("MOCK_NVML_INIT_ERROR", "x")]))
            .unwrap_err();
        assert!(err.contains("version-mismatch"), "{err}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(Config::parse(r#"{"profil":"l4"}"#).is_err());
    }
}
