// Command standin takes the place of images NVIDIA builds that cannot be fetched here (DCGM, the DCGM
// exporter, the ComputeDomain driver) in the local cluster's real nodes. Installed under the names
// those images' commands use (bash, dcgm-exporter, nv-hostengine, compute-domain-...), it says in its
// log that it is a stand-in, keeps its container alive, answers the gRPC health checks a kubelet
// plugin container is probed with (when HEALTHCHECK_PORT is set), and exits on SIGTERM.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	image := os.Getenv("STANDIN_IMAGE")
	fmt.Printf("stand-in for %s (the real image cannot be fetched here): keeping the container alive; invoked as %s %q\n",
		image, filepath.Base(os.Args[0]), os.Args[1:])
	if port, err := strconv.Atoi(os.Getenv("HEALTHCHECK_PORT")); err == nil && port > 0 {
		serveHealth(port)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	sig := <-signals
	fmt.Printf("stand-in: %v, exiting\n", sig)
}

// serveHealth answers grpc.health.v1 for every service name (the plugins are probed as "liveness").
func serveHealth(port int) {
	listener, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		fmt.Fprintf(os.Stderr, "stand-in: health port %d: %v\n", port, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	status := health.NewServer()
	status.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	status.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(server, status)
	fmt.Printf("stand-in: serving gRPC health on :%d\n", port)
	go func() { _ = server.Serve(listener) }()
}
