//! The labeler's decision: from what a node carries and what the cluster has, the label and
//! annotation changes that node needs. Pure; the controller does the I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use api::AllocationMode;
use api::contract::labels as l;
use api::gpucluster::PlaneRule;
use kube::core::{Selector, SelectorExt};

/// How often a node whose plugin label's removal is deferred (a pod still holds one of its
/// GPUs) is looked at again.
pub const DEFERRED_RECHECK: Duration = Duration::from_secs(30);

/// A plane-policy rule, ready to match nodes.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Its name in the GPUCluster.
    pub name: String,
    selector: Selector,
    names_control_plane: bool,
    /// The mode it gives.
    pub mode: AllocationMode,
}

impl Rule {
    /// The rule of a GPUCluster's `spec.planePolicy.rules`; an error names it when its selector
    /// cannot be used (the CRD refuses such selectors, so this means an older CRD).
    pub fn new(rule: &PlaneRule) -> Result<Self, String> {
        let selector = Selector::try_from(rule.node_selector.to_label_selector())
            .map_err(|e| format!("planePolicy rule {}: {e}", rule.name))?;
        let names_control_plane = rule
            .node_selector
            .keys()
            .any(|k| k == l::CONTROL_PLANE_ROLE);
        Ok(Self {
            name: rule.name.clone(),
            selector,
            names_control_plane,
            mode: rule.mode,
        })
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        (self.names_control_plane || !is_control_plane(labels)) && self.selector.matches(labels)
    }
}

fn is_control_plane(labels: &BTreeMap<String, String>) -> bool {
    labels.contains_key(l::CONTROL_PLANE_ROLE)
}

/// Cluster-wide facts the decision depends on.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// A `GPUCluster` (the DRA plane's CR) exists.
    pub gpu_cluster: bool,
    /// A `ClusterPolicy` (the device-plugin plane's CR) exists.
    pub cluster_policy: bool,
    /// The `GPUCluster` serves the device-plugin plane too (`spec.devicePlugin.enabled`).
    pub gpu_cluster_device_plugin: bool,
    /// Mode for new GPU nodes when both planes are served (`DEFAULT_GPU_ALLOCATION_MODE`).
    pub default_mode: AllocationMode,
    /// The active driver upgrade policy lets the driver manager upgrade drivers automatically.
    pub driver_auto_upgrade: bool,
    /// The GPUCluster's plane-policy rules, in order.
    pub rules: Vec<Rule>,
}

impl Cluster {
    /// Whether a CR of either plane exists, so GPU nodes are expected to be served.
    pub fn any_plane_served(&self) -> bool {
        self.mode_for_new_nodes().is_some()
    }

    /// The mode a GPU node without one gets: the only plane served, or the default when both are
    /// (by one CR or two).
    fn mode_for_new_nodes(&self) -> Option<AllocationMode> {
        match (
            self.serves(AllocationMode::Dra),
            self.serves(AllocationMode::DevicePlugin),
        ) {
            (true, false) => Some(AllocationMode::Dra),
            (false, true) => Some(AllocationMode::DevicePlugin),
            (true, true) => Some(self.default_mode),
            (false, false) => None,
        }
    }

    /// Whether a CR serves `mode` on the nodes in it.
    pub fn serves(&self, mode: AllocationMode) -> bool {
        match mode {
            AllocationMode::Dra => self.gpu_cluster,
            AllocationMode::DevicePlugin => {
                self.cluster_policy || (self.gpu_cluster && self.gpu_cluster_device_plugin)
            }
        }
    }
}

/// Whether pods on the node still hold GPUs of the plane the node is leaving: claims allocated by
/// the `gpu.nvidia.com` driver (leaving `dra`), or resources the device plugin gave (leaving
/// `device-plugin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuClaims {
    /// Not looked up yet; the plan says when a lookup is needed.
    Unknown,
    /// No pod on the node holds one.
    None,
    /// Some pod (running, pending or terminating) holds one, or what it holds could not be read.
    Held,
}

/// Planes whose validator passed on the node (its pod is Ready).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadyPlanes {
    /// The DRA plane's validator (`nvidia-dra-validator`).
    pub dra: bool,
    /// The device-plugin plane's validator (`nvidia-operator-validator`).
    pub device_plugin: bool,
}

impl ReadyPlanes {
    /// Whether `mode`'s validator passed.
    pub fn has(self, mode: AllocationMode) -> bool {
        match mode {
            AllocationMode::Dra => self.dra,
            AllocationMode::DevicePlugin => self.device_plugin,
        }
    }
}

/// What is known about one node beyond its labels and annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// What pods hold of the plane the node may be leaving.
    pub claims: GpuClaims,
    /// Planes ready on the node.
    pub ready: ReadyPlanes,
    /// A rolled-back hand-over keeps the node on this plane, whatever the policy says.
    pub pinned: Option<AllocationMode>,
    /// How a hand-over holds the old plane; while it does, no deferral is reported (the
    /// hand-over reports its own steps).
    pub hold: Hold,
}

/// How a hand-over holds the old plane on the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hold {
    /// No hand-over holds it: what pods hold decides, as a deferral.
    #[default]
    No,
    /// Queued: the old plane stays whole and none of the new plane's keys come.
    WholePlane,
    /// Draining: the old plane's plugin stays, its other operands leave (with their own GPU
    /// claims), none of the new plane's keys come.
    Plugin,
}

impl NodeFacts {
    /// Only what pods hold is known.
    pub fn claims(claims: GpuClaims) -> Self {
        Self {
            claims,
            ready: ReadyPlanes::default(),
            pinned: None,
            hold: Hold::No,
        }
    }
}

/// Something worth telling an admin about the node, as an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The mode label holds a value that is not a mode; the node's deploy labels are left alone.
    InvalidMode(String),
    /// `gpu.deploy.dra-driver` stays until the node's GPU claims are released.
    DraDriverRemovalDeferred,
    /// `gpu.deploy.device-plugin` stays until no pod on the node holds a GPU it gave.
    DevicePluginRemovalDeferred,
    /// A plane-policy rule set the node's mode.
    ModeChosenByRule {
        /// The rule.
        rule: String,
        /// The mode it set.
        mode: AllocationMode,
    },
}

