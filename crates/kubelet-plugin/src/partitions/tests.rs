//! The counter model checked against the MIG profile tables of the GPU models served.
//!
//! Source of the tables: NVIDIA's MIG User Guide, "Supported MIG Profiles"
//! (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): profile names,
//! instance counts and memory fractions per model; the placements are the ones
//! `nvidia-smi mig -lgipp` lists (the guide's getting-started page prints them for A100 and H100),
//! the same on every model here: 1g {0..6}:1, 1g+me {0..6}:1, 1g double memory {0,2,4,6}:2,
//! 2g {0,2,4}:2, 3g {0,4}:4, 4g {0}:4, 7g {0}:8. Profile ids are `nvidia-smi mig -lgip`'s.

use super::*;
use gpu_discovery::{CudaVersion, MigProfile};

/// One row of a model's table: profile id, name, compute slices, instances, placement size,
/// placement starts.
type Row = (u32, &'static str, u32, u32, u32, &'static [u32]);

/// The table shape every served model shares, with its names (1g, 1g+me, 1g double memory, 2g,
/// 3g, 4g, 7g).
fn table(names: [&'static str; 7]) -> Vec<Row> {
    vec![
        (19, names[0], 1, 7, 1, &[0, 1, 2, 3, 4, 5, 6]),
        (20, names[1], 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
        (15, names[2], 1, 4, 2, &[0, 2, 4, 6]),
        (14, names[3], 2, 3, 2, &[0, 2, 4]),
        (9, names[4], 3, 2, 4, &[0, 4]),
        (5, names[5], 4, 1, 4, &[0]),
        (0, names[6], 7, 1, 8, &[0]),
    ]
}

/// The models served, with their architecture and table.
fn models() -> Vec<(&'static str, &'static str, Vec<Row>)> {
    vec![
        (
            "A100-SXM4-40GB",
            "Ampere",
            table([
                "1g.5gb",
                "1g.5gb+me",
                "1g.10gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb",
            ]),
        ),
        (
            "A100-SXM4-80GB",
            "Ampere",
            table([
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
            ]),
        ),
        (
            "H100 80GB HBM3",
            "Hopper",
            table([
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
            ]),
        ),
        (
            "H200",
            "Hopper",
            table([
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb",
            ]),
        ),
        (
            "B200",
            "Blackwell",
            table([
                "1g.23gb",
                "1g.23gb+me",
                "1g.45gb",
                "2g.45gb",
                "3g.90gb",
                "4g.90gb",
                "7g.180gb",
            ]),
        ),
        (
            "GB200",
            "Blackwell",
            table([
                "1g.23gb",
                "1g.23gb+me",
                "1g.47gb",
                "2g.47gb",
                "3g.93gb",
                "4g.93gb",
                "7g.186gb",
            ]),
        ),
    ]
}

fn gpu(product: &str, architecture: &str, rows: &[Row], mig_mode: MigMode) -> Gpu {
    Gpu {
        index: 0,
        minor: 0,
        uuid: "GPU-0".into(),
        product_name: format!("NVIDIA {product}"),
        brand: "Nvidia".into(),
        architecture: architecture.into(),
        cuda_compute_capability: CudaVersion { major: 9, minor: 0 },
        memory_bytes: Some(80 << 30),
        pci_bus_id: "0000:07:00.0".into(),
        pcie_root: None,
        addressing_mode: None,
        mig_mode,
        mig_devices: Vec::new(),
        mig_profiles: rows
            .iter()
            .map(|&(id, name, slices, instances, size, starts)| MigProfile {
                index: 0,
                id,
                name: name.into(),
                slices,
                instances,
                memory_bytes: u64::from(size) * (10 << 30),
                multiprocessors: slices * 16,
                copy_engines: slices,
                decoders: slices,
                encoders: 0,
                jpeg_engines: slices,
                ofa_engines: u32::from(name.ends_with("+me")),
                placements: starts
                    .iter()
                    .map(|&start| MigPlacement { start, size })
                    .collect(),
            })
            .collect(),
    }
}

fn partition(device: &NodeDevice) -> &Partition {
    match &device.kind {
        crate::devices::DeviceKind::Partition(p) => p,
        other => panic!("{} is no partition: {other:?}", device.name),
    }
}

/// Whether the devices drawing `uses` all fit the counters at once.
fn fit(counters: &GpuCounters, uses: &[BTreeMap<String, u64>]) -> bool {
    counters
        .capacities()
        .iter()
        .all(|(name, capacity)| uses.iter().filter_map(|u| u.get(name)).sum::<u64>() <= *capacity)
}

/// MIG's own rule for two GPU instances: no shared memory slice, and a profile with one
/// instance allowed never twice.
fn nvml_allows(a: &Partition, b: &Partition) -> bool {
    let same_single = a.profile.name == b.profile.name && a.profile.instances < 2;
    !a.placement.overlaps(b.placement) && !same_single
}

#[test]
fn every_model_offers_each_profile_at_each_placement_and_its_whole_card() {
    for (product, arch, rows) in models() {
        let mode = if arch == "Ampere" {
            MigMode::Enabled
        } else {
            MigMode::Disabled
        };
        let offer = offer(&gpu(product, arch, &rows, mode), &BTreeSet::new());
        assert_eq!(offer.partitions.len(), 25, "{product}: 7+7+4+3+2+1+1");
        let names: BTreeSet<String> = offer.partitions.iter().map(|d| d.name.clone()).collect();
        assert_eq!(names.len(), 25, "{product}: names are unique");
        let three = format!("gpu-0-mig-{}-9-4", profile_slug(rows[4].1));
        assert!(names.contains(&three), "{product}: {three}");
        assert!(
            offer.partitions.iter().all(|d| d.uuid.is_empty()),
            "not made yet"
        );
        assert_eq!(
            offer.whole.is_some(),
            arch != "Ampere",
            "{product}: an Ampere GPU with MIG on cannot be given whole without a reset"
        );
    }
}

#[test]
fn counters_allow_two_partitions_exactly_when_mig_does_and_the_card_excludes_them_all() {
    for (product, arch, rows) in models() {
        let offer = offer(
            &gpu(product, arch, &rows, MigMode::Enabled),
            &BTreeSet::new(),
        );
        let parts: Vec<&Partition> = offer.partitions.iter().map(partition).collect();
        let counters = gpu_counters(parts.iter().copied());
        assert_eq!(counters.memory_slices, 8, "{product}");
        assert_eq!(
            counters.limited.keys().collect::<Vec<_>>(),
            vec![rows[1].1],
            "{product}: only the +me profile's instance count binds"
        );
        assert!(counters.capacities().len() <= 32, "API limit per set");
        for a in &parts {
            assert!(
                !fit(&counters, &[counters.whole(), counters.partition(a)]),
                "{product}: the card and {:?}",
                a.placement
            );
            for b in &parts {
                if std::ptr::eq(*a, *b) {
                    continue;
                }
                assert_eq!(
                    fit(&counters, &[counters.partition(a), counters.partition(b)]),
                    nvml_allows(a, b),
                    "{product}: {}@{} with {}@{}",
                    a.profile.name,
                    a.placement.start,
                    b.profile.name,
                    b.placement.start
                );
            }
        }
        assert!(fit(&counters, &[counters.whole()]));
    }
}

/// The partition of `profile` (by row) at `start` among `parts`.
fn at<'a>(parts: &[&'a Partition], rows: &[Row], row: usize, start: u32) -> &'a Partition {
    parts
        .iter()
        .find(|p| p.profile.name == rows[row].1 && p.placement.start == start)
        .copied()
        .unwrap()
}

