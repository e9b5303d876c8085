//! Where a PCI function sits in the node's PCIe topology, as sysfs tells it.
//!
//! `<sysfs>/bus/pci/devices/<address>` is a link into the device tree, whose first component below
//! `devices/` names the root complex the function hangs from
//! (`../../../devices/pci0000:40/0000:40:01.0/0000:47:00.0`). Two devices under one root (a GPU and
//! a NIC) talk without crossing the CPU interconnect; the standard device attribute
//! `resource.kubernetes.io/pcieRoot` carries that root's name so a claim can ask for both together.

use std::path::Path;

/// Whether `name` is a PCI address as sysfs names functions: `dddd:bb:dd.f`, lower-case hex.
pub fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&b[11])
}

/// Whether `component` names a PCIe root complex: `pci` then `dddd:bb`.
fn is_root_name(component: &str) -> bool {
    component
        .strip_prefix("pci")
        .is_some_and(|rest| is_pci_address(&format!("{rest}:00.0")))
}

/// The PCIe root of the function at `pci_bus_id` (`0000:47:00.0`, any case, 4- or 8-digit domain),
/// as the link `<sysfs_root>/bus/pci/devices/<address>` names it (`pci0000:40`). `None` where sysfs
/// has no such link, or the link names no root (a virtual function's tree, a flat fake bus).
pub fn pcie_root(sysfs_root: &Path, pci_bus_id: &str) -> Option<String> {
    let address = crate::model::normalise_pci_bus_id(pci_bus_id);
    let target = std::fs::read_link(sysfs_root.join("bus/pci/devices").join(address)).ok()?;
    target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| is_root_name(c))
        .map(str::to_owned)
}

/// Sets each GPU's [`crate::Gpu::pcie_root`] from the links under `<sysfs_root>/bus/pci/devices`.
pub fn fill_roots(inventory: &mut crate::Inventory, sysfs_root: &Path) {
    for gpu in &mut inventory.gpus {
        gpu.pcie_root = pcie_root(sysfs_root, &gpu.pci_bus_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn addresses_are_recognised_as_sysfs_writes_them() {
        assert!(is_pci_address("0000:47:00.0"));
        assert!(is_pci_address("0001:0f:1f.7"));
        for not in [
            "0000:47:00.8",
            "0000:4G:00.0",
            "0000:47:00",
            ".roots",
            "0000:47:00.0x",
        ] {
            assert!(!is_pci_address(not), "{not}");
        }
        assert!(!is_pci_address("0000:0F:00.0"), "sysfs writes lower case");
    }

    #[test]
    fn the_root_is_the_link_targets_root_component() {
        let sysfs = tempfile::tempdir().unwrap();
        let bus = sysfs.path().join("bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        symlink(
            "../../../devices/pci0000:40/0000:40:01.0/0000:41:00.0/0000:47:00.0",
            bus.join("0000:47:00.0"),
        )
        .unwrap();
        symlink(
            "../../../devices/pci0001:c0/0001:c0:03.1/0001:cf:00.0",
            bus.join("0001:cf:00.0"),
        )
        .unwrap();
        std::fs::create_dir(bus.join("0000:07:00.0")).unwrap();
        assert_eq!(
            pcie_root(sysfs.path(), "00000000:47:00.0").as_deref(),
            Some("pci0000:40")
        );
        assert_eq!(
            pcie_root(sysfs.path(), "0001:CF:00.0").as_deref(),
            Some("pci0001:c0")
        );
        assert_eq!(pcie_root(sysfs.path(), "0000:07:00.0"), None, "not a link");
        assert_eq!(pcie_root(sysfs.path(), "0000:99:00.0"), None, "absent");
    }
}
