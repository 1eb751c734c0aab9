// Command fakecri is a CRI container runtime that runs nothing: upstream's fake runtime from
// k8s.io/cri-client, served on a Unix socket until SIGTERM or SIGINT. A real kubelet on it
// creates sandboxes and containers that report Running, so scheduling, device-plugin Allocate
// and PodResources behave as on a real node without any container being started.
//
// Usage: fakecri [-log-dir DIR] [-record FILE] SOCKET
//
// With -record, every CreateContainer is appended to FILE as one JSON line (namespace, pod,
// container, environment, mounts, devices, CDI devices, annotations), so tests can check what
// device plugins' Allocate responses made the kubelet pass to the runtime.
//
// The upstream fake leaves each container's log path empty, and the kubelet, when it removes a
// container, deletes every file matching "<log path>*" relative to its working directory, i.e.
// everything there. So each container gets a log path of its own under DIR (default: a
// "container-logs" folder beside SOCKET), and the kubelet only ever deletes files there.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// runtime is upstream's fake with CreateContainer overridden to assign a log path and to
// record what the kubelet asked for.
type runtime struct {
	*fake.RemoteRuntime
	logDir string
	record *json.Encoder
	mu     sync.Mutex
}

// created is one line of the -record file: what a real runtime would have been told to run,
// including what device plugins' Allocate added (environment, mounts, devices, CDI devices).
type created struct {
	ContainerID string            `json:"containerId"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	Container   string            `json:"container"`
	Envs        map[string]string `json:"envs"`
	Mounts      []string          `json:"mounts"`
	Devices     []string          `json:"devices"`
	CDIDevices  []string          `json:"cdiDevices"`
	Annotations map[string]string `json:"annotations"`
}

func (r *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	svc := r.RuntimeService
	svc.Lock()
	defer svc.Unlock()
	if c, ok := svc.Containers[resp.ContainerId]; ok {
		c.LogPath = filepath.Join(r.logDir, resp.ContainerId+".log")
	}
	if r.record != nil {
		r.recordCreated(resp.ContainerId, req)
	}
	return resp, nil
}

func (r *runtime) recordCreated(id string, req *kubeapi.CreateContainerRequest) {
	line := created{ContainerID: id, Envs: map[string]string{}, Mounts: []string{},
		Devices: []string{}, CDIDevices: []string{}, Annotations: req.GetConfig().GetAnnotations()}
	if meta := req.GetSandboxConfig().GetMetadata(); meta != nil {
		line.Namespace, line.Pod = meta.Namespace, meta.Name
	}
	line.Container = req.GetConfig().GetMetadata().GetName()
	for _, env := range req.GetConfig().GetEnvs() {
		line.Envs[env.GetKey()] = string(env.GetValue())
	}
	for _, m := range req.GetConfig().GetMounts() {
		line.Mounts = append(line.Mounts, m.HostPath+":"+m.ContainerPath)
	}
	for _, d := range req.GetConfig().GetDevices() {
		line.Devices = append(line.Devices, d.HostPath+":"+d.ContainerPath)
	}
	for _, d := range req.GetConfig().GetCDIDevices() {
		line.CDIDevices = append(line.CDIDevices, d.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record.Encode(line); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: record: %v\n", err)
	}
}

func main() {
	logDir := flag.String("log-dir", "", `folder for container log paths (default: SOCKET's folder + "/container-logs")`)
	recordPath := flag.String("record", "", "append one JSON line per CreateContainer to this file")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: fakecri [-log-dir DIR] [-record FILE] SOCKET")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	socket := flag.Arg(0)
	endpoint := socket
	if !strings.Contains(socket, "://") {
		endpoint = "unix://" + socket
	} else {
		socket = strings.SplitN(socket, "://", 2)[1]
	}
	if *logDir == "" {
		*logDir = filepath.Join(filepath.Dir(socket), "container-logs")
	}
	if err := os.MkdirAll(*logDir, 0o750); err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
		os.Exit(1)
	}

	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), logDir: *logDir}
	// Upstream's fake pulls images of size 0, which the kubelet refuses ("Id or size of image
	// ... is not set"); every image pulled here weighs a nominal 1 MiB.
	r.ImageService.SetFakeImageSize(1 << 20)
	if *recordPath != "" {
		f, err := os.OpenFile(*recordPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fakecri: %v\n", err)
			os.Exit(1)
		}
		defer f.Close()
		r.record = json.NewEncoder(f)
	}
	// fake.RemoteRuntime.Start serves a gRPC server on which the embedded value, not our
	// override, is registered; so serve our own, set up exactly as Start does.
	listener, err := util.CreateListener(endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakecri: listen on %s: %v\n", endpoint, err)
		os.Exit(1)
	}
	r.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, r)
	kubeapi.RegisterImageServiceServer(server, r.RemoteRuntime)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	select {
	case <-stop:
		server.Stop()
		_ = os.Remove(socket)
	case err := <-served:
		fmt.Fprintf(os.Stderr, "fakecri: serve: %v\n", err)
		os.Exit(1)
	}
}