#[test]
fn the_guides_example_layouts_fit_and_an_eighth_slice_does_not() {
    let (product, arch, rows) = models().remove(2);
    let offer = offer(
        &gpu(product, arch, &rows, MigMode::Disabled),
        &BTreeSet::new(),
    );
    let parts: Vec<&Partition> = offer.partitions.iter().map(partition).collect();
    let counters = gpu_counters(parts.iter().copied());
    let uses = |layout: &[(usize, u32)]| -> Vec<BTreeMap<String, u64>> {
        layout
            .iter()
            .map(|&(row, start)| counters.partition(at(&parts, &rows, row, start)))
            .collect()
    };
    // 4g + 2g + 1g, 3g + 3g, seven 1g, 1g+me beside six 1g: layouts the guide lists.
    for layout in [
        vec![(5, 0), (3, 4), (0, 6)],
        vec![(4, 0), (4, 4)],
        (0..7).map(|s| (0, s)).collect(),
        vec![(1, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6)],
    ] {
        assert!(fit(&counters, &uses(&layout)), "{layout:?}");
    }
    // A 3g at 4 with a 1g inside it; a second +me; the 7g beside anything.
    for layout in [
        vec![(4, 4), (0, 5)],
        vec![(1, 0), (1, 3)],
        vec![(6, 0), (0, 0)],
    ] {
        assert!(!fit(&counters, &uses(&layout)), "{layout:?}");
    }
}

