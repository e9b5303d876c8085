//! The node labeler: which GPU stack serves each node, expressed as node labels.

pub mod claims;
pub mod controller;
pub mod driver_upgrade;
pub mod events;
pub mod handover;
pub mod names;
pub mod offers;
pub mod plan;
