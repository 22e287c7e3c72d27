package catalog

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

func TestNamesSortedAndComplete(t *testing.T) {
	names := Names()
	if want := []string{"docker", "firecracker", "kubernetes", "oci", "qemu", "wasm"}; !slices.Equal(names, want) {
		t.Fatalf("Names() = %v, want %v", names, want)
	}
	if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
		t.Fatalf("Names() = %v: not sorted or not unique", names)
	}
	if got := List(); got != "docker, firecracker, kubernetes, oci, qemu, wasm" {
		t.Fatalf("List() = %q", got)
	}
	names[0] = "changed"
	if Names()[0] != "docker" {
		t.Fatal("a caller changing Names' slice changed the registry")
	}
	bare, defaults := 0, 0
	for _, p := range All() {
		if p.Description == "" || strings.Contains(p.Description, "\n") {
			t.Errorf("provider %q: a one-line description is required", p.Name)
		}
		if p.BareIDs {
			bare++
		}
		if p.Name == Default {
			defaults++
		}
	}
	if bare != 1 || defaults != 1 {
		t.Fatalf("%d providers with bare ids and %d named %q: want one of each, or OfID cannot route", bare, defaults, Default)
	}
}

func TestHelpListsEveryProvider(t *testing.T) {
	help := Help()
	lines := strings.Split(help, "\n")
	if len(lines) != len(Names()) {
		t.Fatalf("Help() has %d lines for %d providers:\n%s", len(lines), len(Names()), help)
	}
	for i, p := range All() {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), p.Name+" ") || !strings.HasSuffix(strings.TrimSuffix(lines[i], " (the default)"), p.Description) {
			t.Errorf("Help() line %d = %q, want %s and its description", i, lines[i], p.Name)
		}
		if marked := strings.HasSuffix(lines[i], "(the default)"); marked != (p.Name == Default) {
			t.Errorf("Help() line %q: default marked %v", lines[i], marked)
		}
	}
}

func TestOfID(t *testing.T) {
	cases := map[string]string{
		// Docker's ids are container ids, bare hex.
		"3f9a0c2b7d1e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f90": "docker",
		"3f9a0c2b7d1e": "docker",
		"":             "docker",
		// A name without its dash, or a longer word, is not a prefix.
		"wasm":          "docker",
		"wasmtime-1234": "docker",
		"qemux-1234":    "docker",
		"docker-1234":   "docker",
	}
	for _, name := range Names() {
		if name != "docker" {
			cases[name+"-0a1b2c3d4e5f"] = name
			cases[name+"-"] = name
		}
	}
	for id, want := range cases {
		if got := OfID(id); got != want {
			t.Errorf("OfID(%q) = %q, want %q", id, got, want)
		}
	}
}

func TestUnknownProviderRefusedWithTheList(t *testing.T) {
	const want = `unknown provider "vmware": choose one of docker, firecracker, kubernetes, oci, qemu, wasm`
	for _, name := range []string{"vmware", "", "Docker", "vm"} {
		if _, err := Lookup(name); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "choose one of docker, firecracker, kubernetes, oci, qemu, wasm") {
			t.Errorf("Lookup(%q) = %v; want ErrInvalidConfig listing the providers", name, err)
		}
	}
	if _, err := Lookup("vmware"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Lookup(vmware) = %v, want %q", err, want)
	}
	if err := Check([]string{"docker", "vmware", "wasm"}); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), `"vmware"`) {
		t.Errorf("Check = %v, want vmware refused", err)
	}
	if err := Check(Names()); err != nil {
		t.Errorf("Check(Names()) = %v", err)
	}
}

// TestEverySettingListed: every provider setting of Options (its string fields) is in
// the settings list, so that CheckSettings refuses it where its provider is not used.
func TestEverySettingListed(t *testing.T) {
	var o Options
	v := reflect.ValueOf(&o).Elem()
	var fields []string
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.String {
			f.SetString("set-" + v.Type().Field(i).Name)
			fields = append(fields, v.Type().Field(i).Name)
		}
	}
	given := Given(o)
	if len(given) != len(fields) {
		t.Fatalf("Options has %d string settings (%v), the list %d (%v)", len(fields), fields, len(given), given)
	}
	for _, f := range given {
		if _, err := Lookup(f.Provider); err != nil || !strings.HasPrefix(f.Value, "set-") {
			t.Errorf("setting %v: provider %q, value %q", f, f.Provider, f.Value)
		}
	}
	// Each is refused where its provider is not used, and only there.
	for _, f := range given {
		if err := CheckSettings(o, Names(), "this command uses"); err != nil {
			t.Fatalf("with every provider used: %v", err)
		}
		others := slices.DeleteFunc(Names(), func(n string) bool { return n == f.Provider })
		err := CheckSettings(o, others, "this command uses")
		if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "--"+f.Name+" is the "+f.Provider+" provider's") {
			t.Errorf("--%s without the %s provider: %v", f.Name, f.Provider, err)
		}
	}
	if err := CheckSettings(Options{Transport: "agent"}, []string{"oci"}, "this command uses"); err != nil {
		t.Errorf("the default transport, given or not, is no setting: %v", err)
	}
}
