package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/client/agenttools"
	"github.com/agentry/agentry/internal/proccpu"
)

// npmBootTimeout bounds the wait for the npm users to be ready.
const npmBootTimeout = 5 * time.Minute

// gen is one run of the generator.
type gen struct {
	cfg Config
	hc  *http.Client
	rec *recorder
}

// failure records err under kind, or as a documented refusal when it is
// one (docs/limits.md): an upgrade refused with 503 (connection limit), a
// socket closed with 1013 (instance or send-queue limits), a chat request
// refused because too many are queued or too many turns are in flight.
// It reports whether err was a refusal of a chat request (whose message
// the server did not store).
func (g *gen) failure(kind string, err error) (refusedRequest bool) {
	var he *client.HTTPError
	var ce *client.CloseError
	// The refusals of a chat request are told by their text: a Go user
	// gets a *client.TurnError, an npm user the chat's error.
	msg := err.Error()
	switch {
	case errors.As(err, &he) && (he.StatusCode == http.StatusServiceUnavailable || he.StatusCode == http.StatusTooManyRequests):
		g.rec.refuse("upgrade-"+strconv.Itoa(he.StatusCode), err)
	case errors.As(err, &ce) && ce.Code == 1013:
		g.rec.refuse("close-1013", err)
	case strings.Contains(msg, "too many chat requests are queued"):
		g.rec.refuse("chat-queue-full", err)
		return true
	case strings.Contains(msg, "too many chat turns are in flight"):
		g.rec.refuse("turns-in-flight", err)
		return true
	case errors.As(err, &ce):
		g.rec.fail(fmt.Sprintf("%s: closed %d", kind, ce.Code), err)
	case errors.Is(err, context.DeadlineExceeded):
		g.rec.fail(kind+": timeout", err)
	default:
		g.rec.fail(kind, err)
	}
	return false
}

// Run runs the load described by cfg and checks the transcripts. Progress
// and, with cfg.Verbose, every error go to logw. The error is for a run
// that could not be done (a server that would not start); errors of the
// users are in the report.
func Run(ctx context.Context, cfg Config, logw io.Writer) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	logger := log.New(logw, "load: ", log.Ltime)
	if cfg.Serve {
		srv, err := serveDemo(ctx, cfg.Data, cfg.Delay, cfg.MaxTurns, cfg.Heavy > 0, cfg.HeavyRunning)
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		cfg.URLs = []string{srv.URL}
		cfg.PIDs = []int{os.Getpid()}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("load-%d", time.Now().Unix())
	}
	if cfg.Ramp == 0 {
		cfg.Ramp = min(cfg.Duration/4, time.Duration(cfg.Users)*10*time.Millisecond)
	}
	var rl *log.Logger
	if cfg.Verbose {
		rl = logger
	}
	g := &gen{cfg: cfg, rec: newRecorder(rl),
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}}}
	defer g.hc.CloseIdleConnections()

	nNPM := int(math.Round(float64(cfg.Users) * cfg.NPMShare))
	nGo := cfg.Users - nNPM
	nShared := int(math.Round(float64(nGo) * cfg.Shared))
	var insts []*instance
	users := make([]*user, nGo)
	for i := range users {
		var in *instance
		if i < nShared {
			if i%cfg.Group == 0 {
				in = newInstance(fmt.Sprintf("%s-shared-%d", cfg.Prefix, i/cfg.Group))
				insts = append(insts, in)
			}
			in = insts[len(insts)-1]
		} else {
			in = newInstance(fmt.Sprintf("%s-user-%d", cfg.Prefix, i))
			insts = append(insts, in)
		}
		users[i] = &user{g: g, id: i, inst: in, url: cfg.URLs[i%len(cfg.URLs)], rng: rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))),
			tr: agenttools.NewTracker(nil), wake: make(chan struct{}, 1)}
	}

	if cfg.Stuck > 0 {
		if len(insts) == 0 {
			return nil, fmt.Errorf("-stuck needs Go users to join")
		}
		st, err := openStuck(ctx, g, insts, cfg.Stuck)
		if err != nil {
			return nil, err
		}
		defer st.close()
	}
	// The npm users start first and the window once they are up: their
	// node processes' start-up is not measured.
	procs, stopProcs := context.WithCancel(ctx)
	defer stopProcs()
	npm := startNPM(procs, g, nNPM, logger)
	if nNPM > 0 {
		t0 := time.Now()
		bootCtx, cancel := context.WithTimeout(ctx, npmBootTimeout)
		n := npm.waitReady(bootCtx)
		cancel()
		logger.Printf("%d of %d npm users ready in %s", n, nNPM, time.Since(t0).Round(time.Millisecond))
	}
	rep := &Report{}
	rep.Load[0] = loadavg()
	smp := startSampler(cfg.PIDs, cfg.Serve, cfg.Debug, g.hc)
	cpu0, cpuErr := cpuOf(cfg.PIDs)
	logger.Printf("%d users (%d npm, %d on %d-user shared instances) against %s for %s", cfg.Users, nNPM, nShared, cfg.Group, strings.Join(cfg.URLs, ", "), cfg.Duration)

	start := time.Now()
	g.rec.mu.Lock()
	g.rec.until, g.rec.start = start.Add(cfg.Duration), start
	g.rec.mu.Unlock()
	runCtx, stopRun := context.WithTimeout(ctx, cfg.Duration)
	defer stopRun()
	// Work in flight at the end of the run finishes, within this bound.
	workCtx, stopWork := context.WithTimeout(ctx, cfg.Duration+cfg.TurnTimeout+30*time.Second)
	defer stopWork()
	stopAfter := context.AfterFunc(workCtx, stopProcs)
	defer stopAfter()
	memDone := writeHeapAfter(runCtx, cfg.MemProfile, logger)
	defer func() { <-memDone }()
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepCtx(runCtx, cfg.Ramp*time.Duration(i)/time.Duration(cfg.Users)) {
				return
			}
			u.loop(runCtx, workCtx)
		}()
	}
	npm.start()
	var heavy *heavyUser
	if cfg.Heavy > 0 {
		heavy = startHeavy(runCtx, workCtx, g, cfg.URLs[0], cfg.Heavy)
	}
	wg.Wait()
	npmInsts := npm.wait()
	if heavy != nil {
		rep.Heavy = heavy.wait()
	}
	rep.Elapsed = time.Since(start)
	logger.Printf("load done after %s; checking the transcripts", rep.Elapsed.Round(time.Millisecond))

	r := g.rec.report(rep.Elapsed)
	r.Load[0] = rep.Load[0]
	r.Heavy = rep.Heavy
	r.Load[1] = loadavg()
	r.Cores = runtime.NumCPU()
	r.NPMUsers = nNPM
	r.RSSPeak, r.Goroutines = smp.stop()
	r.RSSEnd = rssOf(cfg.PIDs)
	if cpu1, err := cpuOf(cfg.PIDs); err == nil && cpuErr == nil {
		r.CPU = cpu1 - cpu0
	}
	if cfg.Data != "" {
		r.DBBytes = dirSize(cfg.Data)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	r.Check = g.check(cctx, append(insts, npmInsts...))
	r.Config = cfg
	return r, nil
}

