//! The node's PCI functions as sysfs lists them (`<sysfs>/bus/pci/devices/<address>/{vendor,device,class}`),
//! and which of them are NVIDIA GPUs, the way NFD's PCI source sees them.

use std::io;
use std::path::Path;

/// The PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR: u16 = 0x10de;
/// The PCI base class of display controllers (VGA `0300`, 3D `0302`, ...).
const DISPLAY_BASE_CLASS: u32 = 0x03;

/// One PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address (`0000:01:00.0`), the sysfs entry's name.
    pub address: String,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Class code: base class, subclass, programming interface (`0x030200`).
    pub class: u32,
}

impl PciFunction {
    /// Whether this is an NVIDIA GPU: an NVIDIA display controller of any subclass (what NFD
    /// labels `pci-10de.present` on a GPU node; NVIDIA's audio functions and switches are not).
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor == NVIDIA_VENDOR && self.class >> 16 == DISPLAY_BASE_CLASS
    }
}

/// Reads every PCI function under `<sysfs_root>/bus/pci/devices`, sorted by address. A node with
/// no PCI bus in sysfs has none; an entry not named like an address (`0000:01:00.0`) is no
/// function. An entry whose files cannot be read or parsed (a function being
/// removed, a malformed file) is left out and named in the second list; it never hides the others.
pub fn scan(sysfs_root: &Path) -> io::Result<(Vec<PciFunction>, Vec<String>)> {
    let dir = sysfs_root.join("bus/pci/devices");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    };
    let mut functions = Vec::new();
    let mut unreadable = Vec::new();
    for entry in entries {
        let entry = entry?;
        let address = entry.file_name().to_string_lossy().into_owned();
        if !gpu_discovery::pcie::is_pci_address(&address) {
            continue;
        }
        match read_function(&entry.path(), &address) {
            Ok(function) => functions.push(function),
            Err(why) => unreadable.push(format!("{address}: {why}")),
        }
    }
    functions.sort_by(|a, b| a.address.cmp(&b.address));
    unreadable.sort();
    Ok((functions, unreadable))
}

fn read_function(path: &Path, address: &str) -> Result<PciFunction, String> {
    let read = |file: &str| -> Result<u32, String> {
        let text = std::fs::read_to_string(path.join(file)).map_err(|e| format!("{file}: {e}"))?;
        parse_hex(&text).ok_or_else(|| format!("{file}: not a hex number: {:?}", text.trim()))
    };
    let vendor = read("vendor")?;
    let device = read("device")?;
    Ok(PciFunction {
        address: address.to_owned(),
        vendor: u16::try_from(vendor).map_err(|_| format!("vendor {vendor:#x} out of range"))?,
        device: u16::try_from(device).map_err(|_| format!("device {device:#x} out of range"))?,
        class: read("class")?,
    })
}

/// Parses a sysfs hex attribute (`0x10de\n`).
fn parse_hex(text: &str) -> Option<u32> {
    let text = text.trim();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    u32::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn function(root: &Path, address: &str, vendor: &str, device: &str, class: &str) {
        let dir = root.join("bus/pci/devices").join(address);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        fs::write(dir.join("device"), format!("{device}\n")).unwrap();
        fs::write(dir.join("class"), format!("{class}\n")).unwrap();
    }

    #[test]
    fn nvidia_display_and_3d_controllers_are_gpus_and_nothing_else_is() {
        let root = tempfile::tempdir().unwrap();
        function(root.path(), "0000:02:00.0", "0x10de", "0x2330", "0x030200"); // H100: 3D
        function(root.path(), "0000:01:00.0", "0x10de", "0x27b8", "0x030000"); // L4: VGA
        function(root.path(), "0000:01:00.1", "0x10de", "0x22ba", "0x040300"); // its audio
        function(root.path(), "0000:03:00.0", "0x10de", "0x22a3", "0x068000"); // NVSwitch
        function(root.path(), "0000:04:00.0", "0x8086", "0x1572", "0x020000"); // a NIC
        function(root.path(), "0000:05:00.0", "0x1af4", "0x1050", "0x030000"); // virtio-gpu
        let (functions, unreadable) = scan(root.path()).unwrap();
        assert!(unreadable.is_empty());
        let addresses: Vec<_> = functions.iter().map(|f| f.address.as_str()).collect();
        assert_eq!(
            addresses,
            [
                "0000:01:00.0",
                "0000:01:00.1",
                "0000:02:00.0",
                "0000:03:00.0",
                "0000:04:00.0",
                "0000:05:00.0"
            ]
        );
        let gpus: Vec<_> = functions
            .iter()
            .filter(|f| f.is_nvidia_gpu())
            .map(|f| (f.address.as_str(), f.device))
            .collect();
        assert_eq!(gpus, [("0000:01:00.0", 0x27b8), ("0000:02:00.0", 0x2330)]);
    }

    #[test]
    fn a_node_without_a_pci_bus_has_no_functions() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(scan(root.path()).unwrap(), (Vec::new(), Vec::new()));
    }

    #[test]
    fn a_malformed_entry_is_named_and_hides_nothing() {
        let root = tempfile::tempdir().unwrap();
        function(root.path(), "0000:01:00.0", "0x10de", "0x2330", "0x030200");
        function(root.path(), "0000:02:00.0", "nvidia", "0x2330", "0x030200");
        fs::create_dir_all(root.path().join("bus/pci/devices/0000:03:00.0")).unwrap();
        let (functions, unreadable) = scan(root.path()).unwrap();
        assert_eq!(functions.len(), 1);
        assert_eq!(unreadable.len(), 2);
        assert!(
            unreadable[0].starts_with("0000:02:00.0: vendor: not a hex number"),
            "{unreadable:?}"
        );
        assert!(
            unreadable[1].starts_with("0000:03:00.0: vendor:"),
            "{unreadable:?}"
        );
    }

    #[test]
    fn entries_not_named_like_addresses_are_no_functions() {
        let root = tempfile::tempdir().unwrap();
        function(root.path(), "0000:01:00.0", "0x10de", "0x2330", "0x030200");
        fs::create_dir_all(root.path().join("bus/pci/devices/.tree/pci0000:00")).unwrap();
        fs::write(root.path().join("bus/pci/devices/README"), "not a function").unwrap();
        let (functions, unreadable) = scan(root.path()).unwrap();
        assert_eq!(functions.len(), 1);
        assert!(unreadable.is_empty(), "{unreadable:?}");
    }

    #[test]
    fn sysfs_symlinks_are_followed() {
        let root = tempfile::tempdir().unwrap();
        let real = root
            .path()
            .join("devices/pci0000:00/0000:00:01.0/0000:01:00.0");
        fs::create_dir_all(&real).unwrap();
        for (file, value) in [
            ("vendor", "0x10de"),
            ("device", "0x2330"),
            ("class", "0x030200"),
        ] {
            fs::write(real.join(file), value).unwrap();
        }
        fs::create_dir_all(root.path().join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
            root.path().join("bus/pci/devices/0000:01:00.0"),
        )
        .unwrap();
        let (functions, _) = scan(root.path()).unwrap();
        assert!(functions[0].is_nvidia_gpu());
    }
}
