//! Dynamic MIG: which MIG partitions a GPU offers, and the counters that let the scheduler, not
//! the plugin, decide which of them fit together.
//!
//! In dynamic mode a GPU offers one device per GPU-instance profile and placement it supports,
//! named as the static MIG device it becomes (`gpu-<minor>-mig-<profile>-<profileId>-<start>`), and
//! its whole card. They draw on one counter set per GPU, named after the whole card:
//! - `memory-slice-<i>`, one per memory slice: a partition consumes the slices of its placement,
//!   the whole card all of them. Two partitions sharing a slice, or a partition and its card,
//!   never fit together; that is MIG's placement rule.
//! - `instances-<profile>` for a profile whose instance count is below the number of its
//!   placements that fit side by side (the `+me` profiles: one per GPU): each of its partitions
//!   consumes one.
//!
//! Pure functions of the inventory; [`crate::slices`] publishes what they decide.

use crate::devices::{DeviceTable, NodeDevice, Partition, profile_slug};
use gpu_discovery::{Gpu, Inventory, MigMode, MigPlacement};
use std::collections::{BTreeMap, BTreeSet};

/// How MIG devices come to be on the node's GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Partitioning {
    /// An admin partitions GPUs beforehand; the plugin publishes the MIG devices it finds.
    #[default]
    Static,
    /// The plugin publishes every partition a GPU supports and makes the one a claim is given
    /// when the claim is prepared.
    Dynamic,
}

impl std::str::FromStr for Partitioning {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "static" => Ok(Self::Static),
            "dynamic" => Ok(Self::Dynamic),
            other => Err(format!(
                "MIG partitioning {other:?} is neither static nor dynamic"
            )),
        }
    }
}

/// What one GPU offers in dynamic mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOffer {
    /// The whole card, where it can be given whole.
    pub whole: Option<NodeDevice>,
    /// The partitions it can be given in.
    pub partitions: Vec<NodeDevice>,
    /// MIG devices the plugin did not make (an admin's), offered as they are.
    pub existing: Vec<NodeDevice>,
    /// Why the GPU offers no partition, or fewer than it supports.
    pub note: Option<String>,
}

/// Whether changing `architecture`'s MIG mode needs a GPU reset: Ampere's does (the MIG user
/// guide); Hopper and later change it in place.
pub fn mode_change_needs_reset(architecture: &str) -> bool {
    architecture == "Ampere"
}

/// What `gpu` offers in dynamic mode, given the GPU instances on it the plugin made for claims
/// (`made`: GPU-instance ids). MIG devices someone else made stay as they are: offered as static
/// devices, with the partitions overlapping them and the whole card left out.
pub fn offer(gpu: &Gpu, made: &BTreeSet<u32>) -> GpuOffer {
    let whole_only = |note: Option<String>| GpuOffer {
        whole: Some(NodeDevice::whole_gpu(gpu)),
        partitions: Vec::new(),
        existing: Vec::new(),
        note,
    };
    if gpu.mig_mode == MigMode::NotSupported {
        return whole_only(None);
    }
    if gpu.mig_profiles.is_empty() {
        return whole_only(Some(format!(
            "the driver lists no MIG profile for {} while MIG is off (drivers before R550 do not)",
            gpu.uuid
        )));
    }
    let needs_reset = mode_change_needs_reset(&gpu.architecture);
    if needs_reset && gpu.mig_mode == MigMode::Disabled {
        return whole_only(Some(format!(
            "MIG is off on {} and an {} GPU changes MIG mode only with a GPU reset: turn MIG on \
             (nvidia-smi -i {} -mig 1, then reset the GPU) to offer it in partitions",
            gpu.uuid, gpu.architecture, gpu.uuid
        )));
    }
    let foreign: Vec<_> = gpu
        .mig_devices
        .iter()
        .filter(|m| !made.contains(&m.gpu_instance_id))
        .collect();
    let taken: Vec<MigPlacement> = foreign
        .iter()
        .map(|m| MigPlacement {
            start: m.placement_start,
            size: m.placement_size,
        })
        .collect();
    let partitions = gpu
        .mig_profiles
        .iter()
        .flat_map(|profile| {
            profile
                .placements
                .iter()
                .filter(|p| !taken.iter().any(|t| t.overlaps(**p)))
                .map(move |p| NodeDevice::partition(gpu, profile, *p))
        })
        .collect();
    let whole = (foreign.is_empty() && !(needs_reset && gpu.mig_mode == MigMode::Enabled))
        .then(|| NodeDevice::whole_gpu(gpu));
    let note = (!foreign.is_empty()).then(|| {
        format!(
            "{} MIG device(s) on {} were not made by this plugin: they are offered as they are, \
             without the partitions overlapping them or the whole card",
            foreign.len(),
            gpu.uuid
        )
    });
    GpuOffer {
        whole,
        partitions,
        existing: foreign
            .into_iter()
            .map(|m| NodeDevice::mig(gpu, m))
            .collect(),
        note,
    }
}

