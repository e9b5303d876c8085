//! What the operator's controllers say in the Events they publish (through
//! [`service::events::EventPublisher`]) about the objects they reconcile.

/// The action of every Event about a reconciled object.
pub const RECONCILE: &str = "Reconcile";
