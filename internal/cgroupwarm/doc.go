// Package cgroupwarm takes the kernel's wait before an OCI runtime's first cgroup move
// on a cgroup v1 host off a create's path (Start), for the oci provider and for
// roche-run, which begins it as it starts when given a one-shot oci run (For). It imports
// only standard packages that Go initialises early, so that a package may call For as
// it initialises.
package cgroupwarm
