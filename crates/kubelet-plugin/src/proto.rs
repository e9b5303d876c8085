//! Generated gRPC code for the kubelet APIs in `<repo>/proto`.
#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

/// DRA kubelet plugin API v1 (`k8s.io.kubelet.pkg.apis.dra.v1`).
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// DRA kubelet plugin API v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1beta1`).
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Plugin registration API v1 (`pluginregistration`).
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// DRA resource health API v1 (`v1`), what kubelet 1.37 opens; its messages are v1alpha1's.
pub mod health_v1 {
    tonic::include_proto!("v1");
}

/// DRA resource health API v1alpha1 (`v1alpha1`), what kubelets 1.34 to 1.36 open.
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// The name the generated v1 code uses for the messages it shares with v1alpha1.
use health_v1alpha1 as v1alpha1;

/// The standard gRPC health protocol (`grpc.health.v1`).
pub mod grpc_health {
    tonic::include_proto!("grpc.health.v1");
}