// writeHeapAfter writes the heap profile to path once ctx ends (nothing
// when path is empty); the returned channel is closed when it is written.
func writeHeapAfter(ctx context.Context, path string, logger *log.Logger) <-chan struct{} {
	done := make(chan struct{})
	if path == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		<-ctx.Done()
		f, err := os.Create(path)
		if err == nil {
			err = pprof.Lookup("heap").WriteTo(f, 0)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			logger.Printf("-memprofile: %v", err)
		}
	}()
	return done
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// sampler follows the server's RSS (and, in-process, the goroutines) while
// the load runs.
type sampler struct {
	stopc chan struct{}
	done  chan struct{}
	rss   int64
	gor   int
}

func startSampler(pids []int, inProcess bool, debug []string, hc *http.Client) *sampler {
	s := &sampler{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			s.rss = max(s.rss, rssOf(pids))
			if inProcess {
				s.gor = max(s.gor, runtime.NumGoroutine())
			}
			if len(debug) > 0 && i%4 == 0 {
				// Every 2 s: a goroutine profile costs the server a little.
				s.gor = max(s.gor, goroutinesOf(hc, debug))
			}
			select {
			case <-t.C:
			case <-s.stopc:
				return
			}
		}
	}()
	return s
}

func (s *sampler) stop() (rss int64, goroutines int) {
	close(s.stopc)
	<-s.done
	return s.rss, s.gor
}

// goroutinesOf sums the goroutines the servers' profiles report
// (/debug/pprof/goroutine?debug=1 starts "goroutine profile: total N"); 0
// when one does not answer.
func goroutinesOf(hc *http.Client, debug []string) int {
	n := 0
	for _, d := range debug {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d+"/debug/pprof/goroutine?debug=1", nil)
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			return 0
		}
		line, _ := bufio.NewReader(io.LimitReader(resp.Body, 256)).ReadString('\n')
		resp.Body.Close()
		cancel()
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "goroutine profile: total ")
		g, err := strconv.Atoi(v)
		if !ok || err != nil {
			return 0
		}
		n += g
	}
	return n
}

// cpuOf returns the CPU time the processes spent, summed.
func cpuOf(pids []int) (time.Duration, error) {
	var t time.Duration
	for _, p := range pids {
		d, err := proccpu.Process(p, false)
		if err != nil {
			return 0, err
		}
		t += d
	}
	return t, nil
}

// rssOf returns the processes' resident set sizes, summed.
func rssOf(pids []int) int64 {
	var n int64
	for _, p := range pids {
		n += rss(p)
	}
	return n
}

// rss returns a process's resident set size from /proc, 0 if unknown.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// dirSize is the size of the regular files under dir (the database, its
// WAL and shared memory).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
