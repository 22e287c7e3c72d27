// Command dist writes the Python SDK's distributions: one wheel per architecture that
// carries Roche's static binaries (roche, roched, roche-run, roche-agent) inside the
// package, so that `pip install roche-sandbox` is all a user with Docker needs, and an
// sdist.
//
//	go run ./scripts/dist [-out dist] [-arch amd64,arm64]     (make dist)
//
// A wheel is a zip file with a documented layout (PEP 427, PEP 491): the package's
// files, NAME-VERSION.dist-info/ with METADATA, WHEEL and RECORD (every file's sha256
// and size). Writing it here needs neither the `wheel` package nor a network, which the
// machines that build Roche may lack.
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// platforms maps GOARCH to the wheel's platform tag. manylinux_2_17 promises glibc 2.17
// or later; the binaries are static and need no libc at all, which keeps the promise.
var platforms = map[string]string{
	"amd64": "manylinux_2_17_x86_64",
	"arm64": "manylinux_2_17_aarch64",
}

// binaries are carried in roche_sandbox/_bin/, where the SDK looks first.
var binaries = []string{"roche", "roched", "roche-run", "roche-agent"}

const (
	sdkDir  = "sdk/python"
	pkgName = "roche_sandbox"
	dist    = "roche-sandbox"
)

func main() {
	out := flag.String("out", "dist", "directory to write the wheels and the sdist to")
	archs := flag.String("arch", "amd64,arm64", "architectures to build wheels for, comma-separated ("+strings.Join(sortedKeys(platforms), ", ")+")")
	sdist := flag.Bool("sdist", true, "also write the sdist")
	flag.Parse()
	if err := run(*out, strings.Split(*archs, ","), *sdist); err != nil {
		fmt.Fprintf(os.Stderr, "dist: %v\n", err)
		os.Exit(1)
	}
}

func sortedKeys(m map[string]string) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func run(out string, archs []string, withSdist bool) error {
	meta, err := readProject(filepath.Join(sdkDir, "pyproject.toml"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, arch := range archs {
		plat, ok := platforms[arch]
		if !ok {
			return fmt.Errorf("architecture %q: choose from %s", arch, strings.Join(sortedKeys(platforms), ", "))
		}
		bin, err := os.MkdirTemp("", "roche-dist-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(bin)
		for _, b := range binaries {
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(bin, b), "./cmd/"+b)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("building %s for %s: %w", b, arch, err)
			}
		}
		name := filepath.Join(out, fmt.Sprintf("%s-%s-py3-none-%s.whl", pkgName, meta.version, plat))
		if err := writeWheel(name, meta, plat, bin); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		fmt.Println(name)
	}
	if withSdist {
		name := filepath.Join(out, fmt.Sprintf("%s-%s.tar.gz", pkgName, meta.version))
		if err := writeSdist(name, meta); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		fmt.Println(name)
	}
	return nil
}

// project is what the wheel's METADATA says, read from pyproject.toml.
type project struct {
	version, summary, requiresPython, license string
	classifiers                               []string
	readme                                    []byte
}

// readProject reads the few pyproject.toml fields METADATA needs. The file is Roche's
// own and simple; a field it cannot find is an error rather than a wheel without it.
func readProject(file string) (project, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return project{}, err
	}
	field := func(key string) (string, error) {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `\s*=\s*"([^"]*)"`).FindSubmatch(b)
		if m == nil {
			return "", fmt.Errorf("%s has no %s", file, key)
		}
		return string(m[1]), nil
	}
	var p project
	for key, dst := range map[string]*string{"version": &p.version, "description": &p.summary, "requires-python": &p.requiresPython} {
		if *dst, err = field(key); err != nil {
			return project{}, err
		}
	}
	if m := regexp.MustCompile(`license\s*=\s*\{\s*text\s*=\s*"([^"]*)"`).FindSubmatch(b); m != nil {
		p.license = string(m[1])
	}
	if m := regexp.MustCompile(`(?s)classifiers\s*=\s*\[(.*?)\]`).FindSubmatch(b); m != nil {
		for _, c := range regexp.MustCompile(`"([^"]*)"`).FindAllSubmatch(m[1], -1) {
			p.classifiers = append(p.classifiers, string(c[1]))
		}
	}
	if p.readme, err = os.ReadFile(filepath.Join(filepath.Dir(file), "README.md")); err != nil {
		return project{}, err
	}
	return p, nil
}

