//! Async locks by key (a claim UID, a GPU UUID), made on first use and forgotten once nobody
//! holds or waits for them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::OwnedMutexGuard;

/// A lock per key.
#[derive(Debug, Default)]
pub struct KeyedLocks {
    locks: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds the lock of one key until dropped.
#[derive(Debug)]
pub struct KeyedGuard<'a> {
    owner: &'a KeyedLocks,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyedLocks {
    /// Waits for, then holds, the lock of `key`.
    pub async fn lock(&self, key: &str) -> KeyedGuard<'_> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(locks.entry(key.to_owned()).or_default())
        };
        KeyedGuard {
            owner: self,
            key: key.to_owned(),
            guard: Some(lock.lock_owned().await),
        }
    }

    /// How many keys have a lock now (held or waited for).
    pub fn len(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no key has a lock now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self
            .owner
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Only the map holds it: nobody waits.
        if locks
            .get(&self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_key_and_nothing_kept_after() {
        let locks = Arc::new(KeyedLocks::default());
        let first = locks.lock("a").await;
        let other = locks.lock("b").await;
        let waiter = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move {
                let _held = locks.lock("a").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a second holder of \"a\" waits");
        drop(first);
        waiter.await.unwrap();
        drop(other);
        assert!(locks.is_empty());
    }
}
