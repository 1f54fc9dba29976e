package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// npmUsers are the users driven by the real npm clients: one node process
// each, running npm-user.mjs on its own instance. They start in two steps:
// startNPM starts the processes, at most npmBooting at once, each opening
// its tab and reporting ready; go starts their actions, so that the node
// processes' start-up, which takes a 2-core machine a minute at 100 users,
// is not inside the measured window.
type npmUsers struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	insts []*instance
	// ready is done once every user is ready or gone; goc is closed by
	// start.
	ready sync.WaitGroup
	goc   chan struct{}
	nOK   int
}

// npmBooting is how many node processes start at once.
func npmBooting() int { return 2 * runtime.NumCPU() }

// npmLine is one line npm-user.mjs prints.
type npmLine struct {
	Ready bool `json:"ready"`
	Turn  *struct {
		Action     string
		First, End float64
		Runs       int
	} `json:"turn"`
	Error *struct {
		Kind, Message string
	} `json:"error"`
	Done *struct {
		Sent, Answers []string
	} `json:"done"`
}

// startNPM starts n npm users, which each run actions for the configured
// duration from start on; the processes are killed when procs ends.
func startNPM(procs context.Context, g *gen, n int, logger *log.Logger) *npmUsers {
	u := &npmUsers{goc: make(chan struct{})}
	if n == 0 {
		return u
	}
	script, err := filepath.Abs(filepath.Join(g.cfg.NPMDir, "npm-user.mjs"))
	if err != nil {
		g.rec.fail("npm start", err)
		return u
	}
	boot := make(chan struct{}, npmBooting())
	u.ready.Add(n)
	for i := range n {
		name := fmt.Sprintf("%s-npm-%d", g.cfg.Prefix, i)
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			var once sync.Once
			isReady := func(ok bool) {
				once.Do(func() {
					if ok {
						u.mu.Lock()
						u.nOK++
						u.mu.Unlock()
					}
					<-boot
					u.ready.Done()
				})
			}
			select {
			case boot <- struct{}{}:
			case <-procs.Done():
				u.ready.Done()
				return
			}
			defer isReady(false)
			u.run(procs, g, script, name, i, isReady)
		}()
	}
	logger.Printf("%d npm users starting (node %s, %d at once)", n, script, npmBooting())
	return u
}

// run runs one npm user's process and records what it prints; isReady is
// called when the user is ready.
func (u *npmUsers) run(procs context.Context, g *gen, script, name string, i int, isReady func(bool)) {
	host := g.cfg.URLs[i%len(g.cfg.URLs)]
	if pu, err := url.Parse(host); err == nil && pu.Host != "" {
		host = pu.Host
	}
	cmd := exec.CommandContext(procs, "node", script, host, name, strconv.FormatInt(g.cfg.Duration.Milliseconds(), 10),
		strconv.FormatInt(g.cfg.Think.Milliseconds(), 10), g.cfg.Mix.String(), strconv.FormatInt(g.cfg.Seed+int64(i), 10), "wait")
	cmd.Dir = g.cfg.NPMDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		g.rec.fail("npm start", err)
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		g.rec.fail("npm start", err)
		return
	}
	if err := cmd.Start(); err != nil {
		g.rec.fail("npm start", fmt.Errorf("node %s: %w", script, err))
		return
	}
	in := newInstance(name)
	done := false
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var l npmLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch {
		case l.Ready:
			isReady(true)
			go func() {
				select {
				case <-u.goc:
					_, _ = io.WriteString(stdin, "go\n")
				case <-procs.Done():
				}
				_ = stdin.Close()
			}()
		case l.Turn != nil:
			g.rec.action("npm " + l.Turn.Action)
			g.rec.turn(time.Duration(l.Turn.First*float64(time.Millisecond)), 0, time.Duration(l.Turn.End*float64(time.Millisecond)), l.Turn.Runs)
		case l.Error != nil:
			g.rec.action("npm failed")
			g.failure(l.Error.Kind, errors.New(l.Error.Message))
		case l.Done != nil:
			in.sent, in.answers, done = l.Done.Sent, l.Done.Answers, true
		}
	}
	err = cmd.Wait()
	if err != nil || !done {
		g.rec.fail("npm exit", fmt.Errorf("node npm-user.mjs %s: %v: %s", name, err, lastLines(stderr.String(), 5)))
		return
	}
	u.mu.Lock()
	u.insts = append(u.insts, in)
	u.mu.Unlock()
}

// waitReady waits until every npm user is ready or gone, or ctx ends, and
// returns how many are ready.
func (u *npmUsers) waitReady(ctx context.Context) int {
	ch := make(chan struct{})
	go func() {
		u.ready.Wait()
		close(ch)
	}()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.nOK
}

// start lets the ready npm users start their actions.
func (u *npmUsers) start() { close(u.goc) }

// wait waits for the npm users and returns their instances, for the check.
func (u *npmUsers) wait() []*instance {
	u.wg.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.insts
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}
