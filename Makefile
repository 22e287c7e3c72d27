# The README's two set-up commands are `make hello` and `make test`.
.PHONY: hello test check build vet generate bench dist cluster cluster-down fuzz

# Static binaries: roche-agent runs inside sandboxes of any image, and roche and roched
# run on any Linux host (the wheels of make dist carry them, built with these flags, so
# that its build finds them in Go's cache). roche is the thin CLI, which hands what needs
# a provider in its own process to roched beside it, or, for a one-shot docker, oci or
# wasm command, to roche-run, which starts faster: install them together.
build:
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/ ./cmd/...

hello:
	bash scripts/hello.sh

# The Python SDK's wheels (x86_64 and aarch64, each carrying static roche, roched,
# roche-run and roche-agent) and its sdist, in dist/; written without the wheel package or a network.
dist:
	go run ./scripts/dist -out dist

test:
	bash scripts/test.sh

# The fast tier (scripts/check.sh): make vet, then every test that needs no root, engine,
# cluster, QEMU or python.wasm, with -race; as any user, installing nothing. The others
# skip, counted at the end; make test runs everything.
check:
	bash scripts/check.sh

# Every Go fuzz target (the *_fuzz_test.go files: tar extraction, agent frames, egress
# rules and requests, sizes, specs, API decoding, MCP) for FUZZTIME each, one at a time
# with one worker (scripts/fuzz.sh); FUZZ=REGEXP picks targets. make test runs each for 3 s.
FUZZTIME ?= 2m
fuzz:
	FUZZTIME=$(FUZZTIME) FUZZ='$(FUZZ)' bash scripts/fuzz.sh

# The test cluster (CONTRIBUTING.md, "The test cluster"): a real single-node Kubernetes 1.34 on this
# machine, built once and cached under ~/.cache/roche; prints the export KUBECONFIG=... line.
# Idempotent. KWOK=N also starts kwok with N fake nodes.
cluster:
	@bash scripts/k8s/cluster.sh up $(if $(KWOK),--kwok $(KWOK))

cluster-down:
	@bash scripts/k8s/cluster.sh down

# Medians and ratios against baselines measured in the same run (needs Docker and the
# test image; make test sets both up): exec and files through roche-agent, then the
# Docker provider on gVisor against runc (bench/runtime: cold create, exec, destroy;
# needs runsc registered, which make test does; RUNTIME_BENCH_FLAGS, e.g. '-n 5'), then
# roche exec -- true through roched against /bin/true (bench/cli: the CLI's cost per call;
# CLI_BENCH_FLAGS, e.g. '-n 30', or '-compare OLD_BINARY' for a before/after), then roched
# (bench/daemon: pool hit, pooled cycle, run_code cycles from a plain and a code=python
# pool, cold create, load; shorter with
# BENCH_FLAGS='-n 10 -duration 10s'), then the wasm provider through roched against
# docker run (bench/wasm: pooled cycle, warm and fresh exec, memory per idle sandbox;
# needs python.wasm; flags in WASM_BENCH_FLAGS, e.g. '-n 10'), then the Python SDK's
# exec against the Go client's on the same sandbox (bench/sdk; SDK_BENCH_FLAGS), then
# files.read/write of 100 MiB through roched (Go client, Python SDK) against the agent
# directly, roched's and the SDK's memory, watch event latency (bench/files;
# FILES_BENCH_FLAGS, e.g. '-n 3 -size 50m'), then
# 1,000 leased create+exec+destroy cycles through roched, reporting its memory,
# descriptors and goroutines before and after (bench/soak; SOAK_FLAGS, e.g. '-n 200').
# bench/e2b times create + run + kill through E2B's Python SDK against roched's E2B
# listener beside Roche's Python SDK, from one pool (E2B_BENCH_FLAGS, e.g. '-n 10').
# bench/oneshot times roche run with no roched, oci (root) and wasm, against docker run
# (ONESHOT_BENCH_FLAGS, e.g. '-n 10', or '-compare DIR' with an earlier build's binaries).
# bench/oci makes sandboxes with the oci provider (root; runc or crun) against the bare
# Engine API create+start: cold create, create+exec+destroy, memory per idle sandbox
# (OCI_BENCH_FLAGS, e.g. '-n 10').
# bench/kubernetes claims warm Pods through roched on the test cluster (make cluster),
# against a bare Pod start and a cold create in the same run (K8S_BENCH_FLAGS, e.g. '-n 5').
# bench/vm boots qemu microVMs (boot-to-agent-ready, create+exec+destroy, exec latency;
# needs QEMU and a Debian kernel, which make test installs; VM_BENCH_FLAGS, e.g. '-n 3').
# bench/k8sscale runs roched with 1,000 sandboxes on the test cluster's kwok nodes (it
# starts them: cluster.sh up --kwok 4): claims per second, claim latency, RSS, API-server
# requests per sandbox, reaping and a kill -9 restart (K8SSCALE_FLAGS, e.g. '-n 200').
# bench/egress times HTTPS through the egress proxy on loopback, direct, tunnelled and
# intercepted: added latency p50 and download MiB/s (EGRESS_BENCH_FLAGS, e.g. '-n 100').
bench:
	go run ./bench/exec
	go run ./bench/commands $(COMMANDS_BENCH_FLAGS)
	go run ./bench/runtime $(RUNTIME_BENCH_FLAGS)
	go run ./bench/cli $(CLI_BENCH_FLAGS)
	go run ./bench/daemon $(BENCH_FLAGS)
	go run ./bench/wasm $(WASM_BENCH_FLAGS)
	go run ./bench/oci $(OCI_BENCH_FLAGS)
	go run ./bench/oneshot $(ONESHOT_BENCH_FLAGS)
	go run ./bench/vm $(VM_BENCH_FLAGS)
	go run ./bench/kubernetes $(K8S_BENCH_FLAGS)
	go run ./bench/sdk $(SDK_BENCH_FLAGS)
	go run ./bench/e2b $(E2B_BENCH_FLAGS)
	go run ./bench/egress $(EGRESS_BENCH_FLAGS)
	go run ./bench/files $(FILES_BENCH_FLAGS)
	go run ./bench/soak $(SOAK_FLAGS)
	go run ./bench/k8sscale $(K8SSCALE_FLAGS)

# gofmt, go vet, staticcheck (pinned, from the Go module proxy) and a go.mod that
# `go mod tidy` would leave alone; make test runs it first.
STATICCHECK_VERSION = v0.8.2
vet:
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	go mod tidy -diff

# Regenerates api/roche/v1 and the TypeScript SDK's sdk/typescript/src/gen from
# sandbox.proto. The Go tools come from the Go module proxy at pinned versions
# (protoc-gen-go matches google.golang.org/protobuf in go.mod), protoc-gen-es from the
# TypeScript SDK's lockfile (npm ci).
generate:
	cd sdk/typescript && npm ci --no-audit --no-fund
	go install github.com/bufbuild/buf/cmd/buf@v1.70.0
	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
	cd api && PATH="$$(go env GOPATH)/bin:$$PATH" buf lint && PATH="$$(go env GOPATH)/bin:$$PATH" buf generate
	cd internal/e2b/envd && PATH="$$(go env GOPATH)/bin:$$PATH" buf generate
