//! The library's process-wide state: the init reference count, the session a successful init
//! builds, event sets, and the control file that can change faults while a session is open.

use crate::config::{self, Config, EccKind, Faults, InitFault};
use crate::handles::Handle;
use crate::partitioning::Step;
use crate::profile::{self, MigSupport};
use crate::settings::{MigRecord, Stamp, Store, stamp};
use crate::topology::{Gpu, MigDevice, Topology};
use nvml_wrapper_sys::bindings::*;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An NVML return code.
pub type Ret = nvmlReturn_t;

/// How often a waiting `nvmlEventSetWait` re-reads the control file.
const CONTROL_POLL: Duration = Duration::from_millis(20);

static STATE: Mutex<Global> = Mutex::new(Global {
    refcount: 0,
    session: None,
});
static EVENTS: Condvar = Condvar::new();

#[derive(Debug)]
struct Global {
    refcount: u32,
    session: Option<Session>,
}

/// What one init builds: the topology, the faults in force, and the event sets.
#[derive(Debug)]
pub struct Session {
    /// GPUs and MIG devices served.
    pub topology: Topology,
    lost: Vec<u32>,
    pending: VecDeque<Event>,
    event_sets: HashMap<u32, Vec<(u32, u64)>>,
    next_set: u32,
    control: Option<(PathBuf, Option<Stamp>)>,
    /// The GPUs' compute mode, time-slice and MIG state, kept across processes.
    pub settings: Store,
    /// The settings file's stamp when the MIG state was last read from it.
    mig_seen: Option<Option<Stamp>>,
    /// Partitioning steps made to fail.
    mig_failures: Vec<Step>,
    /// A partitioning step made to hang.
    mig_stall: Option<Step>,
}

/// A queued device event, as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Index of the GPU that raised it.
    pub gpu: u32,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// The event's data (the XID number for XID events).
    pub data: u64,
}

/// A device handle resolved against the session.
#[derive(Debug, Clone, Copy)]
pub enum Device<'a> {
    /// A physical GPU.
    Gpu(&'a Gpu),
    /// A MIG device and its parent.
    Mig(&'a Gpu, &'a MigDevice),
}

impl<'a> Device<'a> {
    /// The physical GPU behind the handle.
    pub fn gpu(self) -> &'a Gpu {
        match self {
            Device::Gpu(g) | Device::Mig(g, _) => g,
        }
    }
}

/// `nvmlInit*`: the first call builds a session from the configuration, later calls count.
pub fn init() -> Ret {
    init_using(open_session)
}

/// `init` with a given configuration and no control file, for in-process tests.
#[cfg(test)]
pub fn init_with(config: Config) -> Ret {
    init_using(|| session_from(config, None, Store::default()))
}

fn init_using(open: impl FnOnce() -> Result<Session, Ret>) -> Ret {
    let mut global = lock();
    if global.refcount > 0 {
        global.refcount += 1;
        return nvmlReturn_enum_NVML_SUCCESS;
    }
    match open() {
        Ok(session) => {
            global.session = Some(session);
            global.refcount = 1;
            nvmlReturn_enum_NVML_SUCCESS
        }
        Err(ret) => ret,
    }
}

/// `nvmlShutdown`: the last call drops the session.
pub fn shutdown() -> Ret {
    let mut global = lock();
    if global.refcount == 0 {
        return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    global.refcount -= 1;
    if global.refcount == 0 {
        global.session = None;
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// Runs `f` on the open session, after picking up control-file changes.
pub fn with_session<T>(f: impl FnOnce(&mut Session) -> Result<T, Ret>) -> Result<T, Ret> {
    let mut global = lock();
    let session = global
        .session
        .as_mut()
        .ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    session.refresh();
    f(session)
}

/// `nvmlEventSetWait`: the next queued event for a device registered in `set`, waiting up to
/// `timeout_ms`.
pub fn wait_event(set: u32, timeout_ms: u32) -> Result<(Handle, Event), Ret> {
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    let mut global = lock();
    loop {
        let session = global
            .session
            .as_mut()
            .ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
        session.refresh();
        if let Some(found) = session.take_event(set)? {
            return Ok(found);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT);
        }
        let slice = CONTROL_POLL.min(deadline - now);
        global = EVENTS
            .wait_timeout(global, slice)
            .map_or_else(|p| p.into_inner().0, |r| r.0);
    }
}

/// Hangs while the control file makes `step` stall (re-read every [`CONTROL_POLL`], five minutes
/// at most), without holding the library's lock.
pub fn wait_out_stall(step: Step) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let stalled = with_session(|s| Ok(s.mig_stall == Some(step))).unwrap_or(false);
        if !stalled {
            return;
        }
        std::thread::sleep(CONTROL_POLL);
    }
}

/// Wakes event waiters after a registration or a new event.
pub fn notify_events() {
    EVENTS.notify_all();
}

