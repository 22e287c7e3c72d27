package uidrange

import (
	"errors"
	"testing"

	"github.com/roche-sandbox/roche"
)

// TestDefaultsApart: the ranges of the providers that share a host (docker, oci) do not
// overlap, and every default passes the check every provider applies.
func TestDefaultsApart(t *testing.T) {
	if OCIFirst < DockerFirst+DockerCount && DockerFirst < OCIFirst+OCICount {
		t.Errorf("the oci range %d+%d overlaps the Docker range %d+%d", OCIFirst, OCICount, DockerFirst, DockerCount)
	}
	for _, r := range [][2]int{{DockerFirst, DockerCount}, {OCIFirst, OCICount}, {KubernetesFirst, KubernetesCount}} {
		if err := Check(r[0], r[1], 2); err != nil {
			t.Errorf("default range %d+%d: %v", r[0], r[1], err)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, bad := range [][3]int{
		{0, 10, 1},          // root and the system's users
		{65535, 10, 1},      // one below
		{100_000, 1, 2},     // too few
		{1<<31 - 10, 10, 1}, // reaches 2^31-1
	} {
		if err := Check(bad[0], bad[1], bad[2]); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("Check(%d, %d, %d) = %v, want ErrInvalidConfig", bad[0], bad[1], bad[2], err)
		}
	}
	if err := Check(65536, 2, 2); err != nil {
		t.Errorf("the smallest good range: %v", err)
	}
}

func TestDrawStaysInRange(t *testing.T) {
	seen := map[int]bool{}
	for range 1000 {
		uid := Draw(100_000, 3)
		if uid < 100_000 || uid >= 100_003 {
			t.Fatalf("drew %d from 100000+3", uid)
		}
		seen[uid] = true
	}
	if len(seen) != 3 {
		t.Errorf("1000 draws from 3 uids gave %d of them", len(seen))
	}
}
