//go:build tools

// Package tools pins the container runtime of the local cluster's real nodes: containerd v2 (daemon,
// ctr, runc shim). It is a module of its own because containerd's pins (cri-api, grpc) conflict with
// the Kubernetes ones in hack/go.mod.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
