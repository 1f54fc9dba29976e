# Agentry: `make test` runs every test (Go once at full speed and once with
# -race, the real npm clients against the Go server, the web playground in
# Chromium) and checks that the playground's committed bundle matches its
# sources. Some races only show at full speed, others only under -race. It installs the npm
# packages the tests need; the browser test needs Debian's chromium.
GO ?= go

.PHONY: test npm web lint bench

test: npm
	web/check-bundle.sh
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...
	$(GO) test -race -count=1 -timeout 30m ./...

npm:
	cd test/npm && npm ci --no-audit --no-fund --loglevel=error
	cd web && npm ci --no-audit --no-fund --loglevel=error
	cd test/browser && npm ci --no-audit --no-fund --loglevel=error

# web rebuilds the playground bundle (web/dist, committed and embedded).
web:
	cd web && npm ci --no-audit --no-fund --loglevel=error && npm run build

lint:
	gofmt -l . | (! grep .)
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@latest ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
