//! A reader polling `driver-ready` while it is rewritten sees one whole version or the other.

use gpu_discovery::DriverReady;
use std::sync::atomic::{AtomicBool, Ordering};

fn host() -> DriverReady {
    DriverReady {
        is_host_driver: true,
        paths: gpu_discovery::DriverPaths {
            driver_root: "/".into(),
            driver_root_ctr: "/host".into(),
            dev_root: "/".into(),
            dev_root_ctr: "/host".into(),
        },
    }
}

fn container() -> DriverReady {
    DriverReady {
        is_host_driver: false,
        paths: gpu_discovery::DriverPaths {
            driver_root: "/run/nvidia/driver/with/a/much/longer/path/than/the/host/one".into(),
            driver_root_ctr: "/driver-root".into(),
            dev_root: "/run/nvidia/driver/with/a/much/longer/path/than/the/host/one".into(),
            dev_root_ctr: "/driver-root".into(),
        },
    }
}

#[test]
fn a_polling_reader_never_sees_a_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("driver-ready");
    host().write(&path).unwrap();
    let done = AtomicBool::new(false);
    let (reads, versions) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut reads, mut seen) = (0u32, [false; 2]);
            while !done.load(Ordering::Acquire) {
                let got = DriverReady::read(&path).unwrap_or_else(|e| panic!("read {reads}: {e}"));
                assert!(
                    got == host() || got == container(),
                    "partial or mixed file: {got:?}"
                );
                seen[usize::from(got == container())] = true;
                reads += 1;
            }
            (reads, seen)
        });
        for i in 0..400 {
            let next = if i % 2 == 0 { container() } else { host() };
            next.write(&path).unwrap();
        }
        done.store(true, Ordering::Release);
        reader.join().unwrap()
    });
    assert!(reads > 0);
    assert!(versions.iter().any(|v| *v));
}
