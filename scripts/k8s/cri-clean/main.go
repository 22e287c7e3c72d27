//go:build ignore

// Command cri-clean stops and removes every Pod sandbox of a CRI runtime, the way the
// kubelet would: the runtime runs the CNI plugin's DEL, removes the network namespace and
// lets the shims exit. scripts/k8s/cluster.sh down runs it against the test cluster's own
// containerd after stopping the kubelet, so no Pod outlives the cluster.
//
// It imports k8s.io/cri-api and gRPC, which the project's go.mod does not carry, so it is
// excluded from the project's build (the ignore tag) and build.sh builds it in the module
// that builds the Kubernetes binaries.
//
//	cri-clean unix:///run/roche-cluster/containerd.sock
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cri-clean:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: cri-clean unix:///path/to/cri.sock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", os.Args[1], err)
	}
	defer conn.Close()
	rt := runtime.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing Pod sandboxes: %w", err)
	}
	var failed int
	for _, sb := range list.Items {
		name := sb.GetMetadata().GetNamespace() + "/" + sb.GetMetadata().GetName()
		if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "cri-clean: stopping the sandbox of %s: %v\n", name, err)
			failed++
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "cri-clean: removing the sandbox of %s: %v\n", name, err)
			failed++
			continue
		}
		fmt.Printf("removed the sandbox of %s\n", name)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d sandboxes not removed", failed, len(list.Items))
	}
	return nil
}
