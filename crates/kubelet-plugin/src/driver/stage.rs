//! One claim's prepare and unprepare, staged in memory and on the CDI folder until the call
//! commits (see [`super`]): the exclusive-use check, time slices and MPS daemons set up or
//! taken down, the CDI spec written or removed, and undoing it all when a step fails.

use super::{ClaimFailure, ClaimSource, Driver, Staged};
use crate::cdi;
use crate::checkpoint::{Checkpoint, ClaimEntry, ClaimState, MadePartition};
use crate::claim;
use crate::devices::{DeviceKind, NodeDevice};
use crate::types::{ClaimRef, PreparedDevice};
use gpu_discovery::MigPlacement;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::Instant;

/// The partitions among `devices`, as the checkpoint records them before they are made.
fn planned_partitions(devices: &[NodeDevice]) -> Vec<MadePartition> {
    devices
        .iter()
        .filter_map(|d| match &d.kind {
            DeviceKind::Partition(p) => Some(MadePartition {
                device: d.name.clone(),
                gpu: d.gpu.gpu_uuid.clone(),
                profile_id: p.profile.id,
                start: p.placement.start,
                size: p.placement.size,
                slices: p.profile.slices,
                gpu_instance: None,
                compute_instance: None,
                uuid: None,
            }),
            _ => None,
        })
        .collect()
}

impl<C: ClaimSource> Driver<C> {
    pub(super) fn completed(checkpoint: &Checkpoint, uid: &str) -> Option<Vec<PreparedDevice>> {
        checkpoint
            .claims
            .get(uid)
            .filter(|e| e.state == ClaimState::PrepareCompleted)
            .map(|e| e.devices.clone())
    }