#[test]
fn mig_devices_made_by_someone_else_stay_and_block_what_overlaps_them() {
    let (product, arch, rows) = models().remove(2);
    let mut g = gpu(product, arch, &rows, MigMode::Enabled);
    let theirs = gpu_discovery::MigDevice {
        parent_uuid: "GPU-0".into(),
        parent_minor: 0,
        index: 0,
        uuid: "MIG-theirs".into(),
        profile: "3g.40gb".into(),
        gpu_instance_profile_id: 9,
        gpu_instance_id: 2,
        compute_instance_id: 0,
        placement_start: 4,
        placement_size: 4,
        slices: 3,
        memory_bytes: 40 << 30,
        multiprocessors: 60,
        copy_engines: 3,
        decoders: 3,
        encoders: 0,
        jpeg_engines: 3,
        ofa_engines: 0,
    };
    let mine = gpu_discovery::MigDevice {
        uuid: "MIG-mine".into(),
        profile: "1g.10gb".into(),
        gpu_instance_profile_id: 19,
        gpu_instance_id: 7,
        placement_start: 0,
        placement_size: 1,
        ..theirs.clone()
    };
    g.mig_devices = vec![theirs, mine];
    let offer = offer(&g, &BTreeSet::from([7]));
    assert_eq!(offer.existing.len(), 1);
    assert_eq!(offer.existing[0].uuid, "MIG-theirs");
    assert!(
        offer.whole.is_none(),
        "the card is not whole while theirs is on it"
    );
    assert!(
        offer
            .partitions
            .iter()
            .all(|d| partition(d).placement.start + partition(d).placement.size <= 4),
        "nothing overlaps slices 4-7"
    );
    assert!(
        offer
            .partitions
            .iter()
            .any(|d| d.name == "gpu-0-mig-1g10gb-19-0"),
        "the plugin's own 1g at 0 stays a partition"
    );
    assert!(offer.note.unwrap().contains("not made by this plugin"));
}

#[test]
fn an_ampere_gpu_with_mig_off_and_a_gpu_without_mig_are_offered_whole() {
    let (product, arch, rows) = models().remove(0);
    let offer = offer(
        &gpu(product, arch, &rows, MigMode::Disabled),
        &BTreeSet::new(),
    );
    assert!(offer.partitions.is_empty() && offer.whole.is_some());
    assert!(offer.note.unwrap().contains("only with a GPU reset"));
    let mut l4 = gpu("L4", "Ada Lovelace", &[], MigMode::NotSupported);
    l4.mig_profiles.clear();
    let offer = super::offer(&l4, &BTreeSet::new());
    assert!(offer.partitions.is_empty() && offer.whole.is_some() && offer.note.is_none());
}

#[test]
fn the_mode_is_named_static_or_dynamic() {
    assert_eq!("dynamic".parse(), Ok(Partitioning::Dynamic));
    assert_eq!("static".parse(), Ok(Partitioning::Static));
    assert!(
        "Dynamic"
            .parse::<Partitioning>()
            .unwrap_err()
            .contains("neither static nor dynamic")
    );
}

/// The device table of a node of `gpus` H100s (MIG off) in dynamic mode.
fn h100_table(gpus: u32) -> crate::devices::DeviceTable {
    let (_, arch, rows) = models().remove(2);
    let inventory = gpu_discovery::Inventory {
        driver_version: "580.95.05".into(),
        cuda_driver_version: CudaVersion {
            major: 13,
            minor: 0,
        },
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                minor: i,
                uuid: format!("GPU-{i}"),
                ..gpu("H100 80GB HBM3", arch, &rows, MigMode::Disabled)
            })
            .collect(),
        unreadable: Vec::new(),
    };
    let (table, notes) = crate::partitions::table(&inventory, &BTreeMap::new());
    assert!(notes.is_empty(), "{notes:?}");
    table
}

/// An H100 node of `gpus` GPUs in dynamic mode, as its slices publish it.
fn published(
    gpus: u32,
    shares: &[crate::devices::Share],
) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    let table = h100_table(gpus);
    let node = crate::slices::NodeRef {
        name: "node-a".into(),
        uid: "uid".into(),
    };
    crate::slices::desired_slices(
        &node,
        "gpu.nvidia.com",
        &table,
        shares,
        &Default::default(),
        1,
    )
}

/// The counters `device` of `slices` consumes, as `name=value`.
fn consumed(slices: &[k8s_openapi::api::resource::v1::ResourceSlice], device: &str) -> Vec<String> {
    let found = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
        .unwrap_or_else(|| panic!("{device} not published"));
    found
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| {
            c.counters
                .iter()
                .map(move |(k, v)| format!("{}/{k}={}", c.counter_set, v.value.0))
        })
        .collect()
}

