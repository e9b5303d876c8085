//! What a `GPUClass` offers, as pure data: one [`Variant`] per whole-card or MIG offering, each
//! with its DeviceClass name, extended-resource name and the criteria a device must meet. Every
//! criterion is spelled twice, side by side: as CEL for the DeviceClass the scheduler evaluates,
//! and as a Rust predicate over the published devices for the counts in the class's status.

use std::collections::BTreeMap;

use super::{
    ARCHITECTURE_LABEL, DEVICE_LABEL, ExtendedResourceName, GPUClass, GROUP, SharingStrategy,
    device_slug,
};
use crate::contract::DRIVER_NAME;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use kube::ResourceExt;

/// One offering of a class: a whole card or one MIG profile.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// `whole`, `mig-<profile>` or `shared`.
    pub name: String,
    /// The derived DeviceClass.
    pub device_class: String,
    /// The extended resource that maps to it.
    pub extended_resource: String,
    /// What a device must be; all must hold.
    pub criteria: Vec<Criterion>,
    /// For shares, how the pods on one card are kept apart.
    pub sharing: Option<SharingStrategy>,
}

/// One condition on a device of the `gpu.nvidia.com` driver.
#[derive(Clone, Debug, PartialEq)]
pub enum Criterion {
    /// The `type` attribute: `gpu`, `mig` or `shared`.
    Type(&'static str),
    /// The `gpuClass` attribute of a share: the class it was published for.
    GpuClass(String),
    /// The MIG `profile` attribute.
    Profile(String),
    /// The product's slug ([`device_slug`] of `productName`).
    DeviceSlug(String),
    /// The architecture's slug ([`device_slug`] of `architecture`).
    ArchitectureSlug(String),
    /// `productName` is one of these.
    ProductName(Vec<String>),
    /// The `memory` capacity is at least this many bytes (`text` as the class wrote it).
    MinMemory { text: String, bytes: u128 },
    /// `cudaComputeCapability` is at least `major.minor`.
    MinComputeCapability { major: u64, minor: u64 },
}

/// A class the CRD's schema let through but the operator cannot turn into DeviceClasses.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("GPUClass {class}: {field}: {reason}")]
pub struct Invalid {
    /// The class.
    pub class: String,
    /// The field at fault, as a path from `spec`.
    pub field: &'static str,
    /// What is wrong and how to fix it.
    pub reason: String,
}

const ATTRIBUTES: &str = "device.attributes['gpu.nvidia.com']";
const CAPACITY: &str = "device.capacity['gpu.nvidia.com']";

/// A CEL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The CEL of the product slug, the same steps as [`device_slug`].
fn slug_cel(attribute: &str) -> String {
    format!("{ATTRIBUTES}.{attribute}.lowerAscii().replace('nvidia ', '').replace(' ', '-')")
}

impl Criterion {
    /// The criterion as a CEL expression over `device`.
    pub fn cel(&self) -> String {
        match self {
            Criterion::Type(kind) => format!("{ATTRIBUTES}.type == {}", literal(kind)),
            Criterion::Profile(p) => format!("{ATTRIBUTES}.profile == {}", literal(p)),
            Criterion::GpuClass(c) => format!("{ATTRIBUTES}.gpuClass == {}", literal(c)),
            Criterion::DeviceSlug(s) => format!("{} == {}", slug_cel("productName"), literal(s)),
            Criterion::ArchitectureSlug(s) => {
                format!("{} == {}", slug_cel("architecture"), literal(s))
            }
            Criterion::ProductName(names) => {
                let list: Vec<String> = names.iter().map(|n| literal(n)).collect();
                format!("{ATTRIBUTES}.productName in [{}]", list.join(", "))
            }
            Criterion::MinMemory { text, .. } => format!(
                "'memory' in {CAPACITY} && {CAPACITY}.memory.compareTo(quantity({})) >= 0",
                literal(text)
            ),
            Criterion::MinComputeCapability { major, minor } => format!(
                "{ATTRIBUTES}.cudaComputeCapability.compareTo(semver('{major}.{minor}.0')) >= 0"
            ),
        }
    }

    /// Whether `device` (of the `gpu.nvidia.com` driver) meets it, as the CEL decides.
    pub fn matches(&self, device: &Device) -> bool {
        let string = |name: &str| attribute(device, name).and_then(|a| a.string.as_deref());
        match self {
            Criterion::Type(kind) => string("type") == Some(kind),
            Criterion::Profile(p) => string("profile") == Some(p.as_str()),
            Criterion::GpuClass(c) => string("gpuClass") == Some(c.as_str()),
            Criterion::DeviceSlug(s) => string("productName").map(device_slug).as_ref() == Some(s),
            Criterion::ArchitectureSlug(s) => {
                string("architecture").map(device_slug).as_ref() == Some(s)
            }
            Criterion::ProductName(names) => {
                string("productName").is_some_and(|p| names.iter().any(|n| n == p))
            }
            Criterion::MinMemory { bytes, .. } => device
                .capacity
                .as_ref()
                .and_then(|c| c.get("memory").or_else(|| c.get("gpu.nvidia.com/memory")))
                .and_then(|c| quantity_bytes(&c.value.0))
                .is_some_and(|have| have >= *bytes),
            Criterion::MinComputeCapability { major, minor } => {
                attribute(device, "cudaComputeCapability")
                    .and_then(|a| a.version.as_deref())
                    .and_then(major_minor)
                    .is_some_and(|have| have >= (*major, *minor))
            }
        }
    }
}

/// A device's attribute of our driver's domain, qualified or not.
fn attribute<'a>(device: &'a Device, name: &str) -> Option<&'a DeviceAttribute> {
    let attributes = device.attributes.as_ref()?;
    attributes
        .get(name)
        .or_else(|| attributes.get(&format!("{DRIVER_NAME}/{name}")))
}

fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().unwrap_or("0").parse().ok()?;
    Some((major, minor))
}

/// Bytes in a Kubernetes quantity (`40Gi`, `42949672960`, `1.5G`), rounded down; `None` for what
/// is not a plain or suffixed number.
pub fn quantity_bytes(text: &str) -> Option<u128> {
    const SUFFIXES: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (number, unit) = SUFFIXES
        .iter()
        .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, *unit)))
        .unwrap_or((text, 1));
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let fraction = &fraction[..fraction.len().min(18)];
    let (numerator, denominator) = if fraction.is_empty() {
        (0, 1)
    } else {
        (
            fraction.parse::<u128>().ok()?,
            10u128.pow(fraction.len() as u32),
        )
    };
    whole
        .checked_mul(unit)?
        .checked_add(numerator * unit / denominator)
}

/// The DeviceClass of a variant: `<class>[-<variant>].gpu-operator-rs.dev`.
pub fn device_class_name(class: &str, variant: &str) -> String {
    match variant {
        "whole" => format!("{class}.{GROUP}"),
        other => format!("{class}-{other}.{GROUP}"),
    }
}

/// The extended resource of a variant unless the class names one:
/// `gpu-operator-rs.dev/<class>[-<variant>]`.
pub fn extended_resource_name(class: &str, variant: &str) -> String {
    match variant {
        "whole" => format!("{GROUP}/{class}"),
        other => format!("{GROUP}/{class}-{other}"),
    }
}

/// A MIG profile as a DNS-subdomain and resource-name part: `1g.10gb+me` is `1g.10gb-me`.
fn profile_part(profile: &str) -> String {
    profile.replace('+', "-")
}

/// The selector's criteria, which every variant of `class` shares.
fn common_criteria(class: &GPUClass) -> Result<Vec<Criterion>, Invalid> {
    let name = class.name_any();
    let selector = &class.spec.selector;
    let invalid = |field, reason: String| Invalid {
        class: name.clone(),
        field,
        reason,
    };
    let mut common = Vec::new();
    let labels: &BTreeMap<String, String> = &selector.match_labels;
    for (key, value) in labels {
        common.push(match key.as_str() {
            DEVICE_LABEL => Criterion::DeviceSlug(value.clone()),
            ARCHITECTURE_LABEL => Criterion::ArchitectureSlug(value.clone()),
            other => {
                return Err(invalid(
                    "selector.matchLabels",
                    format!("{other} selects nothing; use {DEVICE_LABEL} or {ARCHITECTURE_LABEL}"),
                ));
            }
        });
    }
    if !selector.product_names.is_empty() {
        common.push(Criterion::ProductName(selector.product_names.clone()));
    }
    if let Some(text) = &selector.min_memory {
        let bytes = quantity_bytes(text).ok_or_else(|| {
            invalid(
                "selector.minMemory",
                format!("{text} is not a quantity this operator reads; write it as 40Gi or 40G"),
            )
        })?;
        common.push(Criterion::MinMemory {
            text: text.clone(),
            bytes,
        });
    }
    if let Some(text) = &selector.min_compute_capability {
        let (major, minor) = major_minor(text).ok_or_else(|| {
            invalid(
                "selector.minComputeCapability",
                format!("{text} is not major.minor, e.g. 8.0"),
            )
        })?;
        common.push(Criterion::MinComputeCapability { major, minor });
    }
    if common.is_empty() {
        return Err(invalid(
            "selector",
            "the selector is empty; name the GPUs the class offers".into(),
        ));
    }
    Ok(common)
}

