//! The DRA features of the apiserver the stack relies on beyond `resource.k8s.io/v1` itself, what
//! goes missing without each, and the `GPUCluster` condition that says so. Pure; the probes that
//! fill a [`Support`] (server-side dry-runs) live in the controller.

use std::collections::BTreeMap;

/// A DRA feature, named after the feature gate(s) that switch its fields on in the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// `DeviceClass.spec.extendedResourceName`.
    ExtendedResource,
    /// `Device.taints` in ResourceSlices and tolerations in claims.
    DeviceTaints,
    /// `Device.allowMultipleAllocations` and capacity requests.
    ConsumableCapacity,
    /// `ResourceSlice.spec.sharedCounters` and `Device.consumesCounters`.
    PartitionableDevices,
    /// `Device.bindingConditions`/`bindsToNode`, which the apiserver keeps only when claims carry
    /// per-device status too.
    BindingConditions,
}

impl Feature {
    /// Every feature, in the order the condition lists them.
    pub const ALL: [Feature; 5] = [
        Feature::ExtendedResource,
        Feature::DeviceTaints,
        Feature::ConsumableCapacity,
        Feature::PartitionableDevices,
        Feature::BindingConditions,
    ];

    /// The feature gate(s) behind it, as `--feature-gates` names them.
    pub fn gates(self) -> &'static str {
        match self {
            Feature::ExtendedResource => "DRAExtendedResource",
            Feature::DeviceTaints => "DRADeviceTaints",
            Feature::ConsumableCapacity => "DRAConsumableCapacity",
            Feature::PartitionableDevices => "DRAPartitionableDevices",
            Feature::BindingConditions => {
                "DRADeviceBindingConditions (with DRAResourceClaimDeviceStatus)"
            }
        }
    }

    /// What does not work while the apiserver does not serve it.
    pub fn without(self) -> &'static str {
        match self {
            Feature::ExtendedResource => {
                "pods asking for nvidia.com/gpu cannot run on DRA nodes; the DeviceClass \
                 gpu.nvidia.com is rendered without extendedResourceName"
            }
            Feature::DeviceTaints => {
                "a failing GPU cannot be tainted in its ResourceSlice, so the scheduler keeps \
                 giving it out, and claims cannot tolerate device taints"
            }
            Feature::ConsumableCapacity => {
                "a GPU cannot be shared by several claims (shared GPU classes, consumableShares)"
            }
            Feature::PartitionableDevices => {
                "no GPU is published in shares (GPUClass shared variants), and dynamic MIG \
                 (migPartitioning: dynamic) offers no partition: GPUs are published whole"
            }
            Feature::BindingConditions => {
                "devices cannot hold a pod's binding until they are attached, and claims carry \
                 no per-device status"
            }
        }
    }
}

/// What a probe found out about one feature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The apiserver kept the feature's field.
    Served,
    /// The apiserver dropped the field: the feature is off.
    Missing,
    /// The apiserver refused the field as the stack writes it, with its answer: it serves the
    /// feature in an older shape (Kubernetes 1.34 keeps a device's counter set in the device's own
    /// slice; the stack publishes counter sets in slices of their own, as 1.35 and later do).
    Refused(String),
    /// The probe failed, with why.
    Unknown(String),
}

/// What the apiserver serves of each feature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Support(pub BTreeMap<Feature, Probe>);

impl Support {
    /// Whether `feature` is known to be served.
    pub fn serves(&self, feature: Feature) -> bool {
        self.0.get(&feature) == Some(&Probe::Served)
    }

    /// Whether `feature` is served, or why that is not known: an unknown answer must never read
    /// as "not served", which would strip the feature's field from live objects.
    pub fn served(&self, feature: Feature) -> Result<bool, String> {
        match self.0.get(&feature) {
            Some(Probe::Served) => Ok(true),
            Some(Probe::Missing | Probe::Refused(_)) => Ok(false),
            Some(Probe::Unknown(why)) => Err(why.clone()),
            None => Err("not probed".into()),
        }
    }

