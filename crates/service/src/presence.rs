//! Whether any object of a kind that may not be served exists, kept current by a watch: the answer
//! follows a CRD that is installed, removed or installed again while the binary runs.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

/// The names of the live objects of one kind, from a watcher's events.
#[derive(Debug, Default)]
pub struct Names {
    live: BTreeSet<String>,
    /// The names of a list in progress; they replace `live` when it completes.
    listing: Option<BTreeSet<String>>,
    known: bool,
}

impl Names {
    /// Takes one watch event; returns whether objects exist once the view is complete.
    pub fn apply(&mut self, event: Event<String>) -> Option<bool> {
        match event {
            Event::Init => self.listing = Some(BTreeSet::new()),
            Event::InitApply(name) => {
                self.listing.get_or_insert_with(BTreeSet::new).insert(name);
            }
            Event::InitDone => {
                self.live = self.listing.take().unwrap_or_default();
                self.known = true;
            }
            Event::Apply(name) => {
                self.live.insert(name);
            }
            Event::Delete(name) => {
                self.live.remove(&name);
            }
        }
        self.answer()
    }

    /// The kind is not served (its CRD is absent): no object of it can exist.
    pub fn not_served(&mut self) -> Option<bool> {
        self.live.clear();
        self.listing = None;
        self.known = true;
        self.answer()
    }

    fn answer(&self) -> Option<bool> {
        self.known.then_some(!self.live.is_empty())
    }
}

/// Whether a watcher error says the kind is not served (404 on list or watch).
pub fn is_not_served(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => not_found(status),
        watcher::Error::WatchError(status) => not_found(status),
        _ => false,
    }
}

fn not_found(status: &kube::core::Status) -> bool {
    // A 404 body that is not a Status (a plain-text "page not found") has no reason.
    status.code == 404 || status.is_not_found()
}

/// Retries a failed watch after 0.5 s, doubling to at most 10 s, so a CRD installed later is
/// noticed within seconds.
#[derive(Debug, Clone)]
struct Retry(Duration);

const FIRST_RETRY: Duration = Duration::from_millis(500);
const LAST_RETRY: Duration = Duration::from_secs(10);

impl Iterator for Retry {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.0;
        self.0 = (self.0 * 2).min(LAST_RETRY);
        Some(now)
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.0 = FIRST_RETRY;
    }
}

/// Follows whether at least one object of `resource` (cluster-wide) exists. The receiver holds
/// `None` until the first complete answer and changes only when the answer does; a kind the
/// apiserver does not serve counts as none. The future runs the watch; spawn it.
pub fn follow(
    client: kube::Client,
    resource: ApiResource,
) -> (
    watch::Receiver<Option<bool>>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(None);
    let kind = resource.kind.clone();
    let api = Api::<PartialObjectMeta<DynamicObject>>::all_with(client, &resource);
    let task = async move {
        let mut names = Names::default();
        let events = watcher::watcher(api, watcher::Config::default())
            .backoff(Retry(FIRST_RETRY))
            .boxed();
        events
            .for_each(|event| {
                let answer = match event {
                    Ok(event) => names.apply(names_of(event)),
                    Err(e) if is_not_served(&e) => names.not_served(),
                    Err(e) => {
                        tracing::warn!(%kind, error = %e, "watching failed; retrying (may the service account list and watch it?)");
                        None
                    }
                };
                if let Some(present) = answer {
                    tx.send_if_modified(|old| {
                        let changed = *old != Some(present);
                        if changed {
                            tracing::info!(%kind, present, "presence changed");
                        }
                        *old = Some(present);
                        changed
                    });
                }
                futures::future::ready(())
            })
            .await;
    };
    (rx, task)
}

fn names_of<K: ResourceExt>(event: Event<K>) -> Event<String> {
    match event {
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(o.name_any()),
        Event::InitDone => Event::InitDone,
        Event::Apply(o) => Event::Apply(o.name_any()),
        Event::Delete(o) => Event::Delete(o.name_any()),
    }
}

/// Waits until `rx` holds an answer and returns it (false if the sender is gone first).
pub async fn first_answer(rx: &mut watch::Receiver<Option<bool>>) -> bool {
    match rx.wait_for(Option::is_some).await {
        Ok(answer) => answer.unwrap_or(false),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, name: &str) -> Event<String> {
        match kind {
            "init" => Event::Init,
            "init-apply" => Event::InitApply(name.into()),
            "init-done" => Event::InitDone,
            "apply" => Event::Apply(name.into()),
            _ => Event::Delete(name.into()),
        }
    }

    #[test]
    fn no_answer_until_the_first_list_completes() {
        let mut names = Names::default();
        assert_eq!(names.apply(ev("init", "")), None);
        assert_eq!(names.apply(ev("init-apply", "cluster-policy")), None);
        assert_eq!(names.apply(ev("init-done", "")), Some(true));
    }

    #[test]
    fn the_answer_follows_creates_deletes_and_relists() {
        let mut names = Names::default();
        names.apply(ev("init", ""));
        assert_eq!(names.apply(ev("init-done", "")), Some(false));
        assert_eq!(names.apply(ev("apply", "a")), Some(true));
        assert_eq!(names.apply(ev("apply", "b")), Some(true));
        assert_eq!(names.apply(ev("delete", "a")), Some(true));
        assert_eq!(names.apply(ev("delete", "b")), Some(false));
        names.apply(ev("apply", "c"));
        // A relist that no longer has `c` (deleted while the watch was down) forgets it.
        names.apply(ev("init", ""));
        assert_eq!(names.apply(ev("init-done", "")), Some(false));
    }

    #[test]
    fn an_unserved_kind_has_no_objects_even_after_some_were_seen() {
        let mut names = Names::default();
        assert_eq!(names.not_served(), Some(false));
        names.apply(ev("apply", "a"));
        assert_eq!(names.not_served(), Some(false));
    }

    #[test]
    fn only_a_404_means_not_served() {
        let status = |code: u16| {
            Box::new(kube::core::Status {
                code,
                ..Default::default()
            })
        };
        assert!(is_not_served(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(404))
        )));
        assert!(!is_not_served(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(403))
        )));
        assert!(is_not_served(&watcher::Error::WatchError(status(404))));
    }

    #[test]
    fn retries_double_to_a_cap_and_reset() {
        let mut retry = Retry(FIRST_RETRY);
        let waits: Vec<_> = retry.by_ref().take(7).collect();
        assert_eq!(waits[0], FIRST_RETRY);
        assert_eq!(waits[6], LAST_RETRY);
        retry.reset();
        assert_eq!(retry.next(), Some(FIRST_RETRY));
    }
}
