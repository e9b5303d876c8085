//! The live operands as the operator's watches keep them: one reflector store per owned kind, so a
//! reconcile compares against memory instead of a GET per object and a LIST per kind. The watch
//! streams that fill the stores are the controller's triggers too.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::MANAGED_SELECTOR;
use super::apply::{OWNED_KINDS, resource};

/// How long a reconcile waits for the first list of every watched kind before it reads the API.
const FIRST_LIST: Duration = Duration::from_secs(30);

/// The stores of the watched operand kinds.
pub(super) struct Operands {
    namespace: String,
    stores: Vec<(&'static str, ApiResource, Store<DynamicObject>)>,
}

/// The writers behind [`Operands`]: the controller's watches feed them (see [`Writers::watch`]);
/// tests feed them by hand.
pub(super) struct Writers(Vec<(&'static str, bool, ApiResource, Writer<DynamicObject>)>);

/// A watch of one operand kind, as the controller takes it.
pub(super) type OperandStream = BoxStream<'static, Result<DynamicObject, watcher::Error>>;

impl Operands {
    /// Empty stores for the owned kinds but ServiceMonitor (its CRD may be absent, so it is read
    /// from the API), and their writers.
    pub(super) fn new(namespace: &str) -> (Operands, Writers) {
        let mut stores = Vec::new();
        let mut writers = Vec::new();
        for (api_version, kind, namespaced) in OWNED_KINDS {
            if kind == "ServiceMonitor" {
                continue;
            }
            let ar = resource(api_version, kind);
            let writer = Writer::new(ar.clone());
            stores.push((kind, ar.clone(), writer.as_reader()));
            writers.push((kind, namespaced, ar, writer));
        }
        let operands = Operands {
            namespace: namespace.to_owned(),
            stores,
        };
        (operands, Writers(writers))
    }

    /// Whether every store has had its first list; waits up to [`FIRST_LIST`] for it.
    pub(super) async fn ready(&self) -> bool {
        let all = futures::future::join_all(
            self.stores
                .iter()
                .map(|(_, _, store)| store.wait_until_ready()),
        );
        matches!(tokio::time::timeout(FIRST_LIST, all).await, Ok(results) if results.iter().all(Result::is_ok))
    }

    fn store(&self, kind: &str) -> Option<&(&'static str, ApiResource, Store<DynamicObject>)> {
        self.stores.iter().find(|(k, _, _)| *k == kind)
    }

    /// The live object of `kind` named `name` (in the operands' namespace when namespaced):
    /// `None` when the kind is not kept here, `Some(None)` when no such object is live.
    pub(super) fn get(&self, kind: &str, name: &str) -> Option<Option<Arc<DynamicObject>>> {
        let (_, ar, store) = self.store(kind)?;
        let key = ObjectRef::new_with(name, ar.clone()).within(&self.namespace);
        Some(store.get(&key))
    }

    /// Every live object of `kind` carrying the managed-by label; `None` when the kind is not kept.
    pub(super) fn all(&self, kind: &str) -> Option<Vec<Arc<DynamicObject>>> {
        self.store(kind).map(|(_, _, store)| store.state())
    }
}

impl Writers {
    /// The watch streams that keep the stores, each with its kind's resource: the operands'
    /// namespace for namespaced kinds, managed-by label only.
    pub(super) fn watch(
        self,
        client: &Client,
        namespace: &str,
    ) -> Vec<(OperandStream, ApiResource)> {
        let config = watcher::Config::default().labels(MANAGED_SELECTOR);
        self.0
            .into_iter()
            .map(|(_, namespaced, ar, writer)| {
                let api: Api<DynamicObject> = if namespaced {
                    Api::namespaced_with(client.clone(), namespace, &ar)
                } else {
                    Api::all_with(client.clone(), &ar)
                };
                let stream = reflector::reflector(writer, watcher(api, config.clone()))
                    .touched_objects()
                    .boxed();
                (stream, ar)
            })
            .collect()
    }

    /// Replaces every store's content with `objects` (by kind), as a fresh list would.
    #[cfg(test)]
    pub(super) fn fill(&mut self, objects: &[DynamicObject]) {
        for (kind, _, _, writer) in &mut self.0 {
            writer.apply_watcher_event(&watcher::Event::Init);
            let of_kind = objects
                .iter()
                .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == *kind));
            for object in of_kind {
                writer.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
        }
    }
}
