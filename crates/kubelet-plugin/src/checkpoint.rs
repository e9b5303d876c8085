//! The plugin's checkpoint: which claims are prepared, kept across restarts.
//!
//! On disk it is a JSON envelope `{"version", "checksum", "payload"}` where `checksum` is the
//! SHA-256 of the payload's bytes exactly as stored, so fields added by a later version never
//! break the checksum. A checkpoint from another boot is discarded (after a reboot nothing is
//! prepared any more); a corrupted one is moved aside and the plugin starts empty.
//!
//! Compatibility across plugin versions (upgrades and downgrades under prepared claims):
//! - A field an older build may ignore without harm is added as optional (`serde(default)`) and
//!   keeps [`VERSION`]; older builds of that version read the file and skip it.
//! - Anything an older build would misread or must not ignore (a renamed or retyped field, a duty
//!   it would drop) raises [`VERSION`]; this build keeps reading every earlier version.
//! - A file of a version newer than this build's is refused at start with an error that names
//!   it: never discarded or moved aside, since the claims in it are still prepared. Rolling
//!   forward again (or moving the file away by hand) is the way out.
//!
//! Writes are atomic (a temp file renamed over the old one) and not fsynced. Crash analysis:
//! - A crash of the plugin (SIGKILL, OOM, a container restart) keeps the kernel's page cache, so
//!   every write that returned is what the restarted plugin reads: the rename makes it whole or
//!   absent, never torn.
//! - What loses unsynced writes (power loss, a kernel panic, a hard reset) also ends the boot.
//!   The next boot discards the checkpoint whatever it holds: its CDI specs (in `/var/run/cdi`)
//!   and the containers that used them are gone too, and the kubelet prepares its pods' claims
//!   again. A file that such an end left unreadable was last written before this boot started,
//!   and is discarded the same way, without the corrupted-checkpoint alarm (see
//!   [`CheckpointStore::with_boot_time`]).
//!
//! So an fsync would protect nothing a reader can see, and prepare and unprepare make none.

use crate::opaque::Interval;
use crate::types::PreparedDevice;
use gpu_discovery::atomic::{Durability, replace};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// The newest format this build reads and writes.
pub const VERSION: u32 = 2;
/// Format 2 adds [`ClaimEntry::partitions`], which a build of format 1 would ignore and so leave
/// the claim's MIG partitions behind at unprepare: a file is written in format 2 only while a claim
/// holds a partition, so a downgrade is refused (with the reason) just where it would leak.
const PARTITIONS_VERSION: u32 = 2;
/// File name inside the plugin's data directory.
pub const FILE_NAME: &str = "checkpoint.json";
/// Where the kernel publishes this boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Progress of one claim's preparation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Side effects may have started; rolled back if found at start.
    PrepareStarted,
    /// Prepared; repeated prepares are answered from here.
    PrepareCompleted,
}

/// One claim in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEntry {
    /// Progress.
    pub state: ClaimState,
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Devices of the claim (known from `PrepareStarted` on, so the exclusive check sees them).
    pub devices: Vec<PreparedDevice>,
    /// The compute time-slice the claim set on physical GPUs, by GPU UUID; committed before it
    /// is set, so a crash half-way is found and undone at start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub time_slices: BTreeMap<String, Interval>,
    /// The MPS control daemon the claim runs; committed before it is started, so a crash
    /// half-way leaves an entry whose daemon is stopped at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<crate::mps::MpsDaemon>,
    /// The MIG partitions the claim's prepare makes (dynamic MIG), each committed before every
    /// step of its making, so a crash half-way leaves what is needed to find and destroy it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<MadePartition>,
}

/// A MIG partition made for a claim: where it goes, and what of it exists so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MadePartition {
    /// The partition's device name.
    pub device: String,
    /// UUID of the GPU it is made on.
    pub gpu: String,
    /// GPU-instance profile id.
    pub profile_id: u32,
    /// First memory slice of its placement.
    pub start: u32,
    /// Memory slices of its placement.
    pub size: u32,
    /// Compute slices.
    pub slices: u32,
    /// The GPU instance, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    /// The compute instance, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance: Option<u32>,
    /// The MIG device's UUID, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// The checkpoint's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Boot id of the node when written.
    pub boot_id: String,
    /// Claims by UID.
    pub claims: BTreeMap<String, ClaimEntry>,
}

