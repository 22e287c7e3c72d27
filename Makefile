# The README's two set-up commands are `make hello` and `make test`.
.PHONY: hello test build vet

build:
	go build -o bin/ ./cmd/...

hello:
	bash scripts/hello.sh

test:
	bash scripts/test.sh

vet:
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	go vet ./...
