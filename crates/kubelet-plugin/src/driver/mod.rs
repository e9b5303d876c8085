//! Prepare and unprepare: the claim checks of [`crate::claim`], the claim table of
//! [`crate::ledger`] and the CDI specs, put together.
//!
//! Claims are handled concurrently and take no lock across I/O: the claim GETs of one call run
//! at once, a claim reserves its devices in memory (so a device can never be held by two
//! exclusive claims), writes its CDI spec, and is marked prepared in memory. Then the call
//! commits the table once, whatever its number of claims, and concurrent calls share commits.
//!
//! A claim's only side effect is its CDI spec, and a spec can be found again in the CDI folder,
//! so the checkpoint records a claim once, when it is prepared. A crash before that leaves at
//! most a spec of a claim the checkpoint does not know; [`Driver::start`] removes it. An entry
//! still `PrepareStarted` (written by an older version, or by a concurrent call's commit) is
//! rolled back the same way. A side effect that cannot be found again needs its own commit
//! before it is made: a claim asking for a time-slice interval is committed `PrepareStarted`
//! with the GPUs it will change, then the intervals are set ([`crate::time_slice`]); a crash
//! between the two leaves an entry [`Driver::start`] rolls back, and the app puts those GPUs
//! back to what the remaining claims want ([`Driver::settle_time_slices`]).

use crate::cdi::CdiWriter;
use crate::checkpoint::{CheckpointStore, ClaimState, LoadOutcome};
use crate::devices::DeviceTable;
use crate::ledger::{Ledger, Version};
use crate::metrics::Metrics;
use crate::mps::MpsDaemons;
use crate::partitioner::Partitioner;
use crate::time_slice::TimeSlicer;
use crate::types::Operation;
use crate::types::{ClaimRef, DraBackend, PrepareResults, UnprepareResults};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Instant;

mod failure;
#[cfg(test)]
mod partition_tests;
mod source;
mod stage;
#[cfg(test)]
mod tests;

pub use failure::ClaimFailure;
pub use source::{ClaimSource, KubeClaims};

/// What [`Driver::start`] found and fixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartReport {
    /// What loading the checkpoint found.
    pub outcome: LoadOutcome,
    /// Claims left in `PrepareStarted` by a crash, rolled back (CDI spec removed).
    pub rolled_back: Vec<ClaimRef>,
    /// UIDs of claims whose CDI spec a crash left before the checkpoint recorded them; removed.
    pub stray_specs: Vec<String>,
    /// Claims restored as prepared.
    pub restored: usize,
    /// GPUs whose time-slice interval a rolled-back claim may have changed: to settle.
    pub unsettled_time_slices: BTreeSet<String>,
    /// MIG partitions a rolled-back claim may have made, in part: to destroy
    /// ([`Driver::clear_partitions`]).
    pub unmade_partitions: Vec<crate::checkpoint::MadePartition>,
}

/// A claim's answer, staged in memory until the call's commit.
struct Staged<T> {
    answer: T,
    /// The table version the answer relies on.
    version: Version,
    /// Whether this call added the claim (and must take it back if the commit fails).
    added: bool,
}

/// The prepare/unprepare backend.
#[derive(Debug)]
pub struct Driver<C> {
    driver_name: String,
    pool: String,
    claims: C,
    table: DeviceTable,
    cdi: CdiWriter,
    ledger: Ledger,
    metrics: Option<Metrics>,
    /// Where the devices prepared claims hold are told (the publisher keeps their shares).
    held: Option<tokio::sync::watch::Sender<std::collections::BTreeSet<String>>>,
    /// Sets the GPUs' time-slice intervals.
    slicer: Arc<dyn TimeSlicer>,
    /// Runs the claims' MPS control daemons.
    daemons: Arc<dyn MpsDaemons>,
    /// Makes and destroys MIG partitions (dynamic MIG).
    partitioner: Arc<dyn Partitioner>,
    /// One lock per GPU (by UUID) taken while its MIG mode may change: turning MIG on and making a
    /// GPU instance, destroying one and turning MIG off when it was the last, never interleave.
    mig_locks: crate::keyed_locks::KeyedLocks,
    /// One lock per claim (by UID) held while it is staged: the kubelet prepares a claim two pods
    /// share for each pod, at once, and a partition must be made once.
    claim_locks: crate::keyed_locks::KeyedLocks,
}

