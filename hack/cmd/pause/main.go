// Command pause is the sandbox ("pause") image of the local cluster's real nodes: it holds a pod's
// namespaces open, reaps the zombies handed to it as PID 1, and exits on SIGTERM or SIGINT. It is
// built statically (CGO_ENABLED=0) so its image is this one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
