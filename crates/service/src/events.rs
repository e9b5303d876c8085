//! One way for every binary to publish Events: notes cut to what the API accepts, a repeat of the
//! same thing folded into one Event whose series counts it, and a different thing kept apart,
//! failures logged and never fatal.
//!
//! kube's `Recorder` folds every Event of one object, type, reason and action into the first
//! one's series and keeps that first note: a second GPU turning unhealthy on the same node would
//! read as the first one again. [`EventPublisher`] aggregates by note as well (one recorder per
//! note, a bounded number of them), so only the same note on the same object becomes a series.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The longest note the API takes (`events.k8s.io/v1` rejects notes over 1 KiB).
pub const MAX_NOTE_BYTES: usize = 1000;

/// How many distinct notes are remembered for aggregation; past this the memory starts again
/// (repeats then open a new Event instead of counting in the old one's series).
const REMEMBERED_NOTES: usize = 512;

/// Publishes Events as one reporter; cheap to clone (clones share what they remember).
#[derive(Clone)]
pub struct EventPublisher {
    client: kube::Client,
    reporter: Reporter,
    recorders: Arc<Mutex<HashMap<String, Recorder>>>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

/// `note` cut at a character boundary to at most [`MAX_NOTE_BYTES`], marked ` ...` where cut;
/// the start, which names the object, is kept.
pub fn truncate_note(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let cut = (0..=MAX_NOTE_BYTES - 4)
            .rev()
            .find(|i| note.is_char_boundary(*i))
            .unwrap_or(0);
        note.truncate(cut);
        note.push_str(" ...");
    }
    note
}

impl EventPublisher {
    /// A publisher reporting as `reporter`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recorders: Arc::default(),
        }
    }

    /// Publishes `event` about `regarding`: its note truncated, folded into the series of an
    /// earlier Event with the same note, type, reason and action on that object.
    pub async fn try_publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let note = truncate_note(event.note.clone().unwrap_or_default());
        let recorder = self.recorder_for(&note);
        let event = Event {
            type_: event.type_,
            reason: event.reason.clone(),
            note: Some(note),
            action: event.action.clone(),
            secondary: event.secondary.clone(),
        };
        recorder.publish(&event, regarding).await
    }

    /// Like [`Self::try_publish`], but a failure is logged (naming the reason and the object)
    /// rather than returned: an Event is news, never a reason to stop.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) {
        if let Err(error) = self.try_publish(event, regarding).await {
            tracing::warn!(
                %error,
                reason = %event.reason,
                kind = regarding.kind.as_deref().unwrap_or_default(),
                name = regarding.name.as_deref().unwrap_or_default(),
                "publishing an event failed"
            );
        }
    }

    /// Publishes an Event of `type_`, `reason` and `action` saying `note` about `regarding` (see
    /// [`Self::publish`]).
    pub async fn tell(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        self.publish(&event, regarding).await;
    }

    fn recorder_for(&self, note: &str) -> Recorder {
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(recorder) = recorders.get(note) {
            return recorder.clone();
        }
        if recorders.len() >= REMEMBERED_NOTES {
            recorders.clear();
        }
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        recorders.insert(note.to_owned(), recorder.clone());
        recorder
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::{client, reply};
    use http::{Method, StatusCode};

    /// What the API was asked: (method, note, series count).
    type Asked = Arc<Mutex<Vec<(Method, String, Option<i64>)>>>;

    fn publisher() -> (EventPublisher, Asked) {
        let asked: Asked = Arc::default();
        let seen = asked.clone();
        let client = client("default", move |method, _path, body| {
            let event: serde_json::Value = serde_json::from_slice(body).unwrap();
            seen.lock().unwrap().push((
                method.clone(),
                event["note"].as_str().unwrap_or_default().to_owned(),
                event["series"]["count"].as_i64(),
            ));
            reply(StatusCode::OK, &event)
        });
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        (EventPublisher::new(client, reporter), asked)
    }

    fn event(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "GPUUnhealthy".into(),
            note: Some(note.into()),
            action: "Taint".into(),
            secondary: None,
        }
    }

    fn node() -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..ObjectReference::default()
        }
    }

    #[tokio::test]
    async fn the_same_note_counts_in_a_series_and_another_note_is_its_own_event() {
        let (events, asked) = publisher();
        events.publish(&event("GPU 0 is lost"), &node()).await;
        events.publish(&event("GPU 0 is lost"), &node()).await;
        events.publish(&event("GPU 1 is lost"), &node()).await;
        let asked = asked.lock().unwrap().clone();
        assert_eq!(
            asked,
            vec![
                (Method::POST, "GPU 0 is lost".into(), None),
                (Method::PATCH, "GPU 0 is lost".into(), Some(2)),
                (Method::POST, "GPU 1 is lost".into(), None),
            ]
        );
    }

    #[test]
    fn long_notes_are_cut_at_a_character_boundary_and_marked() {
        let short = "fine".to_owned();
        assert_eq!(truncate_note(short.clone()), short);
        let long = "é".repeat(MAX_NOTE_BYTES);
        let cut = truncate_note(long);
        assert!(cut.len() <= MAX_NOTE_BYTES, "{}", cut.len());
        assert!(cut.ends_with("é ..."), "{cut}");
    }
}
