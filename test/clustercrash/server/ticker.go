package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentry/agentry/agent"
)

// Ticker is the agent of the schedule tests. Its HTTP op
// schedule?n=&after=&every=&beat= persists n one-shot schedules of Tick,
// the i-th due after+i*every milliseconds from now with the payload
// "{name}-{i}", and, when beat is set, one repeating schedule of Beat every
// beat milliseconds. Tick and Beat record each firing in the instance's own
// table ticks with the node that ran it and the time, read back by the op
// ticks. The write is fenced like every write of the instance, so a firing
// whose node no longer owned the instance is not recorded.
type Ticker struct {
	agent.Base
	node string
}

// tickerClass is the Ticker class of the node named node.
func tickerClass(node string) agent.Class {
	return agent.Class{Name: "Ticker", New: func() agent.Agent { return &Ticker{node: node} }, Public: true}
}

// OnStart creates the ledger of firings.
func (k *Ticker) OnStart(ctx context.Context) error {
	return k.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {ticks} (seq INTEGER PRIMARY KEY AUTOINCREMENT,
			id TEXT NOT NULL, node TEXT NOT NULL, at_us INTEGER NOT NULL)`)
		return err
	})
}

// Tick records a firing of the one-shot schedule id.
func (k *Ticker) Tick(ctx context.Context, id string) error { return k.record(ctx, id) }

// Beat records a firing of the repeating schedule.
func (k *Ticker) Beat(ctx context.Context) error { return k.record(ctx, "beat") }

func (k *Ticker) record(ctx context.Context, id string) error {
	return k.Storage().Update(ctx, func(s *agent.SQL) error {
		// The time is read inside the transaction, after the fence locked
		// the shard's lease row: the lease cannot change hands before the
		// commit.
		_, err := s.Exec(`INSERT INTO {ticks} (id, node, at_us) VALUES (?, ?, ?)`, id, k.node, time.Now().UnixMicro())
		return err
	})
}

// Firing is one recorded firing, as the op ticks returns it.
type Firing struct {
	ID   string `json:"id"`
	Node string `json:"node"`
	AtUS int64  `json:"atUs"`
}

// OnRequest serves schedule and ticks.
func (k *Ticker) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasSuffix(r.URL.Path, "/schedule"):
		q := r.URL.Query()
		n, err1 := strconv.Atoi(q.Get("n"))
		after, err2 := strconv.Atoi(q.Get("after"))
		every, err3 := strconv.Atoi(q.Get("every"))
		if err1 != nil || err2 != nil || err3 != nil || n < 0 || n > 1000 || after < 0 || every < 0 {
			http.Error(w, "bad n, after or every", http.StatusBadRequest)
			return
		}
		for i := range n {
			d := time.Duration(after+i*every) * time.Millisecond
			if _, err := k.ScheduleAfter(ctx, d, "Tick", fmt.Sprintf("%s-%d", k.Name(), i)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		if beat, err := strconv.Atoi(q.Get("beat")); err == nil && beat > 0 {
			if _, err := k.ScheduleEvery(ctx, time.Duration(beat)*time.Millisecond, "Beat", nil); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	case strings.HasSuffix(r.URL.Path, "/ticks"):
		out := []Firing{}
		err := k.Storage().View(ctx, func(s *agent.SQL) error {
			rows, err := s.Query(`SELECT id, node, at_us FROM {ticks} ORDER BY seq`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var f Firing
				if err := rows.Scan(&f.ID, &f.Node, &f.AtUS); err != nil {
					return err
				}
				out = append(out, f)
			}
			return rows.Err()
		})
		writeJSON(w, out, err)
	default:
		http.NotFound(w, r)
	}
}
