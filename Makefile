# Agentry: `make test` runs every test (the lint checks, Go once at full
# speed and once with -race, the real npm clients against the Go server, the
# web playground in Chromium, then each fuzz target for FUZZTIME) and checks
# that the playground's committed bundle matches its sources and that go.mod
# is tidy. Some races only show at full speed, others only under -race. It installs the npm
# packages the tests need; the browser test needs Debian's chromium.
GO ?= go

.PHONY: test npm web lint bench fuzz faults

test: npm lint
	web/check-bundle.sh
	$(GO) test -count=1 -timeout 30m ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) --no-print-directory fuzz

# fuzz runs each fuzz target for a fixed number of inputs, about ten seconds
# of each on a 2-core machine (go test -fuzz takes one target at a time), or
# for FUZZTIME each when it is set (FUZZTIME=1m, FUZZTIME=1000000x). Counts,
# not durations: Go 1.26's fuzz coordinator can fail a target with a bare
# "context deadline exceeded" and no failing input when a duration ends
# while a worker is busy (golang/go#75804, fixed in Go 1.27; it failed a
# fresh-clone CI run once). Inputs that fail are written to the package's
# testdata/fuzz and then run by every go test.
FUZZTIME ?=
fuzztime = $(or $(FUZZTIME),$(1))
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzHandleFrame$$' -fuzztime $(call fuzztime,50000x) ./agent
	$(GO) test -run '^$$' -fuzz '^FuzzParsePath$$' -fuzztime $(call fuzztime,80000x) ./agent
	$(GO) test -run '^$$' -fuzz '^FuzzParseRoute$$' -fuzztime $(call fuzztime,40000x) ./server
	$(GO) test -run '^$$' -fuzz '^FuzzToolInput$$' -fuzztime $(call fuzztime,25000x) ./chat
	$(GO) test -run '^$$' -fuzz '^FuzzEncodeFrame$$' -fuzztime $(call fuzztime,30000x) ./agenttool
	$(GO) test -run '^$$' -fuzz '^FuzzEncodeMatchesReference$$' -fuzztime $(call fuzztime,400000x) ./chat/message
	$(GO) test -run '^$$' -fuzz '^FuzzAppendRaw$$' -fuzztime $(call fuzztime,400000x) ./jsonenc
	$(GO) test -run '^$$' -fuzz '^FuzzRequest$$' -fuzztime $(call fuzztime,30000x) ./mcpserver
	$(GO) test -run '^$$' -fuzz '^FuzzLeadingType$$' -fuzztime $(call fuzztime,80000x) ./client

# faults is the long form of the fault suite (docs/faults.md): each fault
# test FAULTS_COUNT times. Its counts go in RELIABILITY.md.
FAULTS_COUNT ?= 20
faults: export AGENTRY_FAULTS = 1
faults: npm
faults:
	$(GO) test -count=$(FAULTS_COUNT) -timeout 60m -run '^(TestUpdateWaitsOutRestart|TestLostCommitAnswer|TestCommitCutByServer|TestRetryLimitGivesUp)$$' ./store/postgres
	$(GO) test -count=$(FAULTS_COUNT) -timeout 60m -run '^TestFullDiskWaitsAndRecovers$$' ./store/sqlite
	$(GO) test -count=$(FAULTS_COUNT) -timeout 60m -run '^(TestTurnWaitsOutFullDisk|TestFullDiskRefusesNewAgents|TestRecoverContinueGoesOnFromCutText|TestRecoveredToolCallGetsFreshID|TestRecoverContinueKeepsToolStep)$$' ./chat
	$(GO) test -count=$(FAULTS_COUNT) -timeout 60m -run '^TestDefaultLeaseFailsOverWithinFiveSeconds$$' ./cluster
	$(GO) test -count=$(FAULTS_COUNT) -timeout 120m -run '^(TestPostgresRestartDuringFanOut|TestFailoverWithDefaultLease|TestSigtermHandsOver|TestNodeCutOffFromDatabase|TestNodeCutOffFromPeers|TestPausedOwnerWritesNothingAfterLosingItsLease|TestRollingRestart|TestNodeRefusesNewerSchema)$$' ./test/clustercrash
	$(GO) test -count=$(FAULTS_COUNT) -timeout 120m -run '^TestSoak$$' ./test/soakcrash

npm:
	cd test/npm && npm ci --no-audit --no-fund --loglevel=error
	cd web && npm ci --no-audit --no-fund --loglevel=error
	cd test/browser && npm ci --no-audit --no-fund --loglevel=error
	cd test/mcp && npm ci --no-audit --no-fund --loglevel=error

# web rebuilds the playground bundle (web/dist, committed and embedded).
web:
	cd web && npm ci --no-audit --no-fund --loglevel=error && npm run build

# lint: gofmt, go vet, staticcheck (a pinned release, so that a new one
# cannot break the build unannounced), go.mod/go.sum tidy, and no tracked
# file over 2 MiB except the embedded web bundle (.ci/large-files.sh).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	.ci/large-files.sh
	gofmt -l . | (! grep .)
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) mod tidy -diff

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