impl Checkpoint {
    /// An empty checkpoint for this boot.
    pub fn empty(boot_id: &str) -> Self {
        Self {
            boot_id: boot_id.to_owned(),
            claims: BTreeMap::new(),
        }
    }

    /// Removes and returns the claims left in `PrepareStarted`.
    pub fn take_started(&mut self) -> Vec<(String, ClaimEntry)> {
        let started: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, e)| e.state == ClaimState::PrepareStarted)
            .map(|(uid, _)| uid.clone())
            .collect();
        started
            .into_iter()
            .filter_map(|uid| self.claims.remove_entry(&uid))
            .collect()
    }

    /// The claim (other than `uid`) holding, without admin access, a device of `pool` that
    /// `device` excludes ([`crate::devices::exclusive_pair`]: the same device, or a GPU and its
    /// shares), if any. Two allocations of one device that both carry a share id (a device
    /// offered to many claims, whose capacity the scheduler counted) do not exclude each other.
    pub fn exclusive_holder(
        &self,
        uid: &str,
        pool: &str,
        device: &str,
        shared: bool,
    ) -> Option<&str> {
        self.claims
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .find(|(_, e)| {
                e.devices.iter().any(|d| {
                    let both_shares = shared && d.share_id.is_some() && d.device == device;
                    !d.admin_access
                        && d.pool == pool
                        && !both_shares
                        && crate::devices::exclusive_pair(&d.device, device)
                })
            })
            .map(|(other, _)| other.as_str())
    }

    /// The claim (other than `uid`) that set another time-slice interval than `interval` on
    /// `gpu`, with the interval it set.
    pub fn time_slice_holder(
        &self,
        uid: &str,
        gpu: &str,
        interval: Interval,
    ) -> Option<(&str, Interval)> {
        self.claims
            .iter()
            .filter(|(other, _)| other.as_str() != uid)
            .find_map(|(other, e)| {
                let theirs = *e.time_slices.get(gpu)?;
                (theirs != interval).then_some((other.as_str(), theirs))
            })
    }

    /// The GPU instances the plugin made for claims, by GPU UUID.
    pub fn made_gpu_instances(&self) -> BTreeMap<String, std::collections::BTreeSet<u32>> {
        let mut made: BTreeMap<String, std::collections::BTreeSet<u32>> = BTreeMap::new();
        for p in self.claims.values().flat_map(|e| &e.partitions) {
            if let Some(gi) = p.gpu_instance {
                made.entry(p.gpu.clone()).or_default().insert(gi);
            }
        }
        made
    }

    /// The interval `gpu` should have with the claims held now (other than `except`): the one a
    /// claim set, else the driver's default.
    pub fn wanted_time_slice(&self, gpu: &str, except: &str) -> Interval {
        self.claims
            .iter()
            .filter(|(uid, _)| uid.as_str() != except)
            .find_map(|(_, e)| e.time_slices.get(gpu).copied())
            .unwrap_or(Interval::Default)
    }
}

/// Why stored bytes are not a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not the envelope.
    #[error("not a checkpoint envelope: {0}")]
    Envelope(String),
    /// Written by a newer build, in a format this build does not know.
    #[error("checkpoint version {0} is newer than this build reads (up to {VERSION})")]
    Newer(u32),
    /// A version no build writes.
    #[error("checkpoint version {0} does not exist")]
    Version(u32),
    /// The payload does not match its checksum.
    #[error("checksum mismatch: stored {stored}, computed {computed}")]
    Checksum {
        /// The stored checksum.
        stored: String,
        /// The payload's checksum.
        computed: String,
    },
    /// The payload is not a checkpoint.
    #[error("bad payload: {0}")]
    Payload(String),
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    version: u32,
    checksum: String,
    payload: Box<RawValue>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Serialises a checkpoint into its envelope.
pub fn encode(checkpoint: &Checkpoint) -> Vec<u8> {
    let payload = serde_json::to_string(checkpoint).expect("a checkpoint always serialises");
    let made_partitions = checkpoint.claims.values().any(|e| !e.partitions.is_empty());
    let envelope = Envelope {
        version: if made_partitions {
            PARTITIONS_VERSION
        } else {
            1
        },
        checksum: sha256_hex(payload.as_bytes()),
        payload: RawValue::from_string(payload).expect("serde_json output is JSON"),
    };
    serde_json::to_vec(&envelope).expect("an envelope always serialises")
}

