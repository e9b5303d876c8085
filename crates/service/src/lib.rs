//! Plumbing shared by every long-running binary (tracing, metrics, health, shutdown, leader election); built by the service issue.
