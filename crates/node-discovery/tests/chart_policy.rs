//! The chart's admission policy allows the discovery agent exactly the label keys and annotation
//! the agent writes: a key added to one list and not the other would be refused on every node, or
//! allowed to a writer that never uses it.

use api::contract::labels::{DISCOVERY_KEYS, DISCOVERY_OWNED};

const TEMPLATE: &str = include_str!("../../../charts/gpu-operator/templates/node-discovery.yaml");

/// The quoted strings of the template's `$keys := list ...` block, in order.
fn chart_keys() -> Vec<&'static str> {
    let start = TEMPLATE
        .find("$keys := list")
        .expect("the template defines $keys");
    let block = &TEMPLATE[start..];
    let block = &block[..block.find("}}").expect("the $keys block ends")];
    block.split('"').skip(1).step_by(2).collect()
}

#[test]
fn the_policy_allows_exactly_the_agents_label_keys() {
    assert_eq!(chart_keys(), DISCOVERY_KEYS.to_vec());
}

#[test]
fn the_policy_allows_exactly_the_agents_annotation() {
    let declared = format!("$annotation := {DISCOVERY_OWNED:?}");
    assert!(
        TEMPLATE.contains(&declared),
        "the template must declare {declared}"
    );
}