func (p project) metadata() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\n", dist, p.version, p.summary, p.requiresPython)
	if p.license != "" {
		fmt.Fprintf(&b, "License: %s\n", p.license)
	}
	for _, c := range p.classifiers {
		fmt.Fprintf(&b, "Classifier: %s\n", c)
	}
	fmt.Fprintf(&b, "Description-Content-Type: text/markdown\n\n%s", p.readme)
	return b.Bytes()
}

// file is one entry of a distribution.
type file struct {
	name string
	mode fs.FileMode
	data []byte
}

// packageFiles are the SDK's own files, as the wheel and the sdist hold them below
// prefix: every file of the package but caches.
func packageFiles(prefix string) ([]file, error) {
	root := filepath.Join(sdkDir, "src", pkgName)
	var files []file
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "__pycache__" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".pyc") || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if strings.HasPrefix(filepath.ToSlash(rel), "_bin/") {
			return nil // binaries from a local build; the wheel gets this build's
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, file{name: path.Join(prefix, pkgName, filepath.ToSlash(rel)), mode: 0o644, data: data})
		return nil
	})
	return files, err
}

func writeWheel(name string, p project, plat, binDir string) error {
	files, err := packageFiles("")
	if err != nil {
		return err
	}
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return err
		}
		files = append(files, file{name: pkgName + "/_bin/" + b, mode: 0o755, data: data})
	}
	info := fmt.Sprintf("%s-%s.dist-info", pkgName, p.version)
	files = append(files,
		file{name: info + "/METADATA", mode: 0o644, data: p.metadata()},
		file{name: info + "/WHEEL", mode: 0o644, data: fmt.Appendf(nil,
			"Wheel-Version: 1.0\nGenerator: roche scripts/dist\nRoot-Is-Purelib: false\nTag: py3-none-%s\n", plat)},
	)
	var record bytes.Buffer
	for _, f := range files {
		sum := sha256.Sum256(f.data)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.data))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", info)
	files = append(files, file{name: info + "/RECORD", mode: 0o644, data: record.Bytes()})

	return writeAtomically(name, func(w *os.File) error {
		z := zip.NewWriter(w)
		for _, f := range files {
			h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: time.Unix(315532800, 0).UTC()}
			h.SetMode(f.mode) // the binaries' executable bits survive pip's unpacking
			fw, err := z.CreateHeader(h)
			if err != nil {
				return err
			}
			if _, err := fw.Write(f.data); err != nil {
				return err
			}
		}
		return z.Close()
	})
}

func writeSdist(name string, p project) error {
	top := fmt.Sprintf("%s-%s", pkgName, p.version)
	files, err := packageFiles(top + "/src")
	if err != nil {
		return err
	}
	for _, extra := range []string{"pyproject.toml", "README.md"} {
		data, err := os.ReadFile(filepath.Join(sdkDir, extra))
		if err != nil {
			return err
		}
		files = append(files, file{name: top + "/" + extra, mode: 0o644, data: data})
	}
	files = append(files, file{name: top + "/PKG-INFO", mode: 0o644, data: p.metadata()})
	return writeAtomically(name, func(w *os.File) error {
		gz := gzip.NewWriter(w)
		tw := tar.NewWriter(gz)
		for _, f := range files {
			if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: int64(f.mode), Size: int64(len(f.data)), Format: tar.FormatPAX, ModTime: time.Unix(315532800, 0)}); err != nil {
				return err
			}
			if _, err := tw.Write(f.data); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return gz.Close()
	})
}

// writeAtomically writes name through a temporary file, so that a failed build leaves
// no truncated distribution behind for pip to find.
func writeAtomically(name string, write func(*os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".dist-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
