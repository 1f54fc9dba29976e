package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// npmUsers are the users driven by the real npm clients: one node process
// each, running npm-user.mjs on its own instance.
type npmUsers struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	insts []*instance
}

// npmLine is one line npm-user.mjs prints.
type npmLine struct {
	Turn *struct {
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

// startNPM starts n npm users; they start actions until run ends (the
// script is given the time left) and are killed when work ends.
func startNPM(run, work context.Context, g *gen, n int, logger *log.Logger) *npmUsers {
	u := &npmUsers{}
	if n == 0 {
		return u
	}
	script, err := filepath.Abs(filepath.Join(g.cfg.NPMDir, "npm-user.mjs"))
	if err != nil {
		g.rec.fail("npm start", err)
		return u
	}
	dl, _ := run.Deadline()
	for i := range n {
		name := fmt.Sprintf("%s-npm-%d", g.cfg.Prefix, i)
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			host := g.cfg.URLs[i%len(g.cfg.URLs)]
			if pu, err := url.Parse(host); err == nil && pu.Host != "" {
				host = pu.Host
			}
			left := time.Until(dl)
			cmd := exec.CommandContext(work, "node", script, host, name, strconv.FormatInt(left.Milliseconds(), 10),
				strconv.FormatInt(g.cfg.Think.Milliseconds(), 10), g.cfg.Mix.String(), strconv.FormatInt(g.cfg.Seed+int64(i), 10))
			cmd.Dir = g.cfg.NPMDir
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
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
		}()
	}
	logger.Printf("%d npm users started (node %s)", n, script)
	return u
}

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
