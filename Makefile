# nook: build, run and test. Everything needs root (mounts, runc).
GO      ?= /usr/local/go/bin/go
BIN     := bin
DATA    ?= /var/lib/nook

# Every nook serve the tests start shares one cache of built-in template
# root filesystems, so each is built once per machine.
export NOOK_ROOTFS_CACHE ?= /var/lib/nook-rootfs-cache

.PHONY: build run deps test test-go test-e2e clean

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/nook ./cmd/nook
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/nook-agent ./cmd/nook-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/nook-interp ./cmd/nook-interp

# Installs what nook needs on Debian 12 (runc, mmdebstrap, ...).
deps:
	bash scripts/install-deps.sh

# Runs nook with its embedded defaults: API on :3000, proxy on :3002,
# template "base" built on first start.
run: deps build
	$(BIN)/nook serve --data-dir $(DATA)

# The whole test suite: Go tests (unit and root integration), then the
# end-to-end tests through the published e2b SDK against a live nook serve.
test: deps build test-go test-e2e

# Unit tests run in parallel; the root integration suites under test/ each
# start their own nook serve, so they run one package at a time.
test-go:
	$(GO) vet ./...
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /test/)
	$(GO) test -count=1 -p 1 -timeout 30m ./test/...

test-e2e:
	cd test/e2e && npm ci --no-audit --no-fund && bash run.sh

clean:
	rm -rf $(BIN)
