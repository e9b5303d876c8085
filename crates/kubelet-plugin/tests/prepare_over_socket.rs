//! The real prepare/unprepare core behind the DRA socket, driven by a gRPC client: the kubelet's
//! view of the acceptance cases, with claims served from memory instead of an apiserver.

mod support;

use kubelet_plugin::proto::dra_v1beta1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
    dra_plugin_client::DraPluginClient,
};
use support::{Claims, NODE, Served, claim};

fn c(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn the_kubelet_view_of_prepare_and_unprepare() {
    let served = Served::start(Claims::of([
        claim("good", "u1", &[(NODE, "gpu-0")]),
        claim("unallocated", "u2", &[]),
        claim("elsewhere", "u3", &[("node-b", "gpu-1")]),
        claim("replaced", "u4-new", &[(NODE, "gpu-2")]),
        claim("twice", "u5", &[(NODE, "gpu-0")]),
    ]))
    .await;
    let mut kubelet = DraPluginClient::new(served.channel.clone());
    let prepare = |claims: Vec<Claim>| NodePrepareResourcesRequest { claims };

    let first = kubelet
        .node_prepare_resources(prepare(vec![c("good", "u1")]))
        .await
        .unwrap()
        .into_inner();
    let good = &first.claims["u1"];
    assert_eq!(good.error, "");
    assert_eq!(good.devices.len(), 1);
    assert_eq!(good.devices[0].request_names, ["gpu"]);
    assert_eq!(good.devices[0].pool_name, NODE);
    assert_eq!(good.devices[0].device_name, "gpu-0");
    assert_eq!(
        good.devices[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1-gpu-0"]
    );
    let spec = served.cdi_root.join("k8s.gpu.nvidia.com-claim_u1.yaml");
    let written = std::fs::metadata(&spec).unwrap().modified().unwrap();

    let again = kubelet
        .node_prepare_resources(prepare(vec![c("good", "u1")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, first, "a repeated prepare gets the same answer");
    assert_eq!(
        std::fs::metadata(&spec).unwrap().modified().unwrap(),
        written,
        "and no new CDI write"
    );

    let refused = kubelet
        .node_prepare_resources(prepare(vec![
            c("unallocated", "u2"),
            c("elsewhere", "u3"),
            c("replaced", "u4"),
            c("twice", "u5"),
        ]))
        .await
        .unwrap()
        .into_inner();
    let error = |uid: &str| refused.claims[uid].error.clone();
    assert_eq!(
        error("u2"),
        "claim ns/unallocated (uid u2): not allocated (status.allocation is empty)"
    );
    assert_eq!(
        error("u3"),
        "claim ns/elsewhere (uid u3): device gpu-1 is allocated from pool node-b, but this node serves pool node-a"
    );
    assert_eq!(
        error("u4"),
        "claim ns/replaced (uid u4): UID mismatch: the kubelet asked for u4, the API has u4-new"
    );
    assert_eq!(
        error("u5"),
        "claim ns/twice (uid u5): device gpu-0 is already prepared for claim u1"
    );
    assert!(refused.claims.values().all(|r| r.devices.is_empty()));

    let unprepare = |claims: Vec<Claim>| NodeUnprepareResourcesRequest { claims };
    let answer = kubelet
        .node_unprepare_resources(unprepare(vec![c("good", "u1"), c("never-seen", "u9")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 2);
    assert!(answer.claims.values().all(|r| r.error.is_empty()));
    assert!(!spec.exists());

    let now_free = kubelet
        .node_prepare_resources(prepare(vec![c("twice", "u5")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        now_free.claims["u5"].error, "",
        "gpu-0 is free after unprepare"
    );

    served.stop().await;
}
