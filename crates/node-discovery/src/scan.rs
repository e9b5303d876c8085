//! One look at the node: its PCI bus, then (only where the bus shows an NVIDIA GPU) the driver
//! through NVML, loaded from the probed driver root. Blocking file and NVML I/O.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpu_discovery::{InitMode, Inventory, NvmlSession, ProbeSettings, root};

use crate::{labels, pci};

/// Where to look.
#[derive(Debug, Clone)]
pub struct Scanner {
    /// The host's sysfs as this container sees it.
    pub sysfs_root: PathBuf,
    /// Where the driver may be.
    pub probe: ProbeSettings,
    /// The last inventory NVML gave, kept while NVML fails but the driver is still there, so a
    /// driver hiccup does not strip the node's labels (and with them its plane rules).
    last_driver: Option<Inventory>,
}

/// What one scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// The labels the node should carry.
    pub labels: BTreeMap<String, String>,
    /// NVIDIA GPUs on the PCI bus.
    pub gpus_on_bus: usize,
    /// What went wrong, if anything (the labels then keep what could be found).
    pub problems: Vec<String>,
}

impl Scanner {
    /// A scanner of these roots.
    pub fn new(sysfs_root: PathBuf, probe: ProbeSettings) -> Self {
        Self {
            sysfs_root,
            probe,
            last_driver: None,
        }
    }

    /// Scans once.
    pub fn scan(&mut self) -> Scan {
        let mut problems = Vec::new();
        let functions = match pci::scan(&self.sysfs_root) {
            Ok((functions, unreadable)) => {
                problems.extend(unreadable.into_iter().map(|u| format!("PCI function {u}")));
                functions
            }
            Err(e) => {
                problems.push(format!("PCI bus: {e}"));
                Vec::new()
            }
        };
        let gpus_on_bus = functions.iter().filter(|f| f.is_nvidia_gpu()).count();
        if gpus_on_bus == 0 {
            self.last_driver = None;
        } else {
            self.read_driver(&mut problems);
        }
        Scan {
            labels: labels::desired(&functions, self.last_driver.as_ref()),
            gpus_on_bus,
            problems,
        }
    }

    fn read_driver(&mut self, problems: &mut Vec<String>) {
        let found = match root::probe(&self.probe) {
            Ok(found) => found,
            Err(_) => {
                // No driver installed (yet): GPU feature discovery's labels wait for one.
                self.last_driver = None;
                return;
            }
        };
        match NvmlSession::open(&found.nvml_library, InitMode::Full)
            .and_then(|nvml| nvml.inventory())
        {
            Ok(inventory) => self.last_driver = Some(inventory),
            Err(e) => problems.push(format!("NVML: {e}")),
        }
    }
}