/// The changes one node needs. Empty means no write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Label changes: `Some(value)` sets, `None` removes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes: `Some(value)` sets, `None` removes.
    pub annotations: BTreeMap<String, Option<String>>,
    /// Events to report.
    pub findings: Vec<Finding>,
    /// The plan wants to remove a plane's plugin label (`gpu.deploy.dra-driver` or
    /// `gpu.deploy.device-plugin`) but what pods hold of that plane was not looked up: look it up
    /// and plan again.
    pub needs_claim_lookup: Option<AllocationMode>,
    /// The node carries one plane's plugin and its mode asks for the other, served one:
    /// `(from, to)`. The hand-over decides when the labels may move.
    pub switch: Option<(AllocationMode, AllocationMode)>,
}

impl Plan {
    /// The node's labels once the plan is written.
    pub fn labels_after(&self, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut after = labels.clone();
        for (key, want) in &self.labels {
            match want {
                Some(v) => after.insert(key.clone(), v.clone()),
                None => after.remove(key),
            };
        }
        after
    }

    /// Whether the node needs a write.
    pub fn has_changes(&self) -> bool {
        !self.labels.is_empty() || !self.annotations.is_empty()
    }

    /// Whether the node must be looked at again later even without a change event.
    pub fn is_deferred(&self) -> bool {
        self.findings.iter().any(|f| {
            matches!(
                f,
                Finding::DraDriverRemovalDeferred | Finding::DevicePluginRemovalDeferred
            )
        })
    }
}

/// A label value that counts as set (`""` counts as absent).
fn value<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    labels
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Whether NFD says the node has an NVIDIA GPU.
pub fn is_gpu_node(labels: &BTreeMap<String, String>) -> bool {
    l::NFD_GPU_LABELS
        .iter()
        .any(|k| value(labels, k) == Some("true"))
}

/// Whether the node's GPUs can do MIG: what discovery found (`nvidia.com/mig.capable`), else by
/// product name; never on a vGPU host.
fn is_mig_capable(labels: &BTreeMap<String, String>) -> bool {
    if labels.contains_key(l::VGPU_HOST_DRIVER_VERSION) {
        return false;
    }
    match value(labels, l::MIG_CAPABLE) {
        Some(found) => found == "true",
        None => mig_capable_by_name(value(labels, l::GPU_PRODUCT).unwrap_or_default()),
    }
}

/// The MIG-capable data-center GPUs, as words of their product names (`NVIDIA-H100-80GB-HBM3`):
/// the fallback for a node whose discovery did not say (`nvidia.com/mig.capable` absent).
const MIG_CAPABLE_MODELS: &[&str] = &[
    "a30", "a30x", "a100", "a100x", "a800", "h100", "h800", "h20", "h200", "gh200", "b100", "b200",
    "gb200", "b300", "gb300",
];

/// Whether `product` names a MIG-capable GPU: one of its words is a model of
/// [`MIG_CAPABLE_MODELS`] (whole words, so `RTX A3000` is not an `A30`), or it is an RTX PRO 6000
/// Blackwell.
fn mig_capable_by_name(product: &str) -> bool {
    let product = product.to_lowercase();
    let words: Vec<&str> = product
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |word: &str| words.contains(&word);
    words.iter().any(|w| MIG_CAPABLE_MODELS.contains(w))
        || (has("rtx") && has("pro") && has("6000") && has("blackwell"))
}

/// Whether `key` is one of `mode`'s deploy keys (MIG manager included).
fn in_plane(mode: AllocationMode, key: &str) -> bool {
    match mode {
        AllocationMode::Dra => l::DRA_PLANE_KEYS.contains(&key),
        AllocationMode::DevicePlugin => {
            l::DEVICE_PLUGIN_PLANE_KEYS.contains(&key) || key == l::DEPLOY_MIG_MANAGER
        }
    }
}

/// Every deploy key the labeler owns.
fn owned_keys() -> impl Iterator<Item = &'static str> {
    l::DRA_PLANE_KEYS
        .into_iter()
        .chain(l::DEVICE_PLUGIN_ONLY_KEYS)
}

/// Deploy keys a node in `mode` should carry.
fn plane_keys(mode: AllocationMode, labels: &BTreeMap<String, String>) -> Vec<&'static str> {
    match mode {
        AllocationMode::Dra => l::DRA_PLANE_KEYS.to_vec(),
        AllocationMode::DevicePlugin => {
            let mut keys = l::DEVICE_PLUGIN_PLANE_KEYS.to_vec();
            if is_mig_capable(labels) {
                keys.push(l::DEPLOY_MIG_MANAGER);
            }
            keys
        }
    }
}

/// Plans the label and annotation changes of one node when only what pods hold is known.
pub fn plan(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    cluster: &Cluster,
    claims: GpuClaims,
) -> Plan {
    plan_node(labels, annotations, cluster, NodeFacts::claims(claims))
}

