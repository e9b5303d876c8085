//! Wire test: the registration and DRA services over real Unix sockets, driven by a gRPC client.

use kubelet_plugin::grpc::DraService;
use kubelet_plugin::liveness::HealthService;
use kubelet_plugin::proto::registration::registration_client::RegistrationClient;
use kubelet_plugin::proto::registration::{InfoRequest, RegistrationStatus};
use kubelet_plugin::proto::{dra_v1, dra_v1beta1};
use kubelet_plugin::registration::{RegistrationService, RegistrationState};
use kubelet_plugin::server::{SocketPaths, Sockets};
use kubelet_plugin::types::{
    ClaimRef, DraBackend, PrepareResults, PreparedDevice, UnprepareResults,
};
use node_agent::kubelet_client::connect_unix;
use std::sync::Arc;

mod support;

/// Prepares every claim whose name starts with `ok` with one device, fails the others.
struct Echo;

impl DraBackend for Echo {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        claims
            .into_iter()
            .map(|c| {
                let answer = if c.name.starts_with("ok") {
                    Ok(vec![PreparedDevice {
                        request_names: vec!["gpu".into()],
                        pool: "node-a".into(),
                        device: "gpu-0".into(),
                        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={}-gpu-0", c.uid)],
                        admin_access: false,
                        share_id: Some(format!("share-{}", c.uid)),
                        made_uuid: None,
                    }])
                } else {
                    Err(format!("claim {}: refused", c.name))
                };
                (c.uid, answer)
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test]
async fn registration_and_both_dra_versions_answer_over_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let paths = SocketPaths::new(
        &dir.path().join("plugins_registry"),
        &dir.path().join("plugins"),
    );
    let endpoint = paths.dra.to_string_lossy().into_owned();
    let registration = RegistrationService::new("gpu.nvidia.com", &endpoint);
    let mut state = registration.state();
    let sockets = Sockets::bind(&paths).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server =
        tokio::spawn(
            sockets.serve(registration, DraService::new(Arc::new(Echo)), async move {
                let _ = stopped.await;
            }),
        );

    assert!(
        paths
            .registration
            .ends_with("plugins_registry/gpu.nvidia.com-reg.sock")
    );
    assert!(paths.dra.ends_with("plugins/gpu.nvidia.com/dra.sock"));

    let mut reg = RegistrationClient::new(connect_unix(&paths.registration).await.unwrap());
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(info.endpoint, endpoint);
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    state
        .wait_for(|s| *s == RegistrationState::Registered)
        .await
        .unwrap();
    let refused = reg
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "duplicate endpoint".into(),
        })
        .await
        .unwrap_err();
    assert!(refused.message().contains("duplicate endpoint"));

    let channel = connect_unix(&paths.dra).await.unwrap();
    let mut c1 = dra_v1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let answer = c1
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![
                dra_v1::Claim {
                    namespace: "ns".into(),
                    uid: "u1".into(),
                    name: "ok-1".into(),
                },
                dra_v1::Claim {
                    namespace: "ns".into(),
                    uid: "u2".into(),
                    name: "bad".into(),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let ok = &answer.claims["u1"];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices[0].device_name, "gpu-0");
    assert_eq!(ok.devices[0].pool_name, "node-a");
    assert_eq!(
        ok.devices[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1-gpu-0"]
    );
    assert_eq!(ok.devices[0].share_id.as_deref(), Some("share-u1"));
    assert_eq!(answer.claims["u2"].error, "claim bad: refused");

    let mut c2 = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
    let answer = c2
        .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: "ns".into(),
                uid: "u9".into(),
                name: "gone".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["u9"].error, "");
    let answer = c2
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.claims.is_empty());
    let invalid = c2
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: "ns".into(),
                uid: String::new(),
                name: "x".into(),
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);

    let health = HealthService::new(paths.clone());
    health.probe().await.expect("both sockets answer");

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    let down = health.probe().await.unwrap_err();
    assert!(down.contains("registration socket"), "{down}");
    assert!(
        !paths.registration.exists(),
        "registration socket removed on shutdown"
    );
    assert!(!paths.dra.exists(), "DRA socket removed on shutdown");
}