/// Reads a checkpoint from its envelope, checking version and checksum.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
    let envelope: Envelope =
        serde_json::from_slice(bytes).map_err(|e| DecodeError::Envelope(e.to_string()))?;
    match envelope.version {
        v if v > VERSION => return Err(DecodeError::Newer(v)),
        // Format 2 only adds a field, which format 1 files lack.
        1 | PARTITIONS_VERSION => {}
        v => return Err(DecodeError::Version(v)),
    }
    let computed = sha256_hex(envelope.payload.get().as_bytes());
    if computed != envelope.checksum {
        return Err(DecodeError::Checksum {
            stored: envelope.checksum,
            computed,
        });
    }
    serde_json::from_str(envelope.payload.get()).map_err(|e| DecodeError::Payload(e.to_string()))
}

/// What loading found, besides the checkpoint to start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No file yet.
    Missing,
    /// The stored checkpoint, from this boot.
    Restored,
    /// The stored checkpoint came from an earlier boot and was dropped.
    NewBoot {
        /// Its boot id.
        previous: String,
    },
    /// The stored file was unreadable, moved aside; the plugin starts empty.
    Corrupted {
        /// Where the bad file now is.
        moved_to: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

/// Decides what to start from, given what was read: the pure part of [`CheckpointStore::load`].
/// `Err(reason)` means the stored bytes are corrupted and must be moved aside.
/// `written_before_boot`: the stored file was last written before this boot began.
pub fn recover(
    stored: Option<Result<Checkpoint, DecodeError>>,
    boot_id: &str,
    written_before_boot: bool,
) -> (Checkpoint, Result<LoadOutcome, String>) {
    match stored {
        None => (Checkpoint::empty(boot_id), Ok(LoadOutcome::Missing)),
        Some(Ok(cp)) if cp.boot_id == boot_id => (cp, Ok(LoadOutcome::Restored)),
        Some(Ok(cp)) => (
            Checkpoint::empty(boot_id),
            Ok(LoadOutcome::NewBoot {
                previous: cp.boot_id,
            }),
        ),
        // Unreadable, but from an earlier boot: a write that boot's end cut short. Discarded
        // as any earlier boot's checkpoint is.
        Some(Err(e)) if written_before_boot => (
            Checkpoint::empty(boot_id),
            Ok(LoadOutcome::NewBoot {
                previous: format!("unknown (unreadable: {e})"),
            }),
        ),
        Some(Err(e)) => (Checkpoint::empty(boot_id), Err(e.to_string())),
    }
}

/// When this boot began, from the `btime` line of `/proc/stat` at `path`.
pub fn read_boot_time(path: &Path) -> io::Result<std::time::SystemTime> {
    let stat = std::fs::read_to_string(path)?;
    let secs = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| io::Error::other(format!("no btime line in {}", path.display())))?;
    Ok(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// The checkpoint file of one plugin data directory.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    path: PathBuf,
    boot_id: String,
    /// When this boot began, where known.
    boot_time: Option<std::time::SystemTime>,
}

impl CheckpointStore {
    /// The store in `dir`, for the boot identified by `boot_id`.
    pub fn new(dir: &Path, boot_id: &str) -> Self {
        Self {
            path: dir.join(FILE_NAME),
            boot_id: boot_id.trim().to_owned(),
            boot_time: None,
        }
    }

    /// Tells the store when this boot began ([`read_boot_time`]), so an unreadable file last
    /// written before then counts as an earlier boot's, not as corrupted.
    pub fn with_boot_time(mut self, boot_time: std::time::SystemTime) -> Self {
        self.boot_time = Some(boot_time);
        self
    }

    /// Reads the boot id from `path` (normally [`BOOT_ID_PATH`]).
    pub fn read_boot_id(path: &Path) -> io::Result<String> {
        Ok(std::fs::read_to_string(path)?.trim().to_owned())
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This boot's id.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Loads the checkpoint, moving a corrupted file aside. Fails on a file a newer build wrote
    /// (leaving it in place), on no other content.
    pub fn load(&self) -> io::Result<(Checkpoint, LoadOutcome)> {
        let stored = match std::fs::read(&self.path) {
            Ok(bytes) => Some(decode(&bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Some(Err(DecodeError::Newer(version))) = &stored {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "checkpoint {} was written by a newer plugin (format {version}; this build reads up to {VERSION}): \
                     its claims are still prepared, so it is left as it is. Roll the plugin forward \
                     again, or move the file away to start without them",
                    self.path.display()
                ),
            ));
        }
        let written_before_boot = match (self.boot_time, &stored) {
            (Some(boot), Some(Err(_))) => std::fs::metadata(&self.path)
                .and_then(|m| m.modified())
                .is_ok_and(|written| written < boot),
            _ => false,
        };
        let (checkpoint, outcome) = recover(stored, &self.boot_id, written_before_boot);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(reason) => {
                let moved_to = self.aside_path();
                std::fs::rename(&self.path, &moved_to)?;
                LoadOutcome::Corrupted { moved_to, reason }
            }
        };
        Ok((checkpoint, outcome))
    }

    /// Writes the checkpoint atomically, without fsync (see the module's crash analysis).
    pub fn save(&self, checkpoint: &Checkpoint) -> io::Result<()> {
        replace(&self.path, &encode(checkpoint), Durability::ProcessCrash)
    }

    fn aside_path(&self) -> PathBuf {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        self.path
            .with_file_name(format!("{FILE_NAME}.corrupted-{stamp}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn device(name: &str, admin: bool) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool: "node-a".into(),
            device: name.into(),
            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim=uid-{name}")],
            admin_access: admin,
            share_id: None,
            made_uuid: None,
        }
    }

    fn sample() -> Checkpoint {
        let mut cp = Checkpoint::empty("boot-1");
        cp.claims.insert(
            "uid-a".into(),
            ClaimEntry {
                state: ClaimState::PrepareCompleted,
                namespace: "ns".into(),
                name: "a".into(),
                devices: vec![device("gpu-0", false), device("gpu-1", true)],
                time_slices: BTreeMap::new(),
                mps: None,
                partitions: Vec::new(),
            },
        );
        cp.claims.insert(
            "uid-b".into(),
            ClaimEntry {
                state: ClaimState::PrepareStarted,
                namespace: "ns".into(),
                name: "b".into(),
                devices: vec![device("gpu-2", false)],
                time_slices: BTreeMap::from([("GPU-2".into(), Interval::Short)]),
                mps: None,
                partitions: Vec::new(),
            },
        );
        cp
    }

    #[test]
    fn claims_sharing_a_gpu_must_agree_on_its_interval() {
        let cp = sample();
        assert_eq!(
            cp.time_slice_holder("uid-c", "GPU-2", Interval::Long),
            Some(("uid-b", Interval::Short))
        );
        assert_eq!(
            cp.time_slice_holder("uid-c", "GPU-2", Interval::Short),
            None
        );
        assert_eq!(cp.time_slice_holder("uid-b", "GPU-2", Interval::Long), None);
        assert_eq!(cp.wanted_time_slice("GPU-2", "uid-c"), Interval::Short);
        assert_eq!(cp.wanted_time_slice("GPU-2", "uid-b"), Interval::Default);
        assert_eq!(cp.wanted_time_slice("GPU-0", ""), Interval::Default);
    }

    #[test]
    fn an_entry_written_before_time_slices_existed_reads_as_holding_none() {
        let older = br#"{"state":"PrepareCompleted","namespace":"ns","name":"a","devices":[]}"#;
        let entry: ClaimEntry = serde_json::from_slice(older).unwrap();
        assert!(entry.time_slices.is_empty());
        let written = serde_json::to_string(&entry).unwrap();
        assert!(!written.contains("timeSlices"), "{written}");
    }

    #[test]
    fn round_trips() {
        assert_eq!(decode(&encode(&sample())).unwrap(), sample());
    }

    #[test]
    fn a_flipped_byte_fails_the_checksum() {
        let bytes = encode(&sample());
        let text = String::from_utf8(bytes).unwrap().replace("gpu-0", "gpu-7");
        assert!(matches!(
            decode(text.as_bytes()),
            Err(DecodeError::Checksum { .. })
        ));
    }

    #[test]
    fn other_versions_are_refused() {
        let text = String::from_utf8(encode(&sample()))
            .unwrap()
            .replace("\"version\":1", "\"version\":9");
        assert_eq!(decode(text.as_bytes()), Err(DecodeError::Newer(9)));
        let text = String::from_utf8(encode(&sample()))
            .unwrap()
            .replace("\"version\":1", "\"version\":0");
        assert_eq!(decode(text.as_bytes()), Err(DecodeError::Version(0)));
    }

    #[test]
    fn started_claims_are_taken_out() {
        let mut cp = sample();
        let started = cp.take_started();
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].0, "uid-b");
        assert_eq!(cp.claims.keys().collect::<Vec<_>>(), ["uid-a"]);
    }

    #[test]
    fn exclusive_holders_ignore_admin_access_and_self() {
        let cp = sample();
        assert_eq!(
            cp.exclusive_holder("uid-x", "node-a", "gpu-0", false),
            Some("uid-a")
        );
        assert_eq!(
            cp.exclusive_holder("uid-x", "node-a", "gpu-2", false),
            Some("uid-b")
        );
        assert_eq!(cp.exclusive_holder("uid-a", "node-a", "gpu-0", false), None);
        assert_eq!(cp.exclusive_holder("uid-x", "node-a", "gpu-1", false), None);
        assert_eq!(cp.exclusive_holder("uid-x", "node-b", "gpu-0", false), None);
    }

    #[test]
    fn shares_of_one_device_coexist_and_exclude_a_whole_claim() {
        let mut cp = Checkpoint::empty("boot-1");
        let mut shared = device("gpu-3", false);
        shared.share_id = Some("s-1".into());
        cp.claims.insert(
            "uid-s".into(),
            ClaimEntry {
                state: ClaimState::PrepareCompleted,
                namespace: "ns".into(),
                name: "s".into(),
                devices: vec![shared],
                time_slices: BTreeMap::new(),
                mps: None,
                partitions: Vec::new(),
            },
        );
        assert_eq!(cp.exclusive_holder("uid-t", "node-a", "gpu-3", true), None);
        assert_eq!(
            cp.exclusive_holder("uid-t", "node-a", "gpu-3", false),
            Some("uid-s"),
            "a claim without a share id holds the device alone"
        );
        assert_eq!(
            cp.exclusive_holder("uid-t", "node-a", "gpu-3-shared-a", true),
            Some("uid-s"),
            "a GPU class's share of a GPU other claims consume"
        );
    }

    /// Re-envelopes `payload` (JSON) as `version`, with its checksum.
    fn envelope(version: u32, payload: &str) -> String {
        format!(
            r#"{{"version":{version},"checksum":"{}","payload":{payload}}}"#,
            sha256_hex(payload.as_bytes())
        )
    }

    #[test]
    fn fields_a_later_build_added_within_the_version_are_skipped_checksum_intact() {
        let mut payload: serde_json::Value = serde_json::to_value(sample()).unwrap();
        payload["claims"]["uid-a"]["laterClaimField"] = serde_json::json!({"pod": "p"});
        payload["laterField"] = serde_json::json!(true);
        let text = envelope(VERSION, &payload.to_string());
        assert_eq!(decode(text.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn a_checkpoint_is_format_2_only_while_a_claim_holds_a_mig_partition() {
        let version = |cp: &Checkpoint| {
            let envelope: serde_json::Value = serde_json::from_slice(&encode(cp)).unwrap();
            envelope["version"].as_u64().unwrap()
        };
        let mut cp = sample();
        assert_eq!(version(&cp), 1, "what builds of format 1 read");
        cp.claims
            .get_mut("uid-a")
            .unwrap()
            .partitions
            .push(MadePartition {
                device: "gpu-0-mig-1g10gb-19-0".into(),
                gpu: "GPU-0".into(),
                profile_id: 19,
                start: 0,
                size: 1,
                slices: 1,
                gpu_instance: Some(7),
                compute_instance: None,
                uuid: None,
            });
        assert_eq!(version(&cp), 2);
        assert_eq!(decode(&encode(&cp)).unwrap(), cp);
        assert_eq!(
            cp.made_gpu_instances(),
            BTreeMap::from([("GPU-0".to_owned(), std::collections::BTreeSet::from([7]))])
        );
    }

    #[test]
    fn a_newer_builds_checkpoint_is_refused_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), "boot-1");
        let payload = serde_json::to_string(&sample()).unwrap();
        let newer = envelope(VERSION + 1, &payload);
        std::fs::write(store.path(), &newer).unwrap();
        let err = store.load().unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&store.path().display().to_string())
                && message.contains(&format!("format {}", VERSION + 1))
                && message.contains("Roll the plugin forward"),
            "{message}"
        );
        assert_eq!(std::fs::read_to_string(store.path()).unwrap(), newer);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "nothing moved aside"
        );
    }

    #[test]
    fn load_handles_missing_new_boot_and_corrupted_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), "boot-1\n");
        assert_eq!(store.boot_id(), "boot-1");
        let (cp, outcome) = store.load().unwrap();
        assert_eq!(
            (cp, outcome),
            (Checkpoint::empty("boot-1"), LoadOutcome::Missing)
        );

        store.save(&sample()).unwrap();
        assert_eq!(store.load().unwrap(), (sample(), LoadOutcome::Restored));

        let rebooted = CheckpointStore::new(dir.path(), "boot-2");
        assert_eq!(
            rebooted.load().unwrap(),
            (
                Checkpoint::empty("boot-2"),
                LoadOutcome::NewBoot {
                    previous: "boot-1".into()
                }
            )
        );

        std::fs::write(store.path(), b"{\"version\":1,").unwrap();
        let (cp, outcome) = store.load().unwrap();
        assert_eq!(cp, Checkpoint::empty("boot-1"));
        let LoadOutcome::Corrupted { moved_to, reason } = outcome else {
            panic!("expected Corrupted, got {outcome:?}");
        };
        assert!(reason.contains("envelope"), "{reason}");
        assert_eq!(std::fs::read(&moved_to).unwrap(), b"{\"version\":1,");
        assert!(!store.path().exists());
    }

    #[test]
    fn a_file_left_unreadable_by_the_end_of_an_earlier_boot_is_that_boots_not_corrupted() {
        let dir = tempfile::tempdir().unwrap();
        // A minute ago: the kernel stamps files from a coarse clock, which can lag `now()` by a
        // tick, so a file written "now" could otherwise look older than a boot at `now()`.
        let boot = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let store = CheckpointStore::new(dir.path(), "boot-2").with_boot_time(boot);
        // A torn write (no fsync) cut by a power loss an hour before this boot.
        std::fs::write(store.path(), b"{\"version\":1,").unwrap();
        std::fs::File::options()
            .write(true)
            .open(store.path())
            .unwrap()
            .set_modified(boot - std::time::Duration::from_secs(3600))
            .unwrap();
        let (cp, outcome) = store.load().unwrap();
        assert_eq!(cp, Checkpoint::empty("boot-2"));
        assert!(
            matches!(&outcome, LoadOutcome::NewBoot { previous } if previous.starts_with("unknown (unreadable")),
            "{outcome:?}"
        );
        // The same bytes written during this boot are a corruption, moved aside.
        std::fs::write(store.path(), b"{\"version\":1,").unwrap();
        let (_, outcome) = store.load().unwrap();
        assert!(
            matches!(outcome, LoadOutcome::Corrupted { .. }),
            "{outcome:?}"
        );
    }

    #[test]
    fn the_boot_time_is_the_btime_of_proc_stat() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("stat");
        std::fs::write(&stat, "cpu  1 2 3\nintr 5\nbtime 1764806400\nprocesses 9\n").unwrap();
        assert_eq!(
            read_boot_time(&stat).unwrap(),
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_764_806_400)
        );
        std::fs::write(&stat, "cpu  1 2 3\n").unwrap();
        assert!(read_boot_time(&stat).is_err());
        // This machine's own.
        assert!(read_boot_time(Path::new("/proc/stat")).unwrap() < std::time::SystemTime::now());
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decoding_mutated_checkpoints_never_panics(pos in 0usize..400, byte in any::<u8>()) {
            let mut bytes = encode(&sample());
            let at = pos % bytes.len();
            bytes[at] = byte;
            let _ = decode(&bytes);
        }
    }
}
