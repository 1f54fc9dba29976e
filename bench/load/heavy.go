package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// maxHeavy bounds a fan-out of the heavy user (-heavy).
const maxHeavy = 10000

// fanParent is the heavy user's agent (-heavy, in-process only): a chat
// agent whose HTTP operation fan-out?n= dispatches n of the demo's
// Researcher runs at once, with no cap refusing any (the demo's Assistant
// refuses past four), as a Go application may do; at most running of
// them execute at once (-heavy-running), the others wait for a slot.
type fanParent struct {
	chat.Base
	m       model.Model
	running int
}

// ChatModel is never asked: the fan-out runs without a turn.
func (f *fanParent) ChatModel() model.Model { return f.m }

// MaxRunningAgentTools bounds the fan-out's runs executing at once (zero:
// the runtime's default).
func (f *fanParent) MaxRunningAgentTools() int { return f.running }

// fanClass is the agent class of the heavy user.
func fanClass(running int) agent.Class {
	m := scripted.New(scripted.WithMaxCalls(-1))
	return agent.Class{Name: "Fan", Public: true, New: func() agent.Agent { return &fanParent{m: m, running: running} }}
}

// OnRequest serves GET …/fan-out?n=: n awaited Researcher runs, answered
// with their statuses counted.
func (f *fanParent) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 1 || n > maxHeavy {
		http.Error(w, fmt.Sprintf("n must be 1 to %d", maxHeavy), http.StatusBadRequest)
		return
	}
	statuses := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Each run is an input of its own (docs/concurrency.md): its goroutine
	// enters the gate itself, and the request waits at an await point.
	gctx := agent.Unheld(ctx)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := agenttool.RunAgentTool(gctx, f, "Researcher", agenttool.RunOptions{
				Input: agentsastools.ResearchInput{Query: fmt.Sprintf("heavy topic %d", i)}})
			status := string(res.Status)
			if err != nil {
				status = "go-error"
			}
			mu.Lock()
			statuses[status]++
			mu.Unlock()
		}()
	}
	_ = agent.Await(ctx, func() error { wg.Wait(); return nil })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(statuses)
}

// heavyUser repeats fan-outs of n children on one Fan instance until ctx
// ends (the load's window), each awaited to its end within work.
type heavyUser struct {
	done chan struct{}
	res  HeavyResult
}

// HeavyResult is what the heavy user did: its fan-outs answered, the
// longest of them, and its runs by status.
type HeavyResult struct {
	FanOuts  int
	Longest  time.Duration
	Statuses map[string]int
}

func (r HeavyResult) String() string {
	return fmt.Sprintf("%d fan-outs done, the longest %s; runs by status %v", r.FanOuts, ms(r.Longest), r.Statuses)
}

// startHeavy starts the heavy user against base (the in-process server).
// Its failures are the report's errors, of kind "heavy".
func startHeavy(ctx, work context.Context, g *gen, base string, n int) *heavyUser {
	h := &heavyUser{done: make(chan struct{}), res: HeavyResult{Statuses: map[string]int{}}}
	go func() {
		defer close(h.done)
		url := fmt.Sprintf("%s/agents/fan/heavy/fan-out?n=%d", base, n)
		for ctx.Err() == nil {
			t0 := time.Now()
			st, err := h.fanOut(work, g.hc, url)
			if err != nil {
				g.rec.fail("heavy", err)
				// Not in a tight loop: a second before the next.
				if !sleepCtx(ctx, time.Second) {
					return
				}
				continue
			}
			h.res.FanOuts++
			h.res.Longest = max(h.res.Longest, time.Since(t0))
			for k, v := range st {
				h.res.Statuses[k] += v
			}
			if st["completed"] != n {
				// A run that did not complete is an error of the load,
				// not only a count in its line.
				g.rec.fail("heavy", fmt.Errorf("heavy fan-out of %d: runs by status %v", n, st))
			}
		}
	}()
	return h
}

func (h *heavyUser) fanOut(ctx context.Context, hc *http.Client, url string) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("heavy fan-out: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("heavy fan-out: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("heavy fan-out: %d %s", resp.StatusCode, body)
	}
	var st map[string]int
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("heavy fan-out: %w", err)
	}
	return st, nil
}

// wait waits for the heavy user's last fan-out and returns what it did.
func (h *heavyUser) wait() *HeavyResult {
	<-h.done
	return &h.res
}