#[tokio::test]
async fn liveness_check_follows_the_sockets() {
    use kubelet_plugin::proto::grpc_health::health_check_response::ServingStatus;
    use kubelet_plugin::proto::grpc_health::{HealthCheckRequest, health_client::HealthClient};

    let dir = tempfile::tempdir().unwrap();
    let paths = SocketPaths::new(&dir.path().join("reg"), &dir.path().join("plugins"));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HealthService::new(paths.clone()).into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(tcp)),
    );
    let mut client = HealthClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };

    let down = client.check(check("liveness")).await.unwrap().into_inner();
    assert_eq!(down.status, ServingStatus::NotServing as i32);

    let sockets = Sockets::bind(&paths).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sockets.serve(
        RegistrationService::new("gpu.nvidia.com", &paths.dra.to_string_lossy()),
        DraService::new(Arc::new(Echo)),
        async move {
            let _ = stopped.await;
        },
    ));
    for service in ["", "liveness"] {
        let up = client.check(check(service)).await.unwrap().into_inner();
        assert_eq!(
            up.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    let unknown = client.check(check("readiness")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// The kubelet's health stream: advertised at registration (v1 first, for kubelet 1.37, then
/// v1alpha1), both served on the DRA socket, a full list at once, then a message on every change.
#[tokio::test]
async fn the_health_stream_reports_every_device_and_each_change() {
    use kubelet_plugin::device_health::{GpuFault, HealthStream, HealthView};
    use kubelet_plugin::proto::health_v1alpha1::{
        HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
        dra_resource_health_client::DraResourceHealthClient,
    };

    let table = Arc::new(support::eight_a100s());
    let lost = table.devices["gpu-1"].gpu.gpu_uuid.clone();
    let (view_tx, view) = tokio::sync::watch::channel(HealthView::default());

    let served = serve_health(HealthStream::new(table, "node-a", view));
    let paths = &served.paths;

    let mut reg = RegistrationClient::new(connect_unix(&paths.registration).await.unwrap());
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    let mut client = DraResourceHealthClient::new(connect_unix(&paths.dra).await.unwrap());
    let mut stream = client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    // Every device's health, as `pool/device health`, for the devices not healthy.
    let not_healthy = |m: NodeWatchResourcesResponse| {
        assert_eq!(m.devices.len(), 8, "every device, every time");
        m.devices
            .iter()
            .filter(|d| d.health() != HealthStatus::Healthy)
            .map(|d| {
                let id = d.device.as_ref().unwrap();
                format!("{}/{} {:?}", id.pool_name, id.device_name, d.health())
            })
            .collect::<Vec<_>>()
    };
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(not_healthy(first), Vec::<String>::new());

    view_tx.send_modify(|v| {
        v.faults.insert(
            lost,
            GpuFault {
                fault: gpu_discovery::health::Fault::Xid(Some(79)),
                since: jiff::Timestamp::now(),
            },
        );
    });
    let changed = tokio::time::timeout(std::time::Duration::from_secs(5), stream.message())
        .await
        .expect("a change is sent at once, not at the next repeat")
        .unwrap()
        .unwrap();
    assert_eq!(not_healthy(changed), ["node-a/gpu-1 Unhealthy"]);

    // Kubelet 1.37 opens v1: the same list, the fault in it from the first message.
    use kubelet_plugin::proto::health_v1;
    let mut v1 = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        connect_unix(&paths.dra).await.unwrap(),
    );
    let first_v1 = v1
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let unhealthy_v1: Vec<String> = first_v1
        .devices
        .iter()
        .filter(|d| d.health() == HealthStatus::Unhealthy)
        .map(|d| d.device.as_ref().unwrap().device_name.clone())
        .collect();
    assert_eq!(
        (first_v1.devices.len(), unhealthy_v1),
        (8, vec!["gpu-1".to_owned()])
    );

    served.stop().await;
}

/// Pods holding a share of a GPU see its health: the shares a GPU class offers join the stream
/// as soon as they are offered, and a share is as healthy as its GPU.
#[tokio::test]
async fn the_health_stream_lists_the_shares_a_class_offers() {
    use api::gpuclass::SharingStrategy;
    use api::gpuclass::variants::{ShareSize, SharedOffer};
    use kubelet_plugin::device_health::{GpuFault, HealthStream, HealthView};
    use kubelet_plugin::proto::health_v1alpha1::{
        HealthStatus, NodeWatchResourcesRequest,
        dra_resource_health_client::DraResourceHealthClient,
    };

    let table = Arc::new(support::eight_a100s());
    let faulty = table.devices["gpu-3"].gpu.gpu_uuid.clone();
    let fault = GpuFault {
        fault: gpu_discovery::health::Fault::Xid(Some(48)),
        since: jiff::Timestamp::now(),
    };
    let (_view_tx, view) = tokio::sync::watch::channel(HealthView {
        faults: [(faulty, fault)].into(),
        unknown: false,
    });
    let (offers_tx, offers) = tokio::sync::watch::channel(Vec::new());
    let served = serve_health(HealthStream::new(table, "node-a", view).with_shares(offers));
    let paths = &served.paths;

    let mut client = DraResourceHealthClient::new(connect_unix(&paths.dra).await.unwrap());
    let mut stream = client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 8, "no class offers shares yet");

    offers_tx.send_replace(vec![SharedOffer {
        class: "a100s".into(),
        criteria: Vec::new(),
        size: ShareSize::Count(2),
        strategy: SharingStrategy::TimeSlicing,
    }]);
    let offered = tokio::time::timeout(std::time::Duration::from_secs(5), stream.message())
        .await
        .expect("the offer is sent at once, not at the next repeat")
        .unwrap()
        .unwrap();
    let health = |name: &str| {
        offered
            .devices
            .iter()
            .find(|d| d.device.as_ref().unwrap().device_name == name)
            .map(|d| d.health())
    };
    assert_eq!(
        offered.devices.len(),
        16,
        "8 GPUs and a share device of each"
    );
    assert_eq!(health("gpu-3-shared-a100s"), Some(HealthStatus::Unhealthy));
    assert_eq!(health("gpu-2-shared-a100s"), Some(HealthStatus::Healthy));

    served.stop().await;
}

/// Sockets in a fresh folder serving the registration (the health stream advertised), the DRA
/// service (answered by [`Echo`]) and `health`.
struct Served {
    _dir: tempfile::TempDir,
    paths: SocketPaths,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), kubelet_plugin::server::ServeError>>,
}

