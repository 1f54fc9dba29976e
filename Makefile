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

# fuzz runs each fuzz target for a short fixed time (go test -fuzz takes one
# target at a time). Inputs that fail are written to the package's
# testdata/fuzz and then run by every go test.
FUZZTIME ?= 10s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzHandleFrame$$' -fuzztime $(FUZZTIME) ./agent
	$(GO) test -run '^$$' -fuzz '^FuzzParsePath$$' -fuzztime $(FUZZTIME) ./agent
	$(GO) test -run '^$$' -fuzz '^FuzzParseRoute$$' -fuzztime $(FUZZTIME) ./server
	$(GO) test -run '^$$' -fuzz '^FuzzToolInput$$' -fuzztime $(FUZZTIME) ./chat
	$(GO) test -run '^$$' -fuzz '^FuzzEncodeFrame$$' -fuzztime $(FUZZTIME) ./agenttool
	$(GO) test -run '^$$' -fuzz '^FuzzEncodeMatchesReference$$' -fuzztime $(FUZZTIME) ./chat/message
	$(GO) test -run '^$$' -fuzz '^FuzzAppendRaw$$' -fuzztime $(FUZZTIME) ./jsonenc
	$(GO) test -run '^$$' -fuzz '^FuzzRequest$$' -fuzztime $(FUZZTIME) ./mcpserver
	$(GO) test -run '^$$' -fuzz '^FuzzLeadingType$$' -fuzztime $(FUZZTIME) ./client

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
