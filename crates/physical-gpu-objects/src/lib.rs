//! `PhysicalGPU` objects: one per GPU of a node, written by the plugin serving that node.
//!
//! [`render`] decides, from what the plugin observes, what each object should say; [`Publisher`]
//! writes the objects that differ from the live ones and deletes those of GPUs the node no longer
//! has. An idle node is never written.

pub mod publisher;
pub mod render;

pub use publisher::{FINAL_WRITE, Publisher, stop_serving};
pub use render::{Observed, Plane, desired};
