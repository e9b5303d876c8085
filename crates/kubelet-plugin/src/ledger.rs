//! The prepared claims in memory, and their group-committed checkpoint.
//!
//! Changes happen in memory, under a lock that is never held across I/O, so claims on different
//! devices do not wait for each other. A change gets a version; [`Ledger::commit`] makes sure the
//! file holds at least that version. Commits that arrive while a write is in flight wait for it and
//! then find their change already written by the next one: one write serves them all (group
//! commit). Nothing is answered to the kubelet before the state it relies on is committed.

use crate::checkpoint::{Checkpoint, CheckpointStore};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A change's place in the order of changes.
pub type Version = u64;

#[derive(Debug)]
struct Current {
    checkpoint: Checkpoint,
    version: Version,
}

/// The claim table and the file it is committed to.
#[derive(Debug)]
pub struct Ledger {
    current: Mutex<Current>,
    /// The version the file holds; held while writing, so writes stay ordered.
    written: tokio::sync::Mutex<Version>,
    store: CheckpointStore,
    writes: AtomicUsize,
    /// The version of the last change, for those who follow the claim table.
    changes: tokio::sync::watch::Sender<Version>,
}

impl Ledger {
    /// A ledger holding `checkpoint`, which `store` already holds.
    pub fn new(checkpoint: Checkpoint, store: CheckpointStore) -> Self {
        Self {
            current: Mutex::new(Current {
                checkpoint,
                version: 0,
            }),
            written: tokio::sync::Mutex::new(0),
            store,
            writes: AtomicUsize::new(0),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Follows changes of the table (in memory, before they are committed).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Version> {
        self.changes.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        // A panic while changing a BTreeMap leaves it valid; the claims must still be served.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the table, and the version read.
    pub fn read<R>(&self, f: impl FnOnce(&Checkpoint) -> R) -> (R, Version) {
        let current = self.lock();
        (f(&current.checkpoint), current.version)
    }

    /// Changes the table in memory, and returns the version to commit.
    pub fn change<R>(&self, f: impl FnOnce(&mut Checkpoint) -> R) -> (R, Version) {
        let mut current = self.lock();
        let result = f(&mut current.checkpoint);
        current.version += 1;
        self.changes.send_replace(current.version);
        (result, current.version)
    }

    /// Makes sure the file holds `version` or later: waits for a write in flight, then writes
    /// the table as it is now unless that write already covered `version`. True when this call
    /// wrote.
    pub async fn commit(&self, version: Version) -> io::Result<bool> {
        let mut written = self.written.lock().await;
        if *written >= version {
            return Ok(false);
        }
        let (snapshot, latest) = {
            let current = self.lock();
            (current.checkpoint.clone(), current.version)
        };
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.save(&snapshot))
            .await
            .map_err(io::Error::other)??;
        self.writes.fetch_add(1, Ordering::Relaxed);
        *written = latest;
        Ok(true)
    }

    /// How many times the file was written since start.
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{ClaimEntry, ClaimState};
    use std::sync::Arc;

    fn entry(name: &str) -> ClaimEntry {
        ClaimEntry {
            state: ClaimState::PrepareCompleted,
            namespace: "ns".into(),
            name: name.into(),
            devices: vec![],
            time_slices: Default::default(),
            mps: None,
            partitions: Vec::new(),
        }
    }

    fn ledger(dir: &std::path::Path) -> (Ledger, CheckpointStore) {
        let store = CheckpointStore::new(dir, "boot-1");
        (
            Ledger::new(Checkpoint::empty("boot-1"), store.clone()),
            store,
        )
    }

    #[tokio::test]
    async fn a_commit_writes_the_table_once_and_only_when_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, store) = ledger(dir.path());
        let ((), v) = ledger.change(|cp| {
            cp.claims.insert("u1".into(), entry("a"));
        });
        ledger.commit(v).await.unwrap();
        ledger.commit(v).await.unwrap();
        assert_eq!(
            ledger.writes(),
            1,
            "a second commit of the same version writes nothing"
        );
        let (on_disk, _) = store.load().unwrap();
        assert_eq!(on_disk.claims.keys().collect::<Vec<_>>(), ["u1"]);
        let (_, read) = ledger.read(|_| ());
        assert!(!ledger.commit(read).await.unwrap());
        assert_eq!(ledger.writes(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn commits_waiting_behind_a_write_share_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, store) = ledger(dir.path());
        let versions: Vec<_> = (0..64)
            .map(|i| {
                let ((), v) = ledger.change(|cp| {
                    cp.claims.insert(format!("u{i}"), entry(&format!("c{i}")));
                });
                v
            })
            .collect();
        let ledger = Arc::new(ledger);
        let tasks: Vec<_> = versions
            .into_iter()
            .map(|v| {
                let ledger = Arc::clone(&ledger);
                tokio::spawn(async move { ledger.commit(v).await.unwrap() })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let (on_disk, _) = store.load().unwrap();
        assert_eq!(
            on_disk.claims.len(),
            64,
            "every committed change is on disk"
        );
        assert_eq!(ledger.writes(), 1, "64 commits, one write");
    }
}