fn lock() -> MutexGuard<'static, Global> {
    // A panic while holding the lock cannot leave the state half-written in a way later calls
    // trip over, so a poisoned lock is used as is.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

fn open_session() -> Result<Session, Ret> {
    let control = control_path();
    let cfg = read_config(control.as_deref()).map_err(|e| complain(&e))?;
    session_from(cfg, control, Store::for_library(own_file().as_deref()))
}

fn session_from(cfg: Config, control: Option<PathBuf>, settings: Store) -> Result<Session, Ret> {
    if let Some(fault) = cfg.faults.init_error {
        return Err(match fault {
            InitFault::DriverNotLoaded => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
            InitFault::VersionMismatch => nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            InitFault::NoPermission => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        });
    }
    let reference = cfg
        .profile
        .clone()
        .unwrap_or_else(|| profile::DEFAULT_PROFILE.to_owned());
    let mut profile = profile::load(&reference).map_err(|e| complain(&e))?;
    if let Some(version) = &cfg.driver_version {
        profile.driver_version.clone_from(version);
    }
    let count = cfg.gpu_count.unwrap_or(profile.default_gpu_count);
    let mut topology = Topology::build(profile, count).map_err(|e| complain(&e))?;
    if let Some(dir) = &cfg.visible_dev_dir {
        topology.keep_visible(|minor| Path::new(dir).join(format!("nvidia{minor}")).exists());
    }
    let mut session = Session {
        topology,
        lost: Vec::new(),
        pending: VecDeque::new(),
        event_sets: HashMap::new(),
        next_set: 1,
        control: control.map(|p| {
            let stamp = stamp(&p);
            (p, stamp)
        }),
        settings,
        mig_seen: None,
        mig_failures: Vec::new(),
        mig_stall: None,
    };
    session.apply_faults(cfg.faults);
    session.reload_mig();
    Ok(session)
}

/// A configuration problem is the mock's user's mistake: say it on stderr, answer like a broken
/// driver would.
fn complain(message: &str) -> Ret {
    eprintln!("mock-nvml: {message}");
    nvmlReturn_enum_NVML_ERROR_UNKNOWN
}

fn read_config(path: Option<&Path>) -> Result<Config, String> {
    let base = match path {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(text) => Config::parse(&text).map_err(|e| format!("{}: {e}", p.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => embedded_config()?,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        },
        None => Config::default(),
    };
    base.apply_env(|k| std::env::var(k).ok())
}

/// The control file appended to the loaded library file, or the defaults when there is none.
fn embedded_config() -> Result<Config, String> {
    use std::io::{Read, Seek, SeekFrom};
    let Some(lib) = own_file() else {
        return Ok(Config::default());
    };
    let mut tail = Vec::new();
    let read = std::fs::File::open(&lib).and_then(|mut f| {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(config::EMBEDDED_MAX)))?;
        f.read_to_end(&mut tail)
    });
    if read.is_err() {
        return Ok(Config::default());
    }
    match config::embedded(&tail) {
        Some(text) => Config::parse(text).map_err(|e| format!("{} (embedded): {e}", lib.display())),
        None => Ok(Config::default()),
    }
}

/// `$MOCK_NVML_CONFIG`, else `mock-nvml.json` beside the loaded library file.
fn control_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(config::CONFIG_ENV) {
        return Some(PathBuf::from(p));
    }
    own_file().and_then(|f| f.parent().map(|d| d.join(config::SIDECAR_NAME)))
}

/// The file this code was loaded from, found in `/proc/self/maps` by one of its own addresses.
fn own_file() -> Option<PathBuf> {
    let address = own_file as fn() -> Option<PathBuf> as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| mapping_path(line, address))
}

fn mapping_path(line: &str, address: usize) -> Option<PathBuf> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let path = fields.nth(4)?;
    (start <= address && address < end && path.starts_with('/')).then(|| PathBuf::from(path))
}

