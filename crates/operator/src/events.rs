//! Events the operator's controllers publish about the objects they reconcile.

use kube::runtime::events::{Event, EventType, Recorder};

/// Publishes an Event about `regarding`; a failure is logged, never fatal.
pub async fn publish_event(
    recorder: &Recorder,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    mut note: String,
) {
    // The API rejects notes over 1 KiB; keep the start, which names the object.
    if note.len() > 1000 {
        let cut = (0..=1000)
            .rev()
            .find(|i| note.is_char_boundary(*i))
            .unwrap_or(0);
        note.truncate(cut);
        note.push_str(" ...");
    }
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, regarding).await {
        tracing::warn!(error = %e, "publishing an event failed");
    }
}