/// Plans the label and annotation changes of one node.
pub fn plan_node(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    cluster: &Cluster,
    facts: NodeFacts,
) -> Plan {
    let claims = facts.claims;
    let mut desired: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let mut findings = Vec::new();
    let gpu = is_gpu_node(labels);

    if gpu {
        desired.insert(l::GPU_PRESENT, Some("true".into()));
    } else if labels.contains_key(l::GPU_PRESENT) {
        desired.insert(l::GPU_PRESENT, Some("false".into()));
    }

    let new_node_mode = cluster.mode_for_new_nodes();
    let active_cr = new_node_mode.is_some();
    let opted_out = value(labels, l::ENABLED) == Some("false");
    let label = value(labels, l::ALLOCATION_MODE);
    let chosen_before = annotations.get(l::CHOSEN_MODE).map(String::as_str);
    // The labeler's own choice may change; a label it did not choose is an admin's and wins.
    let chosen_by_us = label.is_some() && label == chosen_before;
    let mut chosen_after = chosen_before.map(str::to_owned);
    let mut excluded = false;
    let mode = match label {
        _ if gpu && facts.pinned.is_some() => {
            let pinned = facts.pinned;
            if label != pinned.map(AllocationMode::as_str) {
                desired.insert(l::ALLOCATION_MODE, pinned.map(|m| m.to_string()));
            }
            chosen_after = pinned.map(|m| m.to_string());
            pinned
        }
        Some(v) if !chosen_by_us => {
            chosen_after = None;
            match v.parse::<AllocationMode>() {
                Ok(mode) => Some(mode),
                Err(_) => {
                    findings.push(Finding::InvalidMode(v.to_owned()));
                    None
                }
            }
        }
        _ if !gpu || opted_out => label.and_then(|v| v.parse().ok()),
        _ => {
            let rule = cluster.rules.iter().find(|r| r.matches(labels));
            let want = match (rule, label) {
                (Some(rule), _) => Some(rule.mode),
                // Served by neither plane unless a rule names them.
                (None, _) if is_control_plane(labels) => None,
                // The default is for new nodes; a node with a mode keeps it.
                (None, Some(v)) => v.parse().ok(),
                (None, None) => new_node_mode,
            };
            match want {
                Some(mode) => {
                    if label != Some(mode.as_str()) {
                        desired.insert(l::ALLOCATION_MODE, Some(mode.to_string()));
                        if let Some(rule) = rule {
                            findings.push(Finding::ModeChosenByRule {
                                rule: rule.name.clone(),
                                mode,
                            });
                        }
                    }
                    chosen_after = Some(mode.to_string());
                }
                None => {
                    excluded = active_cr;
                    if label.is_some() {
                        desired.insert(l::ALLOCATION_MODE, None);
                    }
                    chosen_after = None;
                }
            }
            want
        }
    };

    let kill_switch = value(labels, l::DEPLOY_OPERANDS) == Some("false");
    let stripped = !gpu || kill_switch || (active_cr && (opted_out || excluded));
    if stripped {
        // Not (or not yet) a GPU node, operands switched off, opted out, or a control-plane
        // node no rule names: nothing of ours stays. A `false` is an admin's opt-out, never
        // ours, and stays: it still holds when GPU discovery labels the node later.
        for key in owned_keys().filter(|k| value(labels, k) != Some("false")) {
            desired.insert(key, None);
        }
    } else if let (Some(mode), true) = (mode, active_cr) {
        let keep = plane_keys(mode, labels);
        for key in owned_keys().filter(|k| !keep.contains(k)) {
            desired.insert(key, None);
        }
        if cluster.serves(mode) {
            for key in keep.into_iter().filter(|k| value(labels, k).is_none()) {
                desired.insert(key, Some("true".into()));
            }
        }
    }

    // A plane's plugin leaves only once no pod holds GPUs it gave (claims, or device-plugin
    // resources); meanwhile the other plane's keys wait, so no GPU is offered by both planes.
    // `claims` speaks of one plane: the first whose plugin label goes (a node carrying both,
    // which the labeler never makes, has only its DRA plugin guarded).
    let mut needs_claim_lookup = None;
    let leaving = [
        (
            AllocationMode::Dra,
            l::DEPLOY_DRA_DRIVER,
            Finding::DraDriverRemovalDeferred,
        ),
        (
            AllocationMode::DevicePlugin,
            l::DEPLOY_DEVICE_PLUGIN,
            Finding::DevicePluginRemovalDeferred,
        ),
    ]
    .into_iter()
    // An empty value selects no plugin pod, so only a real value needs the check.
    .find(|(_, key, _)| matches!(desired.get(key), Some(None)) && value(labels, key).is_some());
    let mut switch = None;
    if let Some((plane, plugin_key, deferred)) = leaving {
        switch = mode
            .filter(|m| *m != plane && active_cr && !stripped && cluster.serves(*m))
            .map(|m| (plane, m));
        let kept = match claims {
            _ if facts.hold != Hold::No => true,
            GpuClaims::None => false,
            GpuClaims::Unknown => {
                needs_claim_lookup = Some(plane);
                true
            }
            GpuClaims::Held => {
                findings.push(deferred);
                true
            }
        };
        if kept {
            desired.remove(plugin_key);
            let other_plane = |key: &str| in_plane(plane.other(), key);
            // The shared driver key is never added or removed by a switch.
            desired.retain(|key, want| {
                want.is_none() || *key == l::DEPLOY_DRIVER || !other_plane(key)
            });
            if facts.hold == Hold::WholePlane {
                desired.retain(|key, want| want.is_some() || !in_plane(plane, key));
            }
        }
    }

    // Readiness labels follow the plane whose plugin the node keeps, and only while its
    // validator passes there.
    if gpu && active_cr {
        let after = |key: &str| match desired.get(key) {
            Some(want) => want.as_deref().is_some_and(|v| !v.is_empty()),
            None => value(labels, key).is_some(),
        };
        let plane = match (after(l::DEPLOY_DRA_DRIVER), after(l::DEPLOY_DEVICE_PLUGIN)) {
            (true, false) => Some(AllocationMode::Dra),
            (false, true) => Some(AllocationMode::DevicePlugin),
            _ => None,
        };
        let ready = plane.filter(|p| facts.ready.has(*p));
        desired.insert(l::GPU_STACK, ready.map(|p| p.to_string()));
        desired.insert(l::GPU_SETUP_COMPLETE, ready.map(|_| "true".to_owned()));
    } else {
        desired.insert(l::GPU_STACK, None);
        desired.insert(l::GPU_SETUP_COMPLETE, None);
    }

    let mut annotations_plan = BTreeMap::new();
    if chosen_after.as_deref() != chosen_before {
        annotations_plan.insert(l::CHOSEN_MODE.to_owned(), chosen_after);
    }
    if gpu && active_cr {
        let want = cluster.driver_auto_upgrade.then(|| "true".to_owned());
        if annotations.get(l::DRIVER_UPGRADE_ENABLED) != want.as_ref() {
            annotations_plan.insert(l::DRIVER_UPGRADE_ENABLED.to_owned(), want);
        }
    }

    Plan {
        labels: desired
            .into_iter()
            .filter(|(key, want)| labels.get(*key) != want.as_ref())
            .map(|(key, want)| (key.to_owned(), want))
            .collect(),
        annotations: annotations_plan,
        findings,
        needs_claim_lookup,
        switch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NFD: &str = "feature.node.kubernetes.io/pci-10de.present";
    const MODE: &str = l::ALLOCATION_MODE;
    const DRA: &str = l::DEPLOY_DRA_DRIVER;
    const DP: &str = "nvidia.com/gpu.deploy.device-plugin";

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn cluster(gpu_cluster: bool, cluster_policy: bool) -> Cluster {
        Cluster {
            gpu_cluster,
            cluster_policy,
            gpu_cluster_device_plugin: false,
            default_mode: AllocationMode::DevicePlugin,
            driver_auto_upgrade: false,
            rules: Vec::new(),
        }
    }

    const GC: Cluster = Cluster {
        gpu_cluster: true,
        cluster_policy: false,
        gpu_cluster_device_plugin: false,
        default_mode: AllocationMode::DevicePlugin,
        driver_auto_upgrade: false,
        rules: Vec::new(),
    };

    fn labels_after(
        node: &[(&str, &str)],
        c: &Cluster,
        claims: GpuClaims,
    ) -> BTreeMap<String, String> {
        let mut labels = map(node);
        for (k, v) in plan(&labels.clone(), &BTreeMap::new(), c, claims).labels {
            match v {
                Some(v) => labels.insert(k, v),
                None => labels.remove(&k),
            };
        }
        labels
    }

    fn sets<'a>(p: &'a Plan, key: &str) -> Option<&'a str> {
        p.labels.get(key).and_then(|v| v.as_deref())
    }

    /// A GPUCluster that serves both planes, with `default_mode` for new nodes.
    fn both_planes(default_mode: AllocationMode) -> Cluster {
        Cluster {
            gpu_cluster_device_plugin: true,
            default_mode,
            ..GC
        }
    }

    #[test]
    fn a_gpucluster_serving_both_planes_puts_new_nodes_in_the_default_mode() {
        let dp = labels_after(
            &[(NFD, "true")],
            &both_planes(AllocationMode::DevicePlugin),
            GpuClaims::Unknown,
        );
        assert_eq!(dp.get(MODE).map(String::as_str), Some("device-plugin"));
        assert_eq!(dp.get(DP).map(String::as_str), Some("true"));
        assert!(!dp.contains_key(DRA));

        let dra = labels_after(
            &[(NFD, "true")],
            &both_planes(AllocationMode::Dra),
            GpuClaims::Unknown,
        );
        assert_eq!(dra.get(MODE).map(String::as_str), Some("dra"));
        assert_eq!(dra.get(DRA).map(String::as_str), Some("true"));
        assert!(!dra.contains_key(DP));
    }

    #[test]
    fn switching_a_node_to_device_plugin_moves_its_deploy_labels() {
        let c = both_planes(AllocationMode::Dra);
        let on_dra = labels_after(&[(NFD, "true")], &c, GpuClaims::Unknown);
        let mut switched: Vec<(&str, &str)> = on_dra
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .filter(|(k, _)| *k != MODE)
            .collect();
        switched.push((MODE, "device-plugin"));
        let after = labels_after(&switched, &c, GpuClaims::None);
        assert_eq!(after.get(DP).map(String::as_str), Some("true"));
        assert!(!after.contains_key(DRA), "{after:?}");
        assert!(
            !after
                .keys()
                .any(|k| k.ends_with("-dra") || k.ends_with("dra-validator")),
            "{after:?}"
        );
    }

    /// A converged node on `mode`'s plane, with `extra` labels on top.
    fn converged(c: &Cluster, mode: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut labels = labels_after(&[(NFD, "true"), (MODE, mode)], c, GpuClaims::None);
        labels.extend(map(extra));
        labels
    }

    #[test]
    fn a_switch_between_served_planes_is_reported_for_the_hand_over() {
        let c = both_planes(AllocationMode::Dra);
        let mut on_dp = converged(&c, "device-plugin", &[]);
        on_dp.insert(MODE.into(), "dra".into());
        let p = plan(&on_dp, &BTreeMap::new(), &c, GpuClaims::Held);
        assert_eq!(
            p.switch,
            Some((AllocationMode::DevicePlugin, AllocationMode::Dra))
        );
        // Opting out is no switch: nothing is handed over to.
        let mut opted_out = converged(&c, "device-plugin", &[(l::ENABLED, "false")]);
        opted_out.insert(MODE.into(), "dra".into());
        assert_eq!(
            plan(&opted_out, &BTreeMap::new(), &c, GpuClaims::Held).switch,
            None
        );
        // Nor is a mode whose plane nobody serves.
        let mut to_unserved = converged(&GC, "dra", &[]);
        to_unserved.insert(MODE.into(), "device-plugin".into());
        assert_eq!(
            plan(&to_unserved, &BTreeMap::new(), &GC, GpuClaims::Held).switch,
            None
        );
    }

    #[test]
    fn a_pinned_node_stays_on_its_plane_whatever_the_rules_say() {
        let rule = PlaneRule {
            name: "all-dra".into(),
            node_selector: Default::default(),
            mode: AllocationMode::Dra,
        };
        let c = Cluster {
            rules: vec![Rule::new(&rule).unwrap()],
            ..both_planes(AllocationMode::Dra)
        };
        let mut node = converged(&both_planes(AllocationMode::Dra), "dra", &[]);
        node.insert(MODE.into(), "dra".into());
        let facts = NodeFacts {
            pinned: Some(AllocationMode::DevicePlugin),
            ..NodeFacts::claims(GpuClaims::Held)
        };
        let p = plan_node(&node, &BTreeMap::new(), &c, facts);
        assert_eq!(sets(&p, MODE), Some("device-plugin"));
        assert_eq!(
            p.annotations.get(l::CHOSEN_MODE),
            Some(&Some("device-plugin".to_owned()))
        );
        assert_eq!(
            p.switch,
            Some((AllocationMode::Dra, AllocationMode::DevicePlugin))
        );
        assert!(
            !p.findings
                .iter()
                .any(|f| matches!(f, Finding::ModeChosenByRule { .. })),
            "no rule decided: {:?}",
            p.findings
        );
    }

    #[test]
    fn a_queued_hand_over_keeps_the_old_plane_whole_and_a_draining_one_its_plugin() {
        let c = both_planes(AllocationMode::Dra);
        let mut node = converged(&c, "device-plugin", &[]);
        node.insert(MODE.into(), "dra".into());
        let hold = |hold| NodeFacts {
            hold,
            ..NodeFacts::claims(GpuClaims::Unknown)
        };
        let p = plan_node(&node, &BTreeMap::new(), &c, hold(Hold::WholePlane));
        assert!(p.labels.is_empty(), "{:?}", p.labels);
        assert!(p.findings.is_empty(), "{:?}", p.findings);
        assert_eq!(p.needs_claim_lookup, None);
        assert_eq!(
            p.switch,
            Some((AllocationMode::DevicePlugin, AllocationMode::Dra))
        );
        // Draining keeps only the plugin, as a deferral does, but says nothing.
        let draining = plan_node(&node, &BTreeMap::new(), &c, hold(Hold::Plugin));
        assert!(draining.findings.is_empty(), "{:?}", draining.findings);
        let deferred = plan(&node, &BTreeMap::new(), &c, GpuClaims::Held);
        assert_eq!(draining.labels, deferred.labels);
        assert_eq!(
            draining.labels.get(l::DEPLOY_OPERATOR_VALIDATOR),
            Some(&None),
            "{:?}",
            draining.labels
        );
        assert!(!draining.labels.contains_key(DP));
    }

    #[test]
    fn readiness_labels_follow_the_validator_of_the_plane_the_node_keeps() {
        let c = both_planes(AllocationMode::Dra);
        let node = converged(&c, "dra", &[]);
        let ready = |dra, device_plugin| NodeFacts {
            ready: ReadyPlanes { dra, device_plugin },
            ..NodeFacts::claims(GpuClaims::None)
        };
        let p = plan_node(&node, &BTreeMap::new(), &c, ready(true, false));
        assert_eq!(sets(&p, l::GPU_STACK), Some("dra"));
        assert_eq!(sets(&p, l::GPU_SETUP_COMPLETE), Some("true"));
        // Another plane's validator proves nothing about this one.
        assert!(
            plan_node(&node, &BTreeMap::new(), &c, ready(false, true))
                .labels
                .is_empty()
        );
        // Once set, they go when the validator stops passing...
        let mut labelled = node.clone();
        labelled.extend(map(&[
            (l::GPU_STACK, "dra"),
            (l::GPU_SETUP_COMPLETE, "true"),
        ]));
        assert!(
            plan_node(&labelled, &BTreeMap::new(), &c, ready(true, false))
                .labels
                .is_empty()
        );
        let p = plan_node(&labelled, &BTreeMap::new(), &c, ready(false, false));
        assert_eq!(p.labels.get(l::GPU_STACK), Some(&None));
        assert_eq!(p.labels.get(l::GPU_SETUP_COMPLETE), Some(&None));
        // ...and when the labels move to the other plane, whatever the old validator says.
        labelled.insert(MODE.into(), "device-plugin".into());
        let p = plan_node(&labelled, &BTreeMap::new(), &c, ready(true, false));
        assert_eq!(p.labels.get(DRA), Some(&None));
        assert_eq!(p.labels.get(l::GPU_STACK), Some(&None));
        // While the old plane is kept, it is still the one that counts.
        let mut held = NodeFacts {
            claims: GpuClaims::Held,
            ..ready(true, false)
        };
        assert!(
            !plan_node(&labelled, &BTreeMap::new(), &c, held)
                .labels
                .contains_key(l::GPU_STACK)
        );
        held.ready = ReadyPlanes::default();
        let cpu = map(&[(l::GPU_STACK, "dra")]);
        assert_eq!(
            plan_node(&cpu, &BTreeMap::new(), &c, held)
                .labels
                .get(l::GPU_STACK),
            Some(&None)
        );
    }

    #[test]
    fn a_gpucluster_without_its_device_plugin_keeps_new_nodes_on_dra() {
        let dra = labels_after(
            &[(NFD, "true")],
            &Cluster {
                default_mode: AllocationMode::DevicePlugin,
                ..GC
            },
            GpuClaims::Unknown,
        );
        assert_eq!(dra.get(MODE).map(String::as_str), Some("dra"));
    }

    #[test]
    fn new_gpu_node_with_gpucluster_gets_dra_mode_and_the_dra_plane() {
        let p = plan(
            &map(&[(NFD, "true")]),
            &BTreeMap::new(),
            &GC,
            GpuClaims::Unknown,
        );
        assert_eq!(sets(&p, l::GPU_PRESENT), Some("true"));
        assert_eq!(sets(&p, MODE), Some("dra"));
        for key in l::DRA_PLANE_KEYS {
            assert_eq!(sets(&p, key), Some("true"), "{key}");
        }
        assert_eq!(p.labels.len(), 2 + l::DRA_PLANE_KEYS.len(), "{p:#?}");
        assert!(p.needs_claim_lookup.is_none());
    }

    #[test]
    fn every_nfd_gpu_label_counts_and_false_does_not() {
        for key in l::NFD_GPU_LABELS {
            assert!(is_gpu_node(&map(&[(key, "true")])), "{key}");
            assert!(!is_gpu_node(&map(&[(key, "false")])), "{key}");
        }
        assert!(!is_gpu_node(&map(&[(
            "feature.node.kubernetes.io/cpu-model.vendor_id",
            "Intel"
        )])));
    }

    #[test]
    fn cpu_nodes_get_nothing() {
        let p = plan(
            &map(&[("kubernetes.io/os", "linux")]),
            &BTreeMap::new(),
            &GC,
            GpuClaims::Unknown,
        );
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn lost_gpu_labels_set_present_false_and_remove_our_keys() {
        let node = [
            (l::GPU_PRESENT, "true"),
            (MODE, "dra"),
            (l::DEPLOY_DRA_VALIDATOR, "true"),
            ("nvidia.com/gpu.deploy.nvsm", "true"),
        ];
        let after = labels_after(&node, &GC, GpuClaims::None);
        assert_eq!(after.get(l::GPU_PRESENT).map(String::as_str), Some("false"));
        assert!(!after.contains_key(l::DEPLOY_DRA_VALIDATOR));
        assert_eq!(
            after.get("nvidia.com/gpu.deploy.nvsm").map(String::as_str),
            Some("true")
        );
        assert_eq!(
            after.get(MODE).map(String::as_str),
            Some("dra"),
            "mode is never overwritten"
        );
    }

    #[test]
    fn default_mode_decides_only_when_both_crs_exist() {
        let node = [(NFD, "true")];
        let mode_of = |c: Cluster| {
            plan(&map(&node), &BTreeMap::new(), &c, GpuClaims::Unknown)
                .labels
                .get(MODE)
                .cloned()
                .flatten()
        };
        assert_eq!(mode_of(cluster(true, false)), Some("dra".into()));
        assert_eq!(mode_of(cluster(false, true)), Some("device-plugin".into()));
        assert_eq!(mode_of(cluster(true, true)), Some("device-plugin".into()));
        assert_eq!(
            mode_of(Cluster {
                default_mode: AllocationMode::Dra,
                ..cluster(true, true)
            }),
            Some("dra".into())
        );
        assert_eq!(mode_of(cluster(false, false)), None);
    }

    #[test]
    fn neither_cr_only_maintains_gpu_present() {
        let node = [(NFD, "true"), (MODE, "dra"), (DP, "true")];
        let p = plan(
            &map(&node),
            &BTreeMap::new(),
            &cluster(false, false),
            GpuClaims::Unknown,
        );
        assert_eq!(
            p.labels,
            BTreeMap::from([(l::GPU_PRESENT.to_string(), Some("true".to_string()))])
        );
    }

    #[test]
    fn admin_set_mode_is_honoured() {
        let node = [(NFD, "true"), (MODE, "device-plugin")];
        let after = labels_after(&node, &cluster(true, true), GpuClaims::None);
        assert_eq!(after.get(MODE).map(String::as_str), Some("device-plugin"));
        assert_eq!(after.get(DP).map(String::as_str), Some("true"));
        assert!(!after.contains_key(DRA));
    }

    #[test]
    fn invalid_mode_is_reported_never_overwritten_and_deploy_labels_are_left_alone() {
        for bad in ["DRA", "gpu", "device_plugin"] {
            let node = [(NFD, "true"), (MODE, bad), (DP, "true"), (DRA, "true")];
            let p = plan(&map(&node), &BTreeMap::new(), &GC, GpuClaims::Unknown);
            assert_eq!(p.findings, vec![Finding::InvalidMode(bad.into())]);
            assert!(!p.labels.contains_key(MODE), "{bad}: {p:?}");
            assert!(
                !p.labels.contains_key(DP) && !p.labels.contains_key(DRA),
                "{bad}: {p:?}"
            );
        }
    }

    #[test]
    fn empty_mode_counts_as_unset() {
        let p = plan(
            &map(&[(NFD, "true"), (MODE, "")]),
            &BTreeMap::new(),
            &GC,
            GpuClaims::Unknown,
        );
        assert_eq!(sets(&p, MODE), Some("dra"));
    }

    #[test]
    fn existing_non_empty_values_are_kept_and_empty_ones_set() {
        let pause = l::PAUSED_FOR_DRIVER_UPGRADE;
        let suffixed = "true_paused-for-driver-upgrade";
        let node = [
            (NFD, "true"),
            (MODE, "dra"),
            (l::DEPLOY_DRIVER, "pre-installed"),
            (DRA, pause),
            (l::DEPLOY_DRA_VALIDATOR, suffixed),
            (l::DEPLOY_DCGM_DRA, "false"),
            (l::DEPLOY_DCGM_EXPORTER_DRA, ""),
        ];
        let after = labels_after(&node, &GC, GpuClaims::Unknown);
        assert_eq!(after[l::DEPLOY_DRIVER], "pre-installed");
        assert_eq!(after[DRA], pause);
        assert_eq!(after[l::DEPLOY_DRA_VALIDATOR], suffixed);
        assert_eq!(after[l::DEPLOY_DCGM_DRA], "false");
        assert_eq!(after[l::DEPLOY_DCGM_EXPORTER_DRA], "true");
    }

    #[test]
    fn dra_nodes_sweep_the_device_plugin_plane_whatever_its_values() {
        let node = [
            (NFD, "true"),
            (MODE, "dra"),
            (DP, "paused-for-driver-upgrade"),
            ("nvidia.com/gpu.deploy.mig-manager", "true"),
            ("nvidia.com/gpu.deploy.operator-validator", "false"),
        ];
        // Once no pod holds a GPU the device plugin gave.
        let after = labels_after(&node, &GC, GpuClaims::None);
        for key in l::DEVICE_PLUGIN_ONLY_KEYS {
            assert!(!after.contains_key(key), "{key} left on a DRA node");
        }
    }

    #[test]
    fn unknown_deploy_keys_and_operands_key_are_never_touched() {
        let node = [
            (NFD, "true"),
            (MODE, "dra"),
            ("nvidia.com/gpu.deploy.nvsm", "true"),
            (l::DEPLOY_OPERANDS, "true"),
            ("nvidia.com/mig.config", "all-disabled"),
        ];
        let p = plan(&map(&node), &BTreeMap::new(), &GC, GpuClaims::Unknown);
        for key in [
            "nvidia.com/gpu.deploy.nvsm",
            l::DEPLOY_OPERANDS,
            "nvidia.com/mig.config",
        ] {
            assert!(!p.labels.contains_key(key), "{key}");
        }
    }

    #[test]
    fn an_admins_opt_out_outlives_a_node_not_yet_labelled_a_gpu_node() {
        // Before GPU discovery has labelled the node, it is no GPU node: our keys go, the
        // admin's `false` stays, and holds once the node turns out to have GPUs.
        let node = [
            (MODE, "dra"),
            (l::DEPLOY_DRA_VALIDATOR, "false"),
            (l::DEPLOY_DCGM_EXPORTER_DRA, "false"),
            (DRA, "true"),
        ];
        let before = labels_after(&node, &GC, GpuClaims::None);
        assert!(!before.contains_key(DRA));
        assert_eq!(before[l::DEPLOY_DRA_VALIDATOR], "false");
        assert_eq!(before[l::DEPLOY_DCGM_EXPORTER_DRA], "false");
        let mut discovered: Vec<(&str, &str)> = before
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        discovered.push((NFD, "true"));
        let after = labels_after(&discovered, &GC, GpuClaims::None);
        assert_eq!(after[DRA], "true");
        assert_eq!(after[l::DEPLOY_DRA_VALIDATOR], "false");
        assert_eq!(after[l::DEPLOY_DCGM_EXPORTER_DRA], "false");
    }

    #[test]
    fn kill_switch_removes_every_key_we_own_but_waits_for_claims_on_dra_driver() {
        let node = [
            (NFD, "true"),
            (MODE, "dra"),
            (l::DEPLOY_OPERANDS, "false"),
            (DRA, "true"),
            (l::DEPLOY_DRA_VALIDATOR, "true"),
            (l::DEPLOY_DRIVER, "true"),
            (DP, "true"),
            ("nvidia.com/gpu.deploy.nvsm", "true"),
        ];
        let held = labels_after(&node, &GC, GpuClaims::Held);
        assert_eq!(held.get(DRA).map(String::as_str), Some("true"));
        assert!(!held.contains_key(l::DEPLOY_DRA_VALIDATOR) && !held.contains_key(DP));
        let free = labels_after(&node, &GC, GpuClaims::None);
        for key in owned_keys() {
            assert!(!free.contains_key(key), "{key}");
        }
        assert!(free.contains_key("nvidia.com/gpu.deploy.nvsm"));
        assert_eq!(
            free.get(l::DEPLOY_OPERANDS).map(String::as_str),
            Some("false")
        );
    }

    #[test]
    fn switching_away_from_dra_defers_dra_driver_until_claims_are_gone() {
        let node = [
            (NFD, "true"),
            (MODE, "device-plugin"),
            (DRA, "true"),
            (l::DEPLOY_DRA_VALIDATOR, "true"),
            (l::DEPLOY_DRIVER, "true"),
        ];
        let both = cluster(true, true);

        let unknown = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Unknown);
        assert_eq!(unknown.needs_claim_lookup, Some(AllocationMode::Dra));
        assert!(!unknown.labels.contains_key(DRA));

        let held = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Held);
        assert!(!held.labels.contains_key(DRA));
        assert!(held.is_deferred());
        assert_eq!(
            held.labels.get(l::DEPLOY_DRA_VALIDATOR),
            Some(&None),
            "consumers go first"
        );
        assert_eq!(
            sets(&held, DP),
            None,
            "no device plugin while the DRA plugin serves held claims: one plane per node"
        );
        assert_eq!(sets(&unknown, DP), None);
        assert!(
            !held.labels.contains_key(l::DEPLOY_DRIVER),
            "the shared driver key stays"
        );

        let free = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::None);
        assert_eq!(free.labels.get(DRA), Some(&None));
        assert_eq!(
            sets(&free, DP),
            Some("true"),
            "the device plugin once DRA is gone"
        );
        assert!(!free.is_deferred() && free.needs_claim_lookup.is_none());
    }

    #[test]
    fn switching_back_to_dra_keeps_the_device_plugin_until_its_gpus_are_free() {
        let node = [
            (NFD, "true"),
            (MODE, "dra"),
            (DP, "true"),
            ("nvidia.com/gpu.deploy.operator-validator", "true"),
            (l::DEPLOY_DRIVER, "true"),
        ];
        let both = cluster(true, true);
        let unknown = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Unknown);
        assert_eq!(
            unknown.needs_claim_lookup,
            Some(AllocationMode::DevicePlugin)
        );
        let held = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Held);
        for p in [&unknown, &held] {
            assert!(!p.labels.contains_key(DP), "the device plugin stays");
            assert_eq!(
                sets(p, DRA),
                None,
                "no DRA plugin beside it: one plane per node"
            );
            assert_eq!(
                p.labels.get("nvidia.com/gpu.deploy.operator-validator"),
                Some(&None),
                "its consumers go first"
            );
        }
        assert!(
            held.findings
                .contains(&Finding::DevicePluginRemovalDeferred)
        );
        assert!(held.is_deferred());
        let free = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::None);
        assert_eq!(free.labels.get(DP), Some(&None));
        assert_eq!(sets(&free, DRA), Some("true"));
        assert!(!free.is_deferred());
    }

    fn with_rules(rules: serde_json::Value) -> Cluster {
        let rules: Vec<PlaneRule> = serde_json::from_value(rules).unwrap();
        Cluster {
            rules: rules.iter().map(|r| Rule::new(r).unwrap()).collect(),
            ..both_planes(AllocationMode::Dra)
        }
    }

    fn policy() -> Cluster {
        with_rules(serde_json::json!([
            {"name": "a100-on-dra", "mode": "dra",
             "nodeSelector": {"matchExpressions": [{"key": l::GPU_PRODUCT, "operator": "In",
                                                    "values": ["NVIDIA-A100-SXM4-40GB"]}]}},
            {"name": "rest-on-device-plugin", "mode": "device-plugin", "nodeSelector": {}},
        ]))
    }

    const CHOSEN: &str = l::CHOSEN_MODE;

    fn annotated(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        map(pairs)
    }

    #[test]
    fn the_first_matching_rule_chooses_a_new_nodes_mode_and_says_so() {
        let a100 = map(&[(NFD, "true"), (l::GPU_PRODUCT, "NVIDIA-A100-SXM4-40GB")]);
        let p = plan(&a100, &BTreeMap::new(), &policy(), GpuClaims::None);
        assert_eq!(sets(&p, MODE), Some("dra"));
        assert_eq!(p.annotations.get(CHOSEN), Some(&Some("dra".to_owned())));
        assert!(p.findings.contains(&Finding::ModeChosenByRule {
            rule: "a100-on-dra".into(),
            mode: AllocationMode::Dra
        }));
        let t4 = map(&[(NFD, "true"), (l::GPU_PRODUCT, "Tesla-T4")]);
        let p = plan(&t4, &BTreeMap::new(), &policy(), GpuClaims::None);
        assert_eq!(sets(&p, MODE), Some("device-plugin"));
        assert_eq!(sets(&p, DP), Some("true"));
    }

    #[test]
    fn a_changed_rule_moves_the_nodes_the_labeler_chose_for_but_not_hand_set_ones() {
        let moved = with_rules(serde_json::json!([
            {"name": "all-on-device-plugin", "mode": "device-plugin", "nodeSelector": {}}]));
        let node = map(&[
            (NFD, "true"),
            (MODE, "dra"),
            (DRA, "true"),
            (l::DEPLOY_DRIVER, "true"),
        ]);
        let ours = annotated(&[(CHOSEN, "dra")]);
        let p = plan(&node, &ours, &moved, GpuClaims::None);
        assert_eq!(sets(&p, MODE), Some("device-plugin"));
        assert_eq!(
            p.annotations.get(CHOSEN),
            Some(&Some("device-plugin".to_owned()))
        );
        assert_eq!(p.labels.get(DRA), Some(&None));
        // Claims still held: the switch waits for them, as any switch does.
        let held = plan(&node, &ours, &moved, GpuClaims::Held);
        assert!(held.is_deferred() && !held.labels.contains_key(DRA));

        // The label differs from what the labeler chose: an admin's, kept; the annotation goes.
        let hand_set = annotated(&[(CHOSEN, "device-plugin")]);
        let p = plan(&node, &hand_set, &moved, GpuClaims::None);
        assert!(!p.labels.contains_key(MODE));
        assert_eq!(p.annotations.get(CHOSEN), Some(&None));
        // A label without the annotation (set by hand, or by a labeler before the policy) too.
        let p = plan(&node, &BTreeMap::new(), &moved, GpuClaims::None);
        assert!(!p.labels.contains_key(MODE) && !p.annotations.contains_key(CHOSEN));
    }

    #[test]
    fn the_default_is_for_new_nodes_only() {
        let node = map(&[(NFD, "true"), (MODE, "device-plugin"), (DP, "true")]);
        let ours = annotated(&[(CHOSEN, "device-plugin")]);
        // No rule matches and the default is dra: the node keeps the mode it has.
        let p = plan(
            &node,
            &ours,
            &with_rules(serde_json::json!([])),
            GpuClaims::None,
        );
        assert!(!p.labels.contains_key(MODE) && !p.annotations.contains_key(CHOSEN));
    }

    #[test]
    fn control_plane_nodes_get_a_mode_only_from_a_rule_that_names_them() {
        let cp = map(&[(NFD, "true"), (l::CONTROL_PLANE_ROLE, "")]);
        let p = plan(&cp, &BTreeMap::new(), &policy(), GpuClaims::None);
        assert!(
            !p.labels.contains_key(MODE),
            "the empty selector does not take it"
        );
        assert!(
            !p.labels
                .iter()
                .any(|(k, v)| k.starts_with(l::DEPLOY_PREFIX) && v.is_some()),
            "no plane's keys: {:?}",
            p.labels
        );
        let named = with_rules(serde_json::json!([
            {"name": "gpu-control-plane", "mode": "dra",
             "nodeSelector": {"matchExpressions": [{"key": l::CONTROL_PLANE_ROLE, "operator": "Exists"}]}}]));
        let p = plan(&cp, &BTreeMap::new(), &named, GpuClaims::None);
        assert_eq!(sets(&p, MODE), Some("dra"));
        assert_eq!(sets(&p, DRA), Some("true"));
        // Chosen before, no rule names it now: its mode and our keys go.
        let served = map(&[
            (NFD, "true"),
            (l::CONTROL_PLANE_ROLE, ""),
            (MODE, "dra"),
            (DRA, "true"),
        ]);
        let p = plan(
            &served,
            &annotated(&[(CHOSEN, "dra")]),
            &policy(),
            GpuClaims::None,
        );
        assert_eq!(p.labels.get(MODE), Some(&None));
        assert_eq!(p.labels.get(DRA), Some(&None));
        assert_eq!(p.annotations.get(CHOSEN), Some(&None));
    }

    #[test]
    fn an_opted_out_node_gets_no_mode_and_loses_our_keys() {
        let node = map(&[(NFD, "true"), (l::ENABLED, "false"), (DP, "true")]);
        let p = plan(&node, &BTreeMap::new(), &policy(), GpuClaims::None);
        assert!(!p.labels.contains_key(MODE));
        assert_eq!(p.labels.get(DP), Some(&None));
        // Claims of the plane it leaves are waited for, as for any removal.
        let held = plan(&node, &BTreeMap::new(), &policy(), GpuClaims::Held);
        assert!(!held.labels.contains_key(DP));
    }

    #[test]
    fn device_plugin_plane_adds_mig_manager_on_mig_capable_non_vgpu_nodes() {
        let cp = cluster(false, true);
        for (extra, want) in [
            (vec![(l::MIG_CAPABLE, "true")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-A100-SXM4-40GB")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3")], true),
            (vec![(l::GPU_PRODUCT, "Tesla-T4")], false),
            // Without the discovered label, every MIG-capable product by name...
            (vec![(l::GPU_PRODUCT, "NVIDIA-H200")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-H20")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-GH200-480GB")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-B200")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-GB200")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-B300-SXM6-AC")], true),
            (vec![(l::GPU_PRODUCT, "NVIDIA-A30")], true),
            (
                vec![(
                    l::GPU_PRODUCT,
                    "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
                )],
                true,
            ),
            // ...and no product whose name merely contains one.
            (vec![(l::GPU_PRODUCT, "NVIDIA-RTX-A3000-Laptop-GPU")], false),
            (vec![(l::GPU_PRODUCT, "NVIDIA-L4")], false),
            // What discovery found wins over the name.
            (
                vec![
                    (l::MIG_CAPABLE, "false"),
                    (l::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
                ],
                false,
            ),
            (
                vec![
                    (l::MIG_CAPABLE, "true"),
                    (l::VGPU_HOST_DRIVER_VERSION, "550.1"),
                ],
                false,
            ),
        ] {
            let mut node = vec![(NFD, "true")];
            node.extend(extra.clone());
            let after = labels_after(&node, &cp, GpuClaims::None);
            assert_eq!(after.contains_key(l::DEPLOY_MIG_MANAGER), want, "{extra:?}");
        }
    }

    #[test]
    fn converged_node_needs_no_write() {
        let node = [(NFD, "true")];
        let after = labels_after(&node, &GC, GpuClaims::Unknown);
        let pairs: Vec<(&str, &str)> = after
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let p = plan(&map(&pairs), &BTreeMap::new(), &GC, GpuClaims::Unknown);
        assert!(!p.has_changes(), "{p:#?}");
    }

    #[test]
    fn driver_upgrade_annotation_follows_the_policy_on_gpu_nodes() {
        let node = map(&[(NFD, "true")]);
        let on = Cluster {
            driver_auto_upgrade: true,
            ..GC
        };
        let p = plan(&node, &BTreeMap::new(), &on, GpuClaims::Unknown);
        assert_eq!(
            p.annotations.get(l::DRIVER_UPGRADE_ENABLED),
            Some(&Some("true".into()))
        );
        let annotated = map(&[(l::DRIVER_UPGRADE_ENABLED, "true")]);
        assert!(
            !plan(&node, &annotated, &on, GpuClaims::Unknown)
                .annotations
                .contains_key(l::DRIVER_UPGRADE_ENABLED)
        );
        let off = plan(&node, &annotated, &GC, GpuClaims::Unknown);
        assert_eq!(off.annotations.get(l::DRIVER_UPGRADE_ENABLED), Some(&None));
        let cpu = plan(&map(&[]), &BTreeMap::new(), &on, GpuClaims::Unknown);
        assert!(cpu.annotations.is_empty());
    }
}