impl<C: ClaimSource> Driver<C> {
    /// Loads the checkpoint, rolls back what a crash left half-prepared, and returns the driver
    /// for `pool` (the node name) with what it found.
    pub fn start(
        driver_name: &str,
        pool: &str,
        claims: C,
        table: DeviceTable,
        cdi: CdiWriter,
        store: CheckpointStore,
    ) -> io::Result<(Self, StartReport)> {
        let (mut checkpoint, outcome) = store.load()?;
        let mut rolled_back = Vec::new();
        let mut unsettled_time_slices = BTreeSet::new();
        let mut unmade_partitions = Vec::new();
        for (uid, entry) in checkpoint.take_started() {
            cdi.remove(&uid)?;
            unsettled_time_slices.extend(entry.time_slices.into_keys());
            unmade_partitions.extend(entry.partitions);
            rolled_back.push(ClaimRef {
                namespace: entry.namespace,
                uid,
                name: entry.name,
            });
        }
        let mut stray_specs = Vec::new();
        for uid in cdi.claim_uids()? {
            if !checkpoint.claims.contains_key(&uid) {
                cdi.remove(&uid)?;
                stray_specs.push(uid);
            }
        }
        if outcome != LoadOutcome::Restored || !rolled_back.is_empty() {
            store.save(&checkpoint)?;
        }
        let report = StartReport {
            outcome,
            rolled_back,
            stray_specs,
            restored: checkpoint.claims.len(),
            unsettled_time_slices,
            unmade_partitions,
        };
        let driver = Self {
            driver_name: driver_name.to_owned(),
            pool: pool.to_owned(),
            claims,
            table,
            cdi,
            ledger: Ledger::new(checkpoint, store),
            metrics: None,
            held: None,
            slicer: Arc::new(crate::time_slice::Unavailable),
            daemons: Arc::new(crate::mps::Unavailable(
                "this plugin was started without a way to run MPS control daemons".into(),
            )),
            partitioner: Arc::new(crate::partitioner::Unavailable(
                "this plugin was started without a way to make MIG partitions".into(),
            )),
            mig_locks: Default::default(),
            claim_locks: Default::default(),
        };
        Ok((driver, report))
    }

    /// Sets time-slice intervals with `slicer` (claims asking for one are refused otherwise).
    pub fn with_time_slicer(mut self, slicer: Arc<dyn TimeSlicer>) -> Self {
        self.slicer = slicer;
        self
    }

    /// Runs the MPS control daemons of claims that ask for one with `daemons` (such claims are
    /// refused otherwise).
    pub fn with_mps_daemons(mut self, daemons: Arc<dyn MpsDaemons>) -> Self {
        self.daemons = daemons;
        self
    }

    /// Serves `table` from now on (dynamic MIG builds it from what the checkpoint says the plugin
    /// made, so after [`Driver::start`]).
    pub fn with_table(mut self, table: DeviceTable) -> Self {
        self.table = table;
        self
    }

    /// The GPU instances the plugin made for the claims it holds, by GPU UUID.
    pub fn made_gpu_instances(&self) -> BTreeMap<String, BTreeSet<u32>> {
        self.ledger.read(|cp| cp.made_gpu_instances()).0
    }

    /// Makes and destroys MIG partitions with `partitioner` (claims given one fail otherwise).
    pub fn with_partitioner(mut self, partitioner: Arc<dyn Partitioner>) -> Self {
        self.partitioner = partitioner;
        self
    }