    /// The `DRAFeaturesServed` condition: `(status, reason, message)`.
    pub fn condition(&self) -> (bool, &'static str, String) {
        if self.0.is_empty() {
            return (
                false,
                "NotChecked",
                "the DRA features are checked once resource.k8s.io/v1 is served".into(),
            );
        }
        let probe = |f: &Feature| {
            self.0
                .get(f)
                .cloned()
                .unwrap_or_else(|| Probe::Unknown("not checked yet".into()))
        };
        let missing: Vec<String> = Feature::ALL
            .iter()
            .filter(|f| probe(f) == Probe::Missing)
            .map(|f| format!("{} is off: {}", f.gates(), f.without()))
            .collect();
        let refused: Vec<String> = Feature::ALL
            .iter()
            .filter_map(|f| match probe(f) {
                Probe::Refused(why) => Some(format!(
                    "{} is served in an older shape than the stack writes (Kubernetes 1.35 or \
                     later serves it; the apiserver answered: {why}): {}",
                    f.gates(),
                    f.without()
                )),
                _ => None,
            })
            .collect();
        let unknown: Vec<String> = Feature::ALL
            .iter()
            .filter_map(|f| match probe(f) {
                Probe::Unknown(why) => Some(format!("{}: {why}", f.gates())),
                _ => None,
            })
            .collect();
        let mut message = missing.join("; ");
        if !missing.is_empty() {
            message.push_str(
                ". Turn the gates on in kube-apiserver (and kube-scheduler, kubelet) to get them",
            );
        }
        if !refused.is_empty() {
            if !message.is_empty() {
                message.push_str(". ");
            }
            message.push_str(&refused.join("; "));
        }
        if !unknown.is_empty() {
            if !message.is_empty() {
                message.push_str(". ");
            }
            message.push_str("could not check ");
            message.push_str(&unknown.join("; "));
        }
        match (missing.is_empty() && refused.is_empty(), unknown.is_empty()) {
            (true, true) => {
                let all: Vec<&str> = Feature::ALL.iter().map(|f| f.gates()).collect();
                (
                    true,
                    "AllServed",
                    format!("the apiserver serves {}", all.join(", ")),
                )
            }
            (false, _) => (false, "FeaturesMissing", message),
            (true, false) => (false, "FeaturesUnknown", message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn support(probes: &[(Feature, Probe)]) -> Support {
        let mut all: BTreeMap<_, _> = Feature::ALL.iter().map(|f| (*f, Probe::Served)).collect();
        all.extend(probes.iter().cloned());
        Support(all)
    }

    #[test]
    fn every_feature_served_reads_as_true_and_names_the_gates() {
        let (ok, reason, message) = support(&[]).condition();
        assert!(ok);
        assert_eq!(reason, "AllServed");
        assert!(message.contains("DRAExtendedResource") && message.contains("DRADeviceTaints"));
    }

    #[test]
    fn a_missing_gate_is_named_with_what_breaks_and_the_fix() {
        let s = support(&[(Feature::ExtendedResource, Probe::Missing)]);
        assert!(!s.serves(Feature::ExtendedResource));
        assert!(s.serves(Feature::DeviceTaints));
        let (ok, reason, message) = s.condition();
        assert!(!ok);
        assert_eq!(reason, "FeaturesMissing");
        assert!(message.starts_with("DRAExtendedResource is off: pods asking for nvidia.com/gpu"));
        assert!(message.contains("without extendedResourceName"));
        assert!(message.contains("Turn the gates on in kube-apiserver"));
        assert!(!message.contains("DRADeviceTaints"), "{message}");
    }

    #[test]
    fn a_refused_shape_is_missing_with_the_apiservers_answer() {
        let answer = "spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"probe\": \
                      must reference a counterSet defined in the ResourceSlice sharedCounters";
        let s = support(&[(Feature::PartitionableDevices, Probe::Refused(answer.into()))]);
        assert!(!s.serves(Feature::PartitionableDevices));
        let (ok, reason, message) = s.condition();
        assert!(!ok);
        assert_eq!(reason, "FeaturesMissing");
        assert!(
            message.starts_with("DRAPartitionableDevices is served in an older shape"),
            "{message}"
        );
        assert!(message.contains(answer) && message.contains("no GPU is published in shares"));
        assert!(!message.contains("Turn the gates on"), "{message}");
    }

    #[test]
    fn a_failed_probe_is_unknown_not_missing() {
        let s = support(&[(
            Feature::DeviceTaints,
            Probe::Unknown("resourceslices is forbidden".into()),
        )]);
        assert!(!s.serves(Feature::DeviceTaints));
        let (ok, reason, message) = s.condition();
        assert!(!ok);
        assert_eq!(reason, "FeaturesUnknown");
        assert_eq!(
            message,
            "could not check DRADeviceTaints: resourceslices is forbidden"
        );
        let (_, reason, _) = Support::default().condition();
        assert_eq!(reason, "NotChecked", "nothing probed yet");
    }
}
