package clustercrash

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/store/postgres"
)

// post sends an empty POST to a node and fails the test unless it is
// answered 2xx (a 503 is asked again, see askAgain).
func post(t *testing.T, host, path string) {
	t.Helper()
	c := &http.Client{Timeout: 60 * time.Second}
	status, body, err := askAgain(t, "POST "+path, func() (*http.Response, error) {
		return c.Post("http://"+host+path, "application/json", nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if status/100 != 2 {
		t.Fatalf("POST %s: %d %s", path, status, body)
	}
}

// tickerName returns a Ticker name among tick{from}, tick{from+1}, …
// whose shard owner is id.
func (e *env) tickerName(id string, from int) string {
	e.t.Helper()
	own := e.owners()
	for i := from; i < from+100000; i++ {
		name := fmt.Sprint("tick", i)
		if own[cluster.ShardOf(agent.Path{{Class: "Ticker", Name: name}}, cluster.DefaultShards)] == id {
			return name
		}
	}
	e.t.Fatal("no name")
	return ""
}

// firing is one recorded firing of a Ticker schedule.
type firing struct {
	id, node, name string
	at             time.Time
}

// firings reads every recorded firing of the Tickers, in order.
func (e *env) firings() []firing {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), fmt.Sprintf(`SELECT t.id, t.node, t.at_us, i.name FROM %s t
		JOIN instances i ON i.id = t.agentry_instance ORDER BY t.at_us`, postgres.SharedTable("Ticker", "ticks")))
	if err != nil {
		return nil // no Ticker started yet
	}
	defer rows.Close()
	var out []firing
	for rows.Next() {
		var f firing
		var us int64
		if err := rows.Scan(&f.id, &f.node, &us, &f.name); err != nil {
			e.t.Fatal(err)
		}
		f.at = time.UnixMicro(us)
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestSchedulesFireOnceOnTheOwner persists one-shot schedules and a
// repeating one on Ticker instances owned by each of three nodes, and kills
// (SIGKILL) one owner while its one-shots come due. Every one-shot fires,
// each on the node that held its instance's lease at that moment; one
// fires twice only when the killed node's firing committed and it died
// before it deleted the schedule (at least once), never after the
// deletion committed, and never twice on a node that lived. The killed
// node's instances go on firing, their repeating schedules too, on the
// nodes that took them over.
func TestSchedulesFireOnceOnTheOwner(t *testing.T) {
	e := newEnv(t)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		e.start(id)
	}
	e.balanced(ids...)
	initial := e.logLeases()
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE schedule_done (payload TEXT, at TIMESTAMPTZ)`,
		`CREATE FUNCTION log_schedule_done() RETURNS trigger AS $$ BEGIN
			INSERT INTO schedule_done VALUES (OLD.payload, clock_timestamp()); RETURN OLD; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER schedule_done AFTER DELETE ON schedules FOR EACH ROW EXECUTE FUNCTION log_schedule_done()`,
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	// Two instances per node, each with n one-shots due 0.6 s to 4.1 s
	// from now and a beat every 250 ms, created through a node that does
	// not own the instance.
	const n = 8
	owner := map[string]string{} // instance → node
	var names []string
	for i, id := range ids {
		for k := range 2 {
			name := e.tickerName(id, 1000*(2*i+k))
			owner[name] = id
			names = append(names, name)
			via := e.nodes[ids[(i+1)%len(ids)]].Host
			post(t, via, fmt.Sprintf("/agents/ticker/%s/schedule?n=%d&after=600&every=500&beat=250", name, n))
		}
	}

	// Kill c once a few of its one-shots fired there, while others are
	// still to come.
	const victim = "c"
	firedOn := func(node string) int {
		k := 0
		for _, f := range e.firings() {
			if f.node == node && f.id != "beat" && owner[f.name] == node {
				k++
			}
		}
		return k
	}
	e.until(60*time.Second, "three one-shots fired on "+victim, func() bool { return firedOn(victim) >= 3 })
	_ = e.nodes[victim].Kill()
	killedAt := time.Now()
	delete(e.nodes, victim)
	left := e.count(`SELECT count(*) FROM schedules s JOIN instances i ON i.id = s.instance_id
		WHERE s.method = 'Tick' AND i.name = ANY($1)`, namesOf(owner, victim))
	t.Logf("killed %s after %d of its one-shots fired; %d left", victim, firedOn(victim), left)
	if left == 0 {
		t.Fatalf("every one-shot of %s fired before the kill: the test checks nothing", victim)
	}

	// Every one-shot fires, and the killed node's instances beat again on
	// the nodes that took them.
	e.until(120*time.Second, "every one-shot fired and deleted", func() bool {
		return e.count(`SELECT count(*) FROM schedules WHERE method = 'Tick'`) == 0
	})
	e.until(60*time.Second, "the killed node's instances beating elsewhere", func() bool {
		beat := map[string]bool{}
		for _, f := range e.firings() {
			if f.id == "beat" && f.node != victim && f.at.After(killedAt) {
				beat[f.name] = true
			}
		}
		for _, name := range namesOf(owner, victim) {
			if !beat[name] {
				return false
			}
		}
		return true
	})

	all := e.firings()
	byID := map[string][]firing{}
	for _, f := range all {
		if f.id != "beat" {
			byID[f.id] = append(byID[f.id], f)
		}
	}
	done := map[string]time.Time{}
	rows, err := e.pool.Query(ctx, `SELECT payload, at FROM schedule_done WHERE payload IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var payload string
		var at time.Time
		if err := rows.Scan(&payload, &at); err != nil {
			t.Fatal(err)
		}
		var id string
		if json.Unmarshal([]byte(payload), &id) == nil {
			done[id] = at
		}
	}
	rows.Close()

	again, moved := 0, 0
	for _, name := range names {
		for i := range n {
			id := fmt.Sprintf("%s-%d", name, i)
			fs := byID[id]
			switch {
			case len(fs) == 0:
				t.Errorf("%s never fired", id)
				continue
			case len(fs) > 1:
				// At least once: only a firing of the killed node may be
				// followed by another, on the node that took over.
				again++
				if len(fs) > 2 || fs[0].node != victim || fs[1].node == victim {
					t.Errorf("%s fired %d times: %v", id, len(fs), fs)
				}
			}
			if fs[len(fs)-1].node != owner[name] {
				moved++
			}
			if at, ok := done[id]; !ok {
				t.Errorf("%s: its schedule was never deleted", id)
			} else if last := fs[len(fs)-1]; last.at.After(at) {
				t.Errorf("%s fired on %s at %s, after its schedule was deleted at %s", id, last.node,
					last.at.Format("15:04:05.000000"), at.Format("15:04:05.000000"))
			}
		}
	}
	if moved == 0 {
		t.Errorf("no one-shot of %s fired on another node after the kill", victim)
	}

	// Each firing, one-shot or beat, ran on the node that held the
	// instance's lease at that moment.
	h := e.leases(initial)
	wrong := 0
	for _, f := range all {
		s := cluster.ShardOf(agent.Path{{Class: "Ticker", Name: f.name}}, cluster.DefaultShards)
		if ok, holder := h.heldBy(s, f.at, f.node); !ok {
			wrong++
			if wrong <= 10 {
				t.Errorf("%s fired on %s at %s while shard %d belonged to %q", f.id, f.node, f.at.Format("15:04:05.000000"), s, holder)
			}
		}
	}
	t.Logf("%d firings (%d one-shots of %d, %d moved to a new owner, %d fired again after the kill), %d off their owner",
		len(all), len(byID), len(names)*n, moved, again, wrong)
}

// namesOf returns the instances owner gives to node, in order.
func namesOf(owner map[string]string, node string) []string {
	var out []string
	for name, o := range owner {
		if o == node {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