    /// Destroys what a crash left of `partitions` (from [`StartReport::unmade_partitions`]): the
    /// GPU instance recorded, or the one of the profile at the placement when the crash came
    /// before its id was recorded, unless a prepared claim holds it. Answers the partitions that
    /// could not be destroyed, with why.
    pub async fn clear_partitions(
        &self,
        partitions: &[crate::checkpoint::MadePartition],
    ) -> Vec<(String, String)> {
        let (held, _) = self.ledger.read(|cp| cp.made_gpu_instances());
        let mut failed = Vec::new();
        for p in partitions {
            if let Err(reason) = self.destroy_partition(p, &held).await {
                failed.push((p.device.clone(), reason));
            }
        }
        failed
    }

    /// Stops the MPS control daemons (and removes the directories) of claims that are not
    /// prepared: what a crash left between committing a claim and forgetting it. Answers the
    /// claim UIDs whose daemon could not be stopped, with why.
    pub async fn sweep_mps_daemons(&self) -> Vec<(String, String)> {
        let present = match self.daemons.present().await {
            Ok(present) => present,
            Err(e) => return vec![(String::new(), e)],
        };
        let mut failed = Vec::new();
        for uid in present {
            let (kept, _) = self.ledger.read(|cp| {
                cp.claims
                    .get(&uid)
                    .is_some_and(|e| e.state == ClaimState::PrepareCompleted && e.mps.is_some())
            });
            if kept {
                continue;
            }
            tracing::info!(claim = %uid, "stopping the MPS control daemon of a claim that is not prepared");
            if let Err(e) = self.daemons.stop(&uid).await {
                failed.push((uid, e));
            }
        }
        failed
    }

    /// Puts each of `gpus` back to the interval the prepared claims want (the driver's default
    /// when none sets one); answers the GPUs that failed, with why.
    pub async fn settle_time_slices(&self, gpus: &BTreeSet<String>) -> Vec<(String, String)> {
        let mut failed = Vec::new();
        for gpu in gpus {
            let (wanted, _) = self.ledger.read(|cp| cp.wanted_time_slice(gpu, ""));
            if let Err(e) = self.slicer.set(gpu, wanted).await {
                failed.push((gpu.clone(), e));
            }
        }
        failed
    }

    /// Records metrics from now on.
    /// Records metrics from now on, starting from the claims the checkpoint holds.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self.report_prepared();
        self
    }

    /// Tells `held` the names of the devices prepared claims hold, now and after every change.
    pub fn with_held_devices(
        mut self,
        held: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
    ) -> Self {
        self.held = Some(held);
        self.report_prepared();
        self
    }

    /// Sets the prepared-device gauges and the held devices from the checkpoint.
    fn report_prepared(&self) {
        if self.held.is_none() && self.metrics.is_none() {
            return;
        }
        // One read of the checkpoint: every claim's devices, and those of completed claims.
        let ((all, held, completed), _) = self.ledger.read(|cp| {
            let mut all = 0;
            let mut held = std::collections::BTreeSet::new();
            let mut completed = Vec::new();
            for entry in cp.claims.values() {
                all += entry.devices.len();
                for device in &entry.devices {
                    held.insert(device.device.clone());
                    if entry.state == ClaimState::PrepareCompleted {
                        completed.push(device.device.clone());
                    }
                }
            }
            (all, held, completed)
        });
        if let Some(m) = &self.metrics {
            m.set_prepared_devices(all, completed.iter().map(String::as_str));
        }
        if let Some(tx) = &self.held {
            tx.send_if_modified(|old| {
                let changed = *old != held;
                *old = held;
                changed
            });
        }
    }

    /// The node's devices.
    pub fn devices(&self) -> &DeviceTable {
        &self.table
    }

    /// How many times the checkpoint was written since start.
    pub fn checkpoint_writes(&self) -> usize {
        self.ledger.writes()
    }

    /// Follows changes of the prepared claims.
    pub fn claim_changes(&self) -> tokio::sync::watch::Receiver<Version> {
        self.ledger.subscribe()
    }

    /// The prepared claims of each physical GPU (by UUID), as `<namespace>/<name>`, those holding
    /// shares of it included. Claims with admin access (monitoring, such as the DCGM exporter's) only watch a GPU and are left out.
    pub fn consumers(&self) -> BTreeMap<String, Vec<String>> {
        let (consumers, _) = self.ledger.read(|checkpoint| {
            let mut by_gpu: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for entry in checkpoint.claims.values() {
                if entry.state != ClaimState::PrepareCompleted {
                    continue;
                }
                for device in entry.devices.iter().filter(|d| !d.admin_access) {
                    let card = crate::devices::card_of(&device.device);
                    if let Some(d) = self.table.devices.get(card) {
                        let claims = by_gpu.entry(d.gpu.gpu_uuid.clone()).or_default();
                        let claim = format!("{}/{}", entry.namespace, entry.name);
                        if !claims.contains(&claim) {
                            claims.push(claim);
                        }
                    }
                }
            }
            by_gpu
        });
        consumers
    }

    /// The UIDs of the prepared claims.
    pub fn prepared_claims(&self) -> Vec<String> {
        let (uids, _) = self.ledger.read(|cp| {
            cp.claims
                .iter()
                .filter(|(_, e)| e.state == ClaimState::PrepareCompleted)
                .map(|(uid, _)| uid.clone())
                .collect()
        });
        uids
    }
}

