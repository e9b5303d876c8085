//! Whether a GPU node gets GPUs from either plane, read off its labels, so the labeler's Events and
//! the operator's `GPUCluster` condition say the same thing.

use std::collections::BTreeMap;

use crate::AllocationMode;
use crate::contract::labels as l;

/// Why no plane serves a GPU node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoPlane {
    /// Why, with the fix.
    pub why: String,
    /// An admin asked for it (opt-out, operands off, a control-plane node); otherwise a label
    /// names what cannot be served.
    pub by_choice: bool,
}

/// Why no plane serves the GPU node with `labels`, or `None` when one does (or the node labeler has
/// not decided yet). `device_plugin_served`: our `spec.devicePlugin` or a `ClusterPolicy` serves that plane.
pub fn unserved(labels: &BTreeMap<String, String>, device_plugin_served: bool) -> Option<NoPlane> {
    let label = |key: &str| labels.get(key).map(String::as_str);
    if label(l::ENABLED) == Some("false") {
        return Some(NoPlane {
            why: format!(
                "opted out by {}=false (remove the label to serve it)",
                l::ENABLED
            ),
            by_choice: true,
        });
    }
    if label(l::DEPLOY_OPERANDS) == Some("false") {
        return Some(NoPlane {
            why: format!(
                "operands switched off by {}=false (remove the label to serve it)",
                l::DEPLOY_OPERANDS
            ),
            by_choice: true,
        });
    }
    match label(l::ALLOCATION_MODE).filter(|v| !v.is_empty()) {
        None if labels.contains_key(l::CONTROL_PLANE_ROLE) => Some(NoPlane {
            why: "a control-plane node, which no plane serves unless a spec.planePolicy rule \
                  selects it"
                .into(),
            by_choice: true,
        }),
        None => None,
        Some(v) => match v.parse::<AllocationMode>() {
            Ok(AllocationMode::DevicePlugin) if !device_plugin_served => Some(NoPlane {
                why: format!(
                    "its {} label says device-plugin, but nothing serves that plane: set \
                     spec.devicePlugin.enabled=true, or move the node to dra",
                    l::ALLOCATION_MODE
                ),
                by_choice: false,
            }),
            Ok(_) => None,
            Err(_) => Some(NoPlane {
                why: format!(
                    "its {} label {v:?} is not a mode: use dra or device-plugin",
                    l::ALLOCATION_MODE
                ),
                by_choice: false,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn each_reason_no_plane_serves_a_node_names_its_fix() {
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, Option<&'a str>);
        let cases: [Case; 8] = [
            (&[(l::ALLOCATION_MODE, "dra")], false, None),
            (&[(l::ALLOCATION_MODE, "device-plugin")], true, None),
            // The labeler has not decided yet: the Ready condition waits for it instead.
            (&[], false, None),
            (
                &[(l::ENABLED, "false")],
                true,
                Some("opted out by gpu-operator-rs.dev/enabled=false"),
            ),
            (
                &[(l::DEPLOY_OPERANDS, "false"), (l::ALLOCATION_MODE, "dra")],
                true,
                Some("operands switched off by nvidia.com/gpu.deploy.operands=false"),
            ),
            (
                &[(l::CONTROL_PLANE_ROLE, "")],
                true,
                Some("a control-plane node"),
            ),
            (
                &[(l::ALLOCATION_MODE, "device-plugin")],
                false,
                Some("set spec.devicePlugin.enabled=true"),
            ),
            (
                &[(l::ALLOCATION_MODE, "gpu")],
                true,
                Some("\"gpu\" is not a mode"),
            ),
        ];
        for (pairs, device_plugin_served, want) in cases {
            let got = unserved(&labels(pairs), device_plugin_served).map(|n| n.why);
            match want {
                None => assert_eq!(got, None, "{pairs:?}"),
                Some(part) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(part)),
                    "{pairs:?}: {got:?}"
                ),
            }
        }
    }
}
