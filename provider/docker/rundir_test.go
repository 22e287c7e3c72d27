package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestRootSandboxCannotReachHostFiles attacks, from inside a sandbox running as root,
// the files the host keeps for it: its claim (whose it is, until when, the holder's
// environment), the end SetTimeout records, its egress CA's certificate and its secrets'
// placeholders. The directory bound into the sandbox for the agent's socket belongs to
// the host user, and a sandbox whose user is root (uid 0, as the host user roched
// usually runs as) owns it there: whatever the host keeps in it, such a sandbox reads,
// forges, or replaces by a symlink that the host's next write follows. So the host keeps
// them one level up, out of the sandbox's reach. The sandbox plants symlinks to a victim
// file of the host under every name the host writes, forges a claim, then the host
// claims it, sets its timeout and (a new process, as after a roched restart) serves its
// egress proxy again; the victim must be untouched, the forged claim not believed, the
// holder's environment not readable inside.
func TestRootSandboxCannotReachHostFiles(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	p := newProvider(t, docker.WithEgressProxy())
	victim := filepath.Join(t.TempDir(), "victim")
	const intact = "the host's own file\n"
	if err := os.WriteFile(victim, []byte(intact), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.User = "root"
	cfg.NetworkAllowlist = []string{"https://127.0.0.5:8443/"}
	cfg.Secrets = []roche.Secret{{Name: "API_TOKEN", Value: "rs-not-this-test's-concern", Hosts: []string{"127.0.0.5:8443"}}}
	info, err := p.Create(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	defer func() {
		// p is closed below; a provider of its own removes the sandbox.
		q, err := docker.New()
		if err == nil {
			q.Destroy(context.Background(), id)
			q.Close()
		}
	}()

	// Every name the host writes or reads in a sandbox's directory, including the
	// temporary names of its atomic writes.
	names := []string{"egress-placeholders.json", "egress-ca.crt", "egress-bundle.crt", ".claim.json", ".expires", "start_by"}
	plant := "cd /.roche/run && id -u && ls -a && for f in " + strings.Join(names, " ") + "; do rm -f $f; ln -s " + victim + " $f; done && " +
		`printf '{"owner":"mallory","expires":"2099-01-01T00:00:00Z"}' > claim.json && echo 4070908800000000000 > expires && ls -la`
	res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"sh", "-c", plant}, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("planting inside the sandbox: %+v %v", res, err)
	}
	if !strings.HasPrefix(res.Stdout, "0\n") {
		t.Fatalf("the sandbox's user is not root (%q): the attack tests nothing", res.Stdout)
	}
	t.Logf("the sandbox's socket directory after planting:\n%s", res.Stdout)

	// A forged claim is not believed.
	got, err := p.Inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Owner == "mallory" || got.ExpiresAt.Year() == 2099 {
		t.Errorf("the sandbox forged its claim: owner %q, ends %s", got.Owner, got.ExpiresAt)
	}
	// The host's writes follow no symlink the sandbox planted.
	holder := "holder-env-" + strings.ReplaceAll(t.Name(), "/", "-")
	claim := kit.Claim{Owner: "alice", Expires: time.Now().Add(2 * time.Minute), Env: map[string]string{"HOLDER_ONLY": holder}}
	if err := p.Claim(context.Background(), id, claim); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SetTimeout(context.Background(), id, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	// As after a roched restart: another process serves the sandbox's proxy again, making
	// its CA and recording its placeholders anew.
	p.Close()
	p2 := newProvider(t, docker.WithEgressProxy())
	got, err = p2.Inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Owner != "alice" {
		t.Errorf("after the claim the sandbox is %q's, want alice's", got.Owner)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != intact {
		t.Errorf("a host-side write followed a symlink the sandbox planted: the victim holds %q (%v)", b, err)
	}
	// The holder's environment, which the claim holds, is not readable inside.
	res, err = p2.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"sh", "-c", "cat /.roche/run/* /.roche/run/.[a-z]* 2>/dev/null; ls -la /.roche/run; true"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, holder) {
		t.Errorf("the sandbox reads its holder's claim:\n%s", res.Stdout)
	}
	// The sandbox's trust store is still the one the host gave it (the read-only bind).
	res, err = p2.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo forged > /etc/ssl/certs/ca-certificates.crt"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 {
		t.Error("the sandbox rewrote its trust store, bound read-only")
	}
}

// TestEgressTrustOutOfReach: the conformance probe of a root sandbox against its trust
// files and its socket directory.
func TestEgressTrustOutOfReach(t *testing.T) {
	p := newProvider(t, docker.WithEgressProxy())
	providertest.EgressTrustOutOfReach(t, p, testConfig(), func(cfg roche.Config) string { return sandbox(t, p, cfg) })
}