/// The variants of `class`: whole first, then MIG profiles in the order given, then shares.
pub fn variants(class: &GPUClass) -> Result<Vec<Variant>, Invalid> {
    let name = class.name_any();
    let common = common_criteria(class)?;
    // One variant: its DeviceClass and resource named after it (or the resource the class set),
    // its own criteria before the selector's.
    let variant = |variant: String,
                   own: Option<&ExtendedResourceName>,
                   first: Vec<Criterion>,
                   sharing: Option<SharingStrategy>| Variant {
        device_class: device_class_name(&name, &variant),
        extended_resource: own
            .map_or_else(|| extended_resource_name(&name, &variant), |n| n.0.clone()),
        name: variant,
        criteria: first.into_iter().chain(common.iter().cloned()).collect(),
        sharing,
    };
    let spec = &class.spec.variants;
    let mut out = Vec::new();
    if let Some(whole) = &spec.whole {
        let own = whole.extended_resource_name.as_ref();
        out.push(variant(
            "whole".into(),
            own,
            vec![Criterion::Type("gpu")],
            None,
        ));
    }
    for profile in spec.mig.iter().flat_map(|m| &m.profiles) {
        let first = vec![Criterion::Type("mig"), Criterion::Profile(profile.clone())];
        out.push(variant(
            format!("mig-{}", profile_part(profile)),
            None,
            first,
            None,
        ));
    }
    if let Some(shared) = &spec.shared {
        let own = shared.extended_resource_name.as_ref();
        let first = vec![Criterion::Type("shared"), Criterion::GpuClass(name.clone())];
        out.push(variant("shared".into(), own, first, Some(shared.strategy)));
    }
    if out.is_empty() {
        return Err(Invalid {
            class: name,
            field: "variants",
            reason: "no variant; offer whole cards (whole: {}), MIG partitions or shares".into(),
        });
    }
    Ok(out)
}

/// How large one share of a card is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareSize {
    /// The card's memory split this many ways.
    Count(u32),
    /// This many bytes each.
    Memory(u128),
}

/// What a node's plugin needs of a class with a `shared` variant to publish its shares: which
/// of its cards qualify and how large a share is.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedOffer {
    /// The class.
    pub class: String,
    /// What a whole card must be to be shared (the class's selector on `type == 'gpu'`).
    pub criteria: Vec<Criterion>,
    /// The size of one share.
    pub size: ShareSize,
    /// The isolation between the pods.
    pub strategy: SharingStrategy,
}

/// The shares `class` offers, if it has a `shared` variant.
pub fn shared_offer(class: &GPUClass) -> Result<Option<SharedOffer>, Invalid> {
    let Some(shared) = &class.spec.variants.shared else {
        return Ok(None);
    };
    let name = class.name_any();
    let invalid = |field, reason: String| Invalid {
        class: name.clone(),
        field,
        reason,
    };
    let size = match (shared.shares, &shared.memory) {
        (Some(n), None) if (2..=64).contains(&n) => ShareSize::Count(n.unsigned_abs()),
        (None, Some(text)) => {
            ShareSize::Memory(quantity_bytes(text).filter(|b| *b > 0).ok_or_else(|| {
                invalid(
                    "variants.shared.memory",
                    format!("{text} is not a positive quantity such as 10Gi"),
                )
            })?)
        }
        _ => {
            return Err(invalid(
                "variants.shared",
                "give shares (2 to 64 pods per card) or memory (per pod), one of the two".into(),
            ));
        }
    };
    let mut criteria = vec![Criterion::Type("gpu")];
    criteria.extend(common_criteria(class)?);
    Ok(Some(SharedOffer {
        class: name,
        criteria,
        size,
        strategy: shared.strategy,
    }))
}

impl SharedOffer {
    /// Whether a published whole card (a device of our driver) is one the class shares.
    pub fn admits(&self, card: &Device) -> bool {
        self.criteria.iter().all(|c| c.matches(card))
    }

    /// The bytes of one share of a card of `card_bytes`: the card split `n` ways (rounded down
    /// to a MiB), or the class's memory; `None` when not even one share fits the card.
    pub fn share_bytes(&self, card_bytes: u64) -> Option<u64> {
        const MIB: u64 = 1 << 20;
        let bytes = match self.size {
            ShareSize::Count(n) => {
                let part = card_bytes / u64::from(n.max(1));
                if part >= MIB { part / MIB * MIB } else { part }
            }
            ShareSize::Memory(b) => u64::try_from(b).ok()?,
        };
        (bytes > 0 && bytes <= card_bytes).then_some(bytes)
    }
}

impl Variant {
    /// The DeviceClass selector: our driver, then every criterion.
    pub fn cel(&self) -> String {
        std::iter::once(format!("device.driver == {}", literal(DRIVER_NAME)))
            .chain(self.criteria.iter().map(Criterion::cel))
            .collect::<Vec<_>>()
            .join(" && ")
    }

    /// Whether a published device of `driver` is one this variant offers.
    pub fn matches(&self, driver: &str, device: &Device) -> bool {
        driver == DRIVER_NAME && self.criteria.iter().all(|c| c.matches(device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        assert_eq!(quantity_bytes("40Gi"), Some(40 << 30));
        assert_eq!(quantity_bytes("4864Mi"), Some(4864 << 20));
        assert_eq!(quantity_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(quantity_bytes("80G"), Some(80_000_000_000));
        assert_eq!(quantity_bytes("42949672960"), Some(42_949_672_960));
        for bad in ["", "Gi", "4x", "-1Gi", "1e9"] {
            assert_eq!(quantity_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn literals_cannot_end_the_string() {
        assert_eq!(literal(r"it's \ fine"), r"'it\'s \\ fine'");
    }
}
