// Command roche-test-provisioner is the test cluster's dynamic volume provisioner: for
// each PersistentVolumeClaim of its StorageClass it makes an ext4 filesystem of exactly
// the size asked for in a sparse image file on the node, loop-mounts it, and answers
// with a `local` PersistentVolume on that directory, tied to the node; when the volume
// is reclaimed (Delete) it unmounts the filesystem (the loop device goes with the last
// mount, mount's autoclear) and removes the image. Writing past the size fails with
// ENOSPC in the Pods that mount it, as on a real cloud disk: the Kubernetes provider's
// workspaces (PersistentVolumeClaims) are tested against it.
//
// It runs on the node's host as root, beside the cluster (scripts/k8s/cluster.sh starts
// and stops it), over sigs.k8s.io/sig-storage-lib-external-provisioner. It is a module
// of its own so that the project's go.mod stays free of that library's dependencies;
// scripts/k8s/build.sh builds and caches it.
//
//	roche-test-provisioner --kubeconfig FILE --dir DIR --node NAME [--name roche.test/loop]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

// minSize is the smallest filesystem made: ext4's journal alone takes 4 MiB.
const minSize = 8 << 20

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "roche-test-provisioner:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "the cluster's kubeconfig")
	dir := flag.String("dir", "", "where the images and their mount points go")
	node := flag.String("node", "", "the node the volumes are on (this host)")
	name := flag.String("name", "roche.test/loop", "the provisioner's name, as its StorageClass names it")
	flag.Parse()
	if *kubeconfig == "" || *dir == "" || *node == "" {
		return errors.New("give --kubeconfig, --dir and --node")
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	p := &loopProvisioner{dir: *dir, node: *node}
	pc := controller.NewProvisionController(ctx, cs, *name, p,
		controller.LeaderElection(false), controller.Threadiness(4))
	fmt.Fprintf(os.Stderr, "roche-test-provisioner: serving %s on node %s, volumes under %s\n", *name, *node, *dir)
	pc.Run(ctx)
	return nil
}

// loopProvisioner makes each volume an ext4 image under dir, mounted at dir/PV-NAME.
type loopProvisioner struct {
	dir, node string
}

var _ controller.Provisioner = (*loopProvisioner)(nil)

func (p *loopProvisioner) paths(pv string) (img, mnt string) {
	return filepath.Join(p.dir, pv+".img"), filepath.Join(p.dir, pv)
}

// Provision makes the volume of one claim.
func (p *loopProvisioner) Provision(_ context.Context, opts controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	claim := opts.PVC
	if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == v1.PersistentVolumeBlock {
		return nil, controller.ProvisioningFinished, errors.New("block volumes are not offered: ask for a filesystem")
	}
	for _, m := range claim.Spec.AccessModes {
		if m != v1.ReadWriteOnce && m != v1.ReadWriteOncePod {
			return nil, controller.ProvisioningFinished, fmt.Errorf("access mode %s is not offered: the volumes are one node's (ReadWriteOnce)", m)
		}
	}
	req, ok := claim.Spec.Resources.Requests[v1.ResourceStorage]
	if !ok {
		return nil, controller.ProvisioningFinished, errors.New("the claim requests no storage size")
	}
	size := req.Value()
	if size < minSize {
		return nil, controller.ProvisioningFinished, fmt.Errorf("%s is too small for an ext4 filesystem: ask for 8Mi or more", req.String())
	}
	if n := opts.SelectedNodeName; n != "" && n != p.node {
		return nil, controller.ProvisioningReschedule, fmt.Errorf("volumes are made on node %s only, not %s", p.node, n)
	}
	img, mnt := p.paths(opts.PVName)
	if err := p.make(img, mnt, size); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	reclaim := v1.PersistentVolumeReclaimDelete
	if opts.StorageClass.ReclaimPolicy != nil {
		reclaim = *opts.StorageClass.ReclaimPolicy
	}
	fsMode := v1.PersistentVolumeFilesystem
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   claim.Spec.AccessModes,
			VolumeMode:                    &fsMode,
			MountOptions:                  opts.StorageClass.MountOptions,
			// The size asked for: the image's, which the filesystem's own bookkeeping
			// takes a little of, as on any disk.
			Capacity:               v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: mnt}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{p.node}}},
			}}}},
		},
	}
	return pv, controller.ProvisioningFinished, nil
}

// make makes img (ext4 of size bytes, sparse) and mounts it at mnt, unless a previous
// attempt for the same volume already did.
func (p *loopProvisioner) make(img, mnt string, size int64) error {
	if mounted(mnt) {
		return nil
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	// As the Docker provider makes its workspaces (provider/internal/sizedfs): no blocks
	// reserved for root, lazy initialisation so the image stays sparse, a journal.
	if err == nil {
		err = command("mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "-i", "16384",
			"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", img)
	}
	if err == nil {
		err = os.MkdirAll(mnt, 0o755)
	}
	if err == nil {
		err = command("mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, mnt)
	}
	if err == nil {
		// mkfs's lost+found would show in every Pod's mount; fsck makes it again if needed.
		err = os.Remove(filepath.Join(mnt, "lost+found"))
	}
	if err != nil {
		p.remove(img, mnt)
		return fmt.Errorf("making the volume %s: %w", filepath.Base(mnt), err)
	}
	return nil
}

// Delete removes the volume of a reclaimed PersistentVolume.
func (p *loopProvisioner) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	if pv.Spec.Local == nil || filepath.Dir(pv.Spec.Local.Path) != filepath.Clean(p.dir) {
		return &controller.IgnoredError{Reason: "not a volume of this provisioner"}
	}
	img, mnt := p.paths(pv.Name)
	return p.remove(img, mnt)
}

// remove unmounts mnt and removes it and img. The kubelet's bind mounts of a Pod still
// being torn down keep the filesystem, and so its loop device, until they go too.
func (p *loopProvisioner) remove(img, mnt string) error {
	if err := unix.Unmount(mnt, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", mnt, err)
		}
	}
	for _, f := range []string{mnt, img} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// mounted reports whether dir is a mount point (its device differs from its parent's).
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

func command(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