/// The devices of an inventory in dynamic MIG mode ([`offer`] for each GPU), given the GPU
/// instances the plugin made for prepared claims (`made`, by GPU UUID); with why a GPU offers fewer
/// partitions than it supports, where it does.
pub fn table(
    inventory: &Inventory,
    made: &BTreeMap<String, BTreeSet<u32>>,
) -> (DeviceTable, Vec<String>) {
    let none = BTreeSet::new();
    let mut notes = Vec::new();
    let mut devices = BTreeMap::new();
    for gpu in &inventory.gpus {
        let offer = offer(gpu, made.get(&gpu.uuid).unwrap_or(&none));
        notes.extend(offer.note);
        for d in offer
            .whole
            .into_iter()
            .chain(offer.partitions)
            .chain(offer.existing)
        {
            devices.insert(d.name.clone(), d);
        }
    }
    let table = DeviceTable {
        devices,
        ..DeviceTable::from_inventory(&Inventory {
            gpus: Vec::new(),
            ..inventory.clone()
        })
    };
    (table, notes)
}

/// Prefix of a memory-slice counter.
const MEMORY_SLICE: &str = "memory-slice-";
/// Prefix of a profile's instance counter.
const INSTANCES: &str = "instances-";

/// The counters of one GPU's partitions, with their capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuCounters {
    /// Memory slices (one counter each).
    pub memory_slices: u32,
    /// Profiles whose instance count binds (by name), with that count.
    pub limited: BTreeMap<String, u32>,
}

/// The most placements of `placements` that fit side by side (earliest end first).
fn most_side_by_side(placements: &[MigPlacement]) -> u32 {
    let mut sorted = placements.to_vec();
    sorted.sort_by_key(|p| p.start + p.size);
    let mut end = 0;
    let mut count = 0;
    for p in sorted {
        if p.start >= end {
            end = p.start + p.size;
            count += 1;
        }
    }
    count
}

/// The counters `partitions` (one GPU's) draw on.
pub fn gpu_counters<'a>(partitions: impl IntoIterator<Item = &'a Partition>) -> GpuCounters {
    let mut counters = GpuCounters::default();
    let mut by_profile: BTreeMap<&str, (u32, Vec<MigPlacement>)> = BTreeMap::new();
    for p in partitions {
        counters.memory_slices = counters
            .memory_slices
            .max(p.placement.start + p.placement.size);
        let entry = by_profile
            .entry(&p.profile.name)
            .or_insert((p.profile.instances, Vec::new()));
        entry.1.push(p.placement);
    }
    for (name, (instances, placements)) in by_profile {
        if instances < most_side_by_side(&placements) {
            counters.limited.insert(name.to_owned(), instances);
        }
    }
    counters
}

impl GpuCounters {
    /// Every counter with its capacity.
    pub fn capacities(&self) -> BTreeMap<String, u64> {
        let slices = (0..self.memory_slices).map(|i| (format!("{MEMORY_SLICE}{i}"), 1));
        let limited = self
            .limited
            .iter()
            .map(|(name, n)| (instances_counter(name), u64::from(*n)));
        slices.chain(limited).collect()
    }

    /// What `partition` consumes.
    pub fn partition(&self, partition: &Partition) -> BTreeMap<String, u64> {
        let mut used: BTreeMap<String, u64> = partition
            .placement
            .slices()
            .map(|i| (format!("{MEMORY_SLICE}{i}"), 1))
            .collect();
        if self.limited.contains_key(&partition.profile.name) {
            used.insert(instances_counter(&partition.profile.name), 1);
        }
        used
    }

    /// What the whole card consumes: every memory slice.
    pub fn whole(&self) -> BTreeMap<String, u64> {
        (0..self.memory_slices)
            .map(|i| (format!("{MEMORY_SLICE}{i}"), 1))
            .collect()
    }
}

/// The counter of a profile's instances (`instances-1g10gb-me`).
fn instances_counter(profile: &str) -> String {
    format!("{INSTANCES}{}", profile_slug(profile))
}

#[cfg(test)]
mod tests;