#[test]
fn a_partitioned_node_publishes_one_counter_set_per_gpu_within_the_apis_limits() {
    let slices = published(8, &[]);
    let sets: Vec<_> = slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .collect();
    assert_eq!(sets.len(), 8);
    let first = sets.iter().find(|s| s.name == "gpu-0").unwrap();
    let mut names: Vec<_> = first.counters.keys().cloned().collect();
    names.sort();
    assert_eq!(
        names.len(),
        9,
        "8 memory slices and the +me instances: {names:?}"
    );
    assert!(names.contains(&"instances-1g10gb-me".to_owned()));
    for slice in &slices {
        let devices = slice.spec.devices.as_ref().map_or(0, Vec::len);
        assert!(
            devices <= 64,
            "devices consuming counters: at most 64 per slice"
        );
        assert!(
            slice.spec.devices.is_none() || slice.spec.shared_counters.is_none(),
            "devices and counter sets in slices of their own"
        );
        assert!(slice.spec.shared_counters.as_ref().map_or(0, Vec::len) <= 8);
    }
    let devices = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .count();
    assert_eq!(devices, 8 * 26, "25 partitions and the card, per GPU");
    assert_eq!(
        consumed(&slices, "gpu-3"),
        (0..8)
            .map(|i| format!("gpu-3/memory-slice-{i}=1"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        consumed(&slices, "gpu-3-mig-3g40gb-9-4"),
        (4..8)
            .map(|i| format!("gpu-3/memory-slice-{i}=1"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        consumed(&slices, "gpu-3-mig-1g10gb-me-20-2"),
        ["gpu-3/instances-1g10gb-me=1", "gpu-3/memory-slice-2=1"]
    );
    let partition = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == "gpu-3-mig-3g40gb-9-4")
        .unwrap();
    let attributes = partition.attributes.as_ref().unwrap();
    assert_eq!(attributes["type"].string.as_deref(), Some("mig"));
    assert_eq!(attributes["profile"].string.as_deref(), Some("3g.40gb"));
    assert_eq!(attributes["parentUUID"].string.as_deref(), Some("GPU-3"));
    assert!(!attributes.contains_key("uuid"), "no UUID until it is made");
}

#[test]
fn shares_of_a_partitioned_gpu_draw_on_its_card_and_every_slice() {
    let share = crate::devices::Share {
        name: "gpu-0-shared-quarter".into(),
        gpu: "gpu-0".into(),
        class: "quarter".into(),
        card_bytes: 80 << 30,
        share_bytes: 20 << 30,
        strategy: api::gpuclass::SharingStrategy::TimeSlicing,
    };
    let slices = published(1, &[share]);
    let mut want = vec!["gpu-0/card=1".to_owned()];
    want.extend((0..8).map(|i| format!("gpu-0/memory-slice-{i}=1")));
    assert_eq!(consumed(&slices, "gpu-0-shared-quarter"), want);
    assert_eq!(consumed(&slices, "gpu-0"), want);
}

#[test]
fn without_counters_a_partitioned_node_is_published_whole() {
    let table = h100_table(1);
    let whole = table.without_partitions();
    assert_eq!(whole.devices.keys().collect::<Vec<_>>(), ["gpu-0"]);
    assert!(table.offers_partitions(0) && !whole.offers_partitions(0));
}

#[test]
fn a_fault_on_a_gpu_taints_its_card_and_every_partition_of_it_and_the_stream_says_so() {
    let table = h100_table(2);
    let view = crate::device_health::HealthView {
        faults: BTreeMap::from([(
            "GPU-1".to_owned(),
            crate::device_health::GpuFault {
                fault: gpu_discovery::health::Fault::Xid(Some(79)),
                since: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            },
        )]),
        unknown: false,
    };
    let taints = crate::device_health::device_taints(&table, &view);
    assert_eq!(taints.len(), 26, "gpu-1 and its 25 partitions");
    assert!(taints.keys().all(|name| name.starts_with("gpu-1")));
    let stream = crate::device_health::stream_message(
        &table,
        &[],
        &view,
        "node-a",
        jiff::Timestamp::from_second(1_700_000_100).unwrap(),
    );
    let unhealthy = stream
        .devices
        .iter()
        .filter(|d| d.health == crate::proto::health_v1alpha1::HealthStatus::Unhealthy as i32)
        .count();
    assert_eq!((stream.devices.len(), unhealthy), (52, 26));
}
