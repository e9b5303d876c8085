//! Time of the driver probe with a driver present: the filesystem search alone, and the whole
//! validator `driver` path (probe, NVML open from the root, driver version and device count,
//! atomic `driver-ready` write).

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_discovery::testing::{FakeNode, mock_config};
use gpu_discovery::{DriverReady, InitMode, NvmlSession, root};
use std::hint::black_box;

fn probe(c: &mut Criterion) {
    let host = FakeNode::new();
    host.install_host_driver(&mock_config("a100-sxm4-40gb", 8));
    let container = FakeNode::new();
    container.install_container_driver(&mock_config("a100-sxm4-40gb", 8), true);

    c.bench_function("probe/host-driver", |b| {
        b.iter(|| root::probe(black_box(&host.settings())).unwrap())
    });
    c.bench_function("probe/container-driver", |b| {
        b.iter(|| root::probe(black_box(&container.settings())).unwrap())
    });
    let ready = host.status_dir().join("driver-ready");
    c.bench_function("validate/host-driver-8-gpus", |b| {
        b.iter(|| {
            let found = root::probe(&host.settings()).unwrap();
            let session = NvmlSession::open(&found.nvml_library, InitMode::Full).unwrap();
            black_box((
                session.driver_version().unwrap(),
                session.device_count().unwrap(),
            ));
            DriverReady::from(&found).write(&ready).unwrap();
        })
    });
}

criterion_group!(benches, probe);
criterion_main!(benches);