fn serve_health(health: kubelet_plugin::device_health::HealthStream) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let paths = SocketPaths::new(
        &dir.path().join("plugins_registry"),
        &dir.path().join("plugins"),
    );
    let sockets = Sockets::bind(&paths).unwrap().with_health(health);
    let registration = RegistrationService::new("gpu.nvidia.com", &paths.dra.to_string_lossy())
        .with_resource_health();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server =
        tokio::spawn(
            sockets.serve(registration, DraService::new(Arc::new(Echo)), async move {
                let _ = stopped.await;
            }),
        );
    Served {
        _dir: dir,
        paths,
        stop,
        server,
    }
}

impl Served {
    /// Stops the server and waits for it to remove its sockets.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

/// Takes every prepare and never answers it (a kubelet's call that outlives the plugin).
struct Stuck(Arc<tokio::sync::Notify>);

impl DraBackend for Stuck {
    async fn prepare(&self, _claims: Vec<ClaimRef>) -> PrepareResults {
        self.0.notify_one();
        std::future::pending().await
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test]
async fn shutdown_ends_while_the_kubelet_holds_a_call_open() {
    let dir = tempfile::tempdir().unwrap();
    let paths = SocketPaths::new(
        &dir.path().join("plugins_registry"),
        &dir.path().join("plugins"),
    );
    let entered = Arc::new(tokio::sync::Notify::new());
    let registration = RegistrationService::new("gpu.nvidia.com", &paths.dra.to_string_lossy());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(Sockets::bind(&paths).unwrap().serve(
        registration,
        DraService::new(Arc::new(Stuck(entered.clone()))),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut client =
        dra_v1::dra_plugin_client::DraPluginClient::new(connect_unix(&paths.dra).await.unwrap());
    let call = tokio::spawn(async move {
        client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![dra_v1::Claim {
                    namespace: "ns".into(),
                    uid: "u1".into(),
                    name: "held".into(),
                }],
            })
            .await
    });
    entered.notified().await;

    stop.send(()).unwrap();
    // A graceful shutdown alone waits for the call for ever; the plugin gives it a grace period
    // and goes on to withdraw and exit within its pod's termination grace.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), server).await;
    ended
        .expect("the servers stop within the shutdown grace, not when the call ends")
        .unwrap()
        .unwrap();
    assert!(!paths.dra.exists(), "DRA socket removed on shutdown");
    call.abort();
}
