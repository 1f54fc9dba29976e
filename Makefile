# Agentry: `make test` runs every test (Go with -race, the real npm clients
# against the Go server). It installs the npm packages the tests need.
GO ?= go

.PHONY: test npm lint bench

test: npm
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...

npm:
	cd test/npm && npm ci --no-audit --no-fund --loglevel=error

lint:
	gofmt -l . | (! grep .)
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@latest ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
