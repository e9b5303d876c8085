//! Consumable shares of whole GPUs and MIG devices (`CONSUMABLE_SHARES`, the upstream driver's
//! `--consumable-shares`): the device is published with `allowMultipleAllocations`, and its
//! capacities say what each claim consumes, so the scheduler decides how many claims one device
//! takes. Pure: the mode, and what it does to a device's capacities.
//!
//! As upstream, `memory` is rounded down to a whole MiB and consumed in MiB steps, and a number
//! of shares adds a `shares` capacity. Unlike upstream, a claim asking for no `shares` takes all of
//! them (upstream: one), so a claim written for a whole GPU never lands on a GPU others share, and
//! shares never land on a GPU a whole claim holds; `memory` mode works that way upstream too.

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const MIB: u64 = 1 << 20;

/// How whole GPUs and MIG devices are shared between claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConsumableShares {
    /// One claim per device (the default).
    #[default]
    Disabled,
    /// Claims consume the device's `memory`; a claim asking for none takes all of it.
    Memory,
    /// Any number of claims; `memory` may be asked for, none by default.
    Unlimited,
    /// This many `shares` per device; a claim asking for none takes all of them.
    Shares(u32),
}

impl std::str::FromStr for ConsumableShares {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "disabled" => Ok(Self::Disabled),
            "memory" => Ok(Self::Memory),
            "unlimited" => Ok(Self::Unlimited),
            other => other
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .map(Self::Shares)
                .ok_or_else(|| {
                    format!("{text:?}: expected disabled, memory, unlimited or a positive number of shares")
                }),
        }
    }
}

fn mib(bytes: u64) -> Quantity {
    Quantity(format!("{}Mi", bytes / MIB))
}

fn policy(
    default: Quantity,
    min: Quantity,
    max: Quantity,
    step: Quantity,
) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(default),
        valid_range: Some(CapacityRequestPolicyRange {
            min,
            max: Some(max),
            step: Some(step),
        }),
        valid_values: None,
    }
}

/// Offers `device` (a whole GPU or a MIG device with `memory_bytes` of memory) to several claims
/// as `mode` says; nothing for `Disabled`.
pub fn offer(device: &mut Device, memory_bytes: Option<u64>, mode: ConsumableShares) {
    if mode == ConsumableShares::Disabled {
        return;
    }
    device.allow_multiple_allocations = Some(true);
    let Some(bytes) = memory_bytes.map(|b| b / MIB * MIB) else {
        return;
    };
    let capacity = device.capacity.get_or_insert_default();
    let memory = match mode {
        ConsumableShares::Memory => policy(mib(bytes), mib(MIB), mib(bytes), mib(MIB)),
        _ => policy(
            Quantity("0".into()),
            Quantity("0".into()),
            mib(bytes),
            mib(MIB),
        ),
    };
    capacity.insert(
        "memory".into(),
        DeviceCapacity {
            value: mib(bytes),
            request_policy: Some(memory),
        },
    );
    if let ConsumableShares::Shares(n) = mode {
        let n = Quantity(n.to_string());
        capacity.insert(
            "shares".into(),
            DeviceCapacity {
                value: n.clone(),
                request_policy: Some(policy(
                    n.clone(),
                    Quantity("1".into()),
                    n,
                    Quantity("1".into()),
                )),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_values_parse_and_others_are_named() {
        assert_eq!("disabled".parse(), Ok(ConsumableShares::Disabled));
        assert_eq!("".parse(), Ok(ConsumableShares::Disabled));
        assert_eq!("Memory".parse(), Ok(ConsumableShares::Memory));
        assert_eq!("unlimited".parse(), Ok(ConsumableShares::Unlimited));
        assert_eq!("4".parse(), Ok(ConsumableShares::Shares(4)));
        for bad in ["0", "-2", "lots"] {
            let err = bad.parse::<ConsumableShares>().unwrap_err();
            assert!(err.contains("positive number of shares"), "{err}");
        }
    }

    fn offered(mode: ConsumableShares) -> Device {
        let mut device = Device::default();
        // 80 GiB and a half MiB: rounded down to whole MiB.
        offer(&mut device, Some(80 * 1024 * MIB + MIB / 2), mode);
        device
    }

    fn range(d: &Device, name: &str) -> (String, String, String, String) {
        let c = &d.capacity.as_ref().unwrap()[name];
        let p = c.request_policy.as_ref().unwrap();
        let r = p.valid_range.as_ref().unwrap();
        (
            c.value.0.clone(),
            p.default.as_ref().unwrap().0.clone(),
            r.min.0.clone(),
            r.step.as_ref().unwrap().0.clone(),
        )
    }

    #[test]
    fn each_mode_publishes_what_claims_consume() {
        assert_eq!(offered(ConsumableShares::Disabled), Device::default());
        let memory = offered(ConsumableShares::Memory);
        assert_eq!(memory.allow_multiple_allocations, Some(true));
        let whole = (
            "81920Mi".into(),
            "81920Mi".into(),
            "1Mi".into(),
            "1Mi".into(),
        );
        assert_eq!(range(&memory, "memory"), whole);
        let unlimited = offered(ConsumableShares::Unlimited);
        let free = ("81920Mi".into(), "0".into(), "0".into(), "1Mi".into());
        assert_eq!(range(&unlimited, "memory"), free);
        assert!(!unlimited.capacity.as_ref().unwrap().contains_key("shares"));
        let shares = offered(ConsumableShares::Shares(4));
        assert_eq!(range(&shares, "memory"), free);
        let all = ("4".into(), "4".into(), "1".into(), "1".into());
        assert_eq!(
            range(&shares, "shares"),
            all,
            "a claim asking for none takes all"
        );
    }

    #[test]
    fn a_device_without_memory_is_only_made_multi_allocatable() {
        let mut device = Device::default();
        offer(&mut device, None, ConsumableShares::Shares(2));
        assert_eq!(device.allow_multiple_allocations, Some(true));
        assert!(device.capacity.is_none());
    }
}