impl Session {
    /// Resolves a device handle; lost GPUs answer `NVML_ERROR_GPU_IS_LOST`.
    pub fn device(&self, handle: usize) -> Result<Device<'_>, Ret> {
        let device = match Handle::decode(handle) {
            Some(Handle::Gpu(i)) => self.topology.gpu(i).map(Device::Gpu),
            Some(Handle::Mig { gpu, slot }) => self
                .topology
                .gpu(gpu)
                .and_then(|g| g.migs.get(slot as usize).map(|m| Device::Mig(g, m))),
            _ => None,
        }
        .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        self.check_alive(device.gpu().index)?;
        Ok(device)
    }

    /// Fails with `NVML_ERROR_GPU_IS_LOST` for a GPU marked lost.
    pub fn check_alive(&self, index: u32) -> Result<(), Ret> {
        if self.lost.contains(&index) {
            Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
        } else {
            Ok(())
        }
    }

    /// Creates an empty event set.
    pub fn create_event_set(&mut self) -> u32 {
        let n = self.next_set;
        self.next_set += 1;
        self.event_sets.insert(n, Vec::new());
        n
    }

    /// Registers `types` of the GPU with this index in event set `set`.
    pub fn register(&mut self, set: u32, gpu: u32, types: u64) -> Result<(), Ret> {
        let regs = self
            .event_sets
            .get_mut(&set)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        regs.push((gpu, types));
        Ok(())
    }

    /// Frees an event set.
    pub fn free_event_set(&mut self, set: u32) -> Result<(), Ret> {
        self.event_sets
            .remove(&set)
            .map(drop)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
    }

    fn take_event(&mut self, set: u32) -> Result<Option<(Handle, Event)>, Ret> {
        let regs = self
            .event_sets
            .get(&set)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        let wanted = |e: &Event| {
            regs.iter()
                .any(|(gpu, types)| *gpu == e.gpu && types & e.event_type != 0)
        };
        Ok(self
            .pending
            .iter()
            .position(wanted)
            .and_then(|at| self.pending.remove(at))
            .map(|e| (Handle::Gpu(e.gpu), e)))
    }

    /// Changes the MIG state of the GPU with NVML index `index` by `change`, from the state the
    /// settings file holds now, and keeps the result there; a fault injected into `step` fails it
    /// with `NVML_ERROR_UNKNOWN` and changes nothing.
    pub fn partition<T>(
        &mut self,
        index: u32,
        step: Step,
        change: impl FnOnce(&MigSupport, &mut MigRecord) -> Result<T, Ret>,
    ) -> Result<T, Ret> {
        self.check_alive(index)?;
        let support = self
            .topology
            .mig_support()
            .ok_or(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)?
            .clone();
        let gpu = self
            .topology
            .gpu(index)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        if self.mig_failures.contains(&step) {
            return Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN);
        }
        let uuid = gpu.uuid.clone();
        let mut outcome = Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN);
        let mut changed = None;
        self.settings
            .update(&uuid, |settings| {
                let mut record = settings
                    .mig
                    .clone()
                    .unwrap_or_else(|| crate::topology::initial_mig(&support));
                outcome = change(&support, &mut record);
                if outcome.is_ok() {
                    settings.mig = Some(record.clone());
                    changed = Some(record);
                }
            })
            .map_err(|_| nvmlReturn_enum_NVML_ERROR_NO_PERMISSION)?;
        if let Some(record) = changed {
            self.topology.set_mig(index, Some(record));
            self.mig_seen = Some(self.settings.stamp());
        }
        outcome
    }

    /// Reads the GPUs' MIG state again when another process changed the settings file.
    fn reload_mig(&mut self) {
        let now = self.settings.stamp();
        if self.mig_seen == Some(now) {
            return;
        }
        for index in 0..self.topology.gpus.len() as u32 {
            let record = self
                .settings
                .get(&self.topology.gpus[index as usize].uuid)
                .mig;
            self.topology.set_mig(index, record);
        }
        self.mig_seen = Some(now);
    }

    fn apply_faults(&mut self, faults: Faults) {
        self.mig_failures = faults.mig_failures;
        self.mig_stall = faults.mig_stall;
        self.lost = faults.lost_gpus;
        let xids = faults.xid_events.iter().map(|x| Event {
            gpu: x.gpu,
            event_type: u64::from(nvmlEventTypeXidCriticalError),
            data: x.xid,
        });
        let eccs = faults.ecc_events.iter().map(|e| Event {
            gpu: e.gpu,
            event_type: u64::from(match e.kind {
                EccKind::SingleBit => nvmlEventTypeSingleBitEccError,
                EccKind::DoubleBit => nvmlEventTypeDoubleBitEccError,
            }),
            data: 0,
        });
        self.pending = xids.chain(eccs).collect();
        EVENTS.notify_all();
    }

    /// Re-reads the control file and the GPUs' MIG state when they changed since the last look.
    fn refresh(&mut self) {
        self.reload_mig();
        let Some((path, seen)) = &self.control else {
            return;
        };
        let now = stamp(path);
        if now == *seen {
            return;
        }
        let path = path.clone();
        match read_config(Some(&path)) {
            Ok(cfg) => {
                self.control = Some((path, now));
                self.apply_faults(cfg.faults);
            }
            // A half-written control file is read again on the next call.
            Err(e) => eprintln!("mock-nvml: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_is_matched_by_address() {
        let line =
            "7f0000001000-7f0000002000 r-xp 00001000 08:01 1234  /tmp/root/libnvidia-ml.so.1";
        assert_eq!(
            mapping_path(line, 0x7f00_0000_1800),
            Some(PathBuf::from("/tmp/root/libnvidia-ml.so.1"))
        );
        assert_eq!(mapping_path(line, 0x7f00_0000_2000), None);
        assert_eq!(
            mapping_path("7f00-7f10 rw-p 00000000 00:00 0 ", 0x7f01),
            None
        );
    }
}