impl<C: ClaimSource> Driver<C> {
    /// Stages every claim concurrently, commits the table once, and answers each claim, with
    /// metrics, a log line per failure and the claim named in every error.
    async fn each_claim<'a, T, F, Fut>(
        &'a self,
        operation: Operation,
        claims: &'a [ClaimRef],
        stage: F,
    ) -> std::collections::BTreeMap<String, Result<T, String>>
    where
        F: Fn(&'a Self, &'a ClaimRef) -> Fut,
        Fut: Future<Output = Result<Staged<T>, ClaimFailure>> + 'a,
    {
        let started = Instant::now();
        let _in_flight = self
            .metrics
            .as_ref()
            .map(|m| m.in_flight(operation, claims.len()));
        let staged = futures::future::join_all(claims.iter().map(|c| stage(self, c))).await;
        let version = staged.iter().flatten().map(|s| s.version).max();
        let committed = match version {
            Some(version) => self.ledger.commit(version).await,
            None => Ok(false),
        };
        if let (Ok(true), Some(m)) = (&committed, &self.metrics) {
            m.count_checkpoint_write();
        }
        if committed.is_err() {
            for (claim, staged) in claims.iter().zip(&staged) {
                if staged.as_ref().is_ok_and(|s| s.added) {
                    self.abandon(claim).await;
                }
            }
        } else {
            self.report_prepared();
        }
        claims
            .iter()
            .zip(staged)
            .map(|(c, staged)| {
                let result = match (&committed, staged) {
                    (Ok(_), Ok(staged)) => Ok(staged.answer),
                    (Err(e), Ok(_)) => Err(ClaimFailure::Checkpoint(e.to_string())),
                    (_, Err(e)) => Err(e),
                };
                if let Some(m) = &self.metrics {
                    let failure = result.as_ref().err().map(ClaimFailure::reason);
                    m.observe(operation, failure, started.elapsed());
                }
                if let Err(e) = &result {
                    tracing::warn!(claim = %c, error = %e, ?operation, "claim failed");
                }
                (c.uid.clone(), result.map_err(|e| format!("claim {c}: {e}")))
            })
            .collect()
    }
}

impl<C: ClaimSource> DraBackend for Driver<C> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.each_claim(Operation::Prepare, &claims, |d, c| d.stage_prepare(c))
            .await
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        self.each_claim(Operation::Unprepare, &claims, |d, c| d.stage_unprepare(c))
            .await
    }
}