    /// Prepares one claim in memory and on the CDI folder; the call commits it.
    pub(super) async fn stage_prepare(
        &self,
        claim: &ClaimRef,
    ) -> Result<Staged<Vec<PreparedDevice>>, ClaimFailure> {
        let _claim = self.claim_locks.lock(&claim.uid).await;
        if let (Some(answer), version) = self.ledger.read(|cp| Self::completed(cp, &claim.uid)) {
            return Ok(Staged {
                answer,
                version,
                added: false,
            });
        }
        let asked = Instant::now();
        let object = self.claims.get(&claim.namespace, &claim.name).await;
        if let Some(m) = &self.metrics {
            m.observe_claim_read(asked.elapsed());
        }
        let object = object?;
        let allocated = claim::allocated_devices(&object, claim, &self.driver_name, &self.pool)?;
        let claim::Resolved {
            mut devices,
            time_slices,
            mps,
        } = claim::resolve(&object, &allocated, &self.table, &self.driver_name)?;
        let partitions = planned_partitions(&devices);
        // Whole cards of GPUs also offered in partitions: MIG must be off for them.
        let mig_off: BTreeSet<String> = devices
            .iter()
            .filter(|d| !matches!(d.kind, DeviceKind::Partition(_) | DeviceKind::Mig(_)))
            .filter(|d| self.table.offers_partitions(d.gpu.minor))
            .map(|d| d.gpu.gpu_uuid.clone())
            .collect();
        let mut prepared: Vec<PreparedDevice> = allocated
            .iter()
            .map(|a| PreparedDevice {
                request_names: vec![a.request.clone()],
                pool: self.pool.clone(),
                device: a.device.clone(),
                cdi_device_ids: vec![cdi::device_id(&claim.uid, &a.device)],
                admin_access: a.admin_access,
                share_id: a.share_id.clone(),
                made_uuid: None,
            })
            .collect();

        let (reserved, version) = self.ledger.change(|state| {
            if let Some(done) = Self::completed(state, &claim.uid) {
                return Ok(Some(done));
            }
            for d in prepared.iter().filter(|d| !d.admin_access) {
                let shared = d.share_id.is_some();
                if let Some(holder) = state.exclusive_holder(&claim.uid, &d.pool, &d.device, shared)
                {
                    return Err(ClaimFailure::DeviceInUse {
                        device: d.device.clone(),
                        holder: holder.to_string(),
                    });
                }
            }
            for (gpu, &asked) in &time_slices {
                if let Some((holder, held)) = state.time_slice_holder(&claim.uid, gpu, asked) {
                    return Err(ClaimFailure::TimeSliceConflict {
                        gpu: gpu.clone(),
                        asked,
                        holder: describe(state, holder),
                        held,
                    });
                }
            }
            state.claims.insert(
                claim.uid.clone(),
                ClaimEntry {
                    state: ClaimState::PrepareStarted,
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    devices: prepared.clone(),
                    time_slices: time_slices.clone(),
                    mps: mps.clone(),
                    partitions: partitions.clone(),
                },
            );
            Ok(None)
        });
        if let Some(answer) = reserved? {
            return Ok(Staged {
                answer,
                version,
                added: false,
            });
        }
        if !time_slices.is_empty() || mps.is_some() || !partitions.is_empty() {
            // What follows changes the node where the table cannot find it again: commit first.
            if let Err(e) = self.ledger.commit(version).await {
                self.take_back(claim);
                return Err(ClaimFailure::Checkpoint(e.to_string()));
            }
        }
        for (gpu, &interval) in &time_slices {
            if let Err(reason) = self.slicer.set(gpu, interval).await {
                self.abandon(claim).await;
                return Err(ClaimFailure::TimeSlice {
                    gpu: gpu.clone(),
                    reason,
                });
            }
        }
        if let Some(daemon) = &mps
            && let Err(reason) = self.daemons.start(&claim.uid, daemon).await
        {
            self.abandon(claim).await;
            return Err(ClaimFailure::Mps(reason));
        }

        for gpu in &mig_off {
            let _mode = self.mig_locks.lock(gpu).await;
            if let Err(reason) = self.partitioner.set_mig(gpu, false).await {
                self.abandon(claim).await;
                return Err(ClaimFailure::Partition {
                    device: gpu.clone(),
                    reason,
                });
            }
        }
        if let Err(e) = self.make_partitions(claim, &mut devices).await {
            self.abandon(claim).await;
            return Err(e);
        }
        // What was made is answered and recorded with its UUID (the claim's status shows it).
        for p in &partitions {
            let made = devices.iter().find(|d| d.name == p.device);
            for d in prepared.iter_mut().filter(|d| d.device == p.device) {
                d.made_uuid = made.map(|m| m.uuid.clone());
            }
        }

        let cdi = self.cdi.clone();
        let uid = claim.uid.clone();
        let daemon = mps.clone();
        let written = tokio::task::spawn_blocking(move || {
            cdi.write(&uid, &devices.iter().collect::<Vec<_>>(), daemon.as_ref())
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e).into()));
        if let Err(e) = written {
            self.abandon(claim).await;
            return Err(ClaimFailure::CdiWrite(e.to_string()));
        }
        let (still_there, version) = self.ledger.change(|state| {
            state.claims.get_mut(&claim.uid).map(|entry| {
                entry.state = ClaimState::PrepareCompleted;
                entry.devices.clone_from(&prepared);
            })
        });
        if still_there.is_none() {
            // Unprepared while its spec was being written: leave nothing behind.
            let _ = self.cdi.remove(&claim.uid);
            if mps.is_some() {
                let _ = self.daemons.stop(&claim.uid).await;
            }
            return Err(ClaimFailure::Unprepared);
        }
        Ok(Staged {
            answer: prepared,
            version,
            added: true,
        })
    }

    /// Forgets a claim this call added and undoes what it changed on the node: its daemon
    /// stopped, its GPUs' intervals put back to what the remaining claims want (best effort,
    /// for failures; what fails is logged, and the next start sweeps daemons again).
    pub(super) async fn abandon(&self, claim: &ClaimRef) {
        let (entry, _) = self.ledger.read(|cp| cp.claims.get(&claim.uid).cloned());
        self.take_back(claim);
        let Some(entry) = entry else { return };
        if entry.mps.is_some()
            && let Err(e) = self.daemons.stop(&claim.uid).await
        {
            tracing::warn!(claim = %claim, error = %e, "stopping the MPS control daemon after a failed prepare");
        }
        let gpus = entry.time_slices.into_keys().collect();
        for (gpu, e) in self.settle_time_slices(&gpus).await {
            tracing::warn!(%gpu, error = %e, "restoring a GPU's time-slice interval after a failed prepare");
        }
        let (held, _) = self.ledger.read(|cp| cp.made_gpu_instances());
        for p in entry.partitions.iter().filter(|p| p.gpu_instance.is_some()) {
            if let Err(e) = self.destroy_partition(p, &held).await {
                tracing::warn!(claim = %claim, device = %p.device, error = %e, "destroying a MIG partition after a failed prepare");
            }
        }
    }

    /// Makes the partitions among `devices`, each step committed before the next, and puts the
    /// MIG device made in place of each.
    async fn make_partitions(
        &self,
        claim: &ClaimRef,
        devices: &mut [NodeDevice],
    ) -> Result<(), ClaimFailure> {
        for device in devices.iter_mut() {
            let DeviceKind::Partition(p) = &device.kind else {
                continue;
            };
            let name = device.name.clone();
            let fail = |reason: String| ClaimFailure::Partition {
                device: name.clone(),
                reason,
            };
            let gpu = device.gpu.gpu_uuid.clone();
            let held = self.mig_locks.lock(&gpu).await;
            self.partitioner.set_mig(&gpu, true).await.map_err(fail)?;
            let gi = self
                .partitioner
                .create_gpu_instance(&gpu, p.profile.id, p.placement)
                .await
                .map_err(fail)?;
            drop(held);
            self.record(claim, &name, |m| m.gpu_instance = Some(gi))
                .await?;
            let ci = self
                .partitioner
                .create_compute_instance(&gpu, gi, p.profile.slices)
                .await
                .map_err(fail)?;
            self.record(claim, &name, |m| m.compute_instance = Some(ci))
                .await?;
            let uuid = self
                .partitioner
                .mig_uuid(&gpu, gi, ci)
                .await
                .map_err(fail)?;
            self.ledger.change(|state| {
                Self::partition_of(state, claim, &name).map(|m| m.uuid = Some(uuid.clone()))
            });
            let made = p.made(&device.gpu, gi, ci, &uuid);
            device.uuid = uuid;
            device.kind = DeviceKind::Mig(made);
        }
        Ok(())
    }

    fn partition_of<'s>(
        state: &'s mut Checkpoint,
        claim: &ClaimRef,
        device: &str,
    ) -> Option<&'s mut MadePartition> {
        state
            .claims
            .get_mut(&claim.uid)?
            .partitions
            .iter_mut()
            .find(|m| m.device == device)
    }

    /// Records a step of making `device` in the claim's entry and commits it.
    async fn record(
        &self,
        claim: &ClaimRef,
        device: &str,
        step: impl FnOnce(&mut MadePartition),
    ) -> Result<(), ClaimFailure> {
        let (_, version) = self
            .ledger
            .change(|state| Self::partition_of(state, claim, device).map(step));
        self.ledger
            .commit(version)
            .await
            .map(drop)
            .map_err(|e| ClaimFailure::Checkpoint(e.to_string()))
    }

    /// Destroys a partition's GPU instance (and its compute instance): the one recorded, else
    /// the one of its profile at its placement, which only a crash before the id was recorded
    /// leaves; never one in `held` (made for a prepared claim).
    pub(super) async fn destroy_partition(
        &self,
        p: &MadePartition,
        held: &BTreeMap<String, BTreeSet<u32>>,
    ) -> Result<(), String> {
        let placement = MigPlacement {
            start: p.start,
            size: p.size,
        };
        let instances = match p.gpu_instance {
            Some(gi) => vec![gi],
            None => {
                self.partitioner
                    .find(&p.gpu, p.profile_id, placement)
                    .await?
            }
        };
        let _mode = self.mig_locks.lock(&p.gpu).await;
        let kept = held.get(&p.gpu);
        for gi in instances {
            if p.gpu_instance.is_none() && kept.is_some_and(|k| k.contains(&gi)) {
                continue;
            }
            self.partitioner.destroy(&p.gpu, p.profile_id, gi).await?;
        }
        // A GPU that changes MIG mode in place goes back to MIG off with its last partition, as
        // it was before: so a static plugin, the device plugin or a whole-card claim finds it usable.
        let in_place = self
            .table
            .devices
            .get(&p.device)
            .is_some_and(|d| !crate::partitions::mode_change_needs_reset(&d.gpu.architecture));
        if in_place && let Err(e) = self.partitioner.release(&p.gpu).await {
            tracing::warn!(gpu = %p.gpu, error = %e, "turning MIG off after the GPU's last partition");
        }
        Ok(())
    }

    /// Forgets a claim this call added: its spec and its entry (best effort, for failures).
    pub(super) fn take_back(&self, claim: &ClaimRef) {
        let _ = self.cdi.remove(&claim.uid);
        self.ledger.change(|state| state.claims.remove(&claim.uid));
    }

    /// Unprepares one claim in memory and on the CDI folder; the call commits it. Unknown
    /// claims succeed once what is known is committed.
    pub(super) async fn stage_unprepare(
        &self,
        claim: &ClaimRef,
    ) -> Result<Staged<()>, ClaimFailure> {
        let _claim = self.claim_locks.lock(&claim.uid).await;
        let (known, version) = self.ledger.read(|cp| cp.claims.contains_key(&claim.uid));
        // The GPUs whose interval changes when this claim goes, set before it is forgotten so
        // that a failure leaves the claim for the kubelet's retry.
        let (restores, _) = self.ledger.read(|cp| {
            cp.claims.get(&claim.uid).map_or_else(Vec::new, |entry| {
                entry
                    .time_slices
                    .iter()
                    .map(|(gpu, &mine)| (gpu.clone(), mine, cp.wanted_time_slice(gpu, &claim.uid)))
                    .filter(|(_, mine, wanted)| mine != wanted)
                    .map(|(gpu, _, wanted)| (gpu, wanted))
                    .collect()
            })
        });
        for (gpu, wanted) in restores {
            self.slicer
                .set(&gpu, wanted)
                .await
                .map_err(|reason| ClaimFailure::TimeSlice { gpu, reason })?;
        }
        let (runs_daemon, _) = self.ledger.read(|cp| {
            cp.claims
                .get(&claim.uid)
                .is_some_and(|entry| entry.mps.is_some())
        });
        if runs_daemon {
            self.daemons
                .stop(&claim.uid)
                .await
                .map_err(ClaimFailure::Mps)?;
        }
        let (made, _) = self.ledger.read(|cp| {
            cp.claims
                .get(&claim.uid)
                .map(|entry| entry.partitions.clone())
                .unwrap_or_default()
        });
        let (held, _) = self.ledger.read(|cp| cp.made_gpu_instances());
        for p in &made {
            self.destroy_partition(p, &held)
                .await
                .map_err(|reason| ClaimFailure::Partition {
                    device: p.device.clone(),
                    reason,
                })?;
        }
        if known {
            self.cdi
                .remove(&claim.uid)
                .map_err(|e| ClaimFailure::CdiRemove(e.to_string()))?;
        }
        let version = if known {
            let (_, removed) = self.ledger.change(|state| state.claims.remove(&claim.uid));
            removed
        } else {
            version
        };
        Ok(Staged {
            answer: (),
            version,
            added: false,
        })
    }
}

/// `<namespace>/<name>` of the claim with `uid` in `checkpoint`, else the UID.
pub(super) fn describe(checkpoint: &Checkpoint, uid: &str) -> String {
    checkpoint
        .claims
        .get(uid)
        .map_or_else(|| uid.to_owned(), |e| format!("{}/{}", e.namespace, e.name))
}
