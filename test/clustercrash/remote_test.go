package clustercrash

// Agents as tools when the parent and the child are on different nodes:
// detached runs (dispatch, delivery once, cancel, recovery after the
// parent's node restarts), progress and milestones, drill-in through the
// parent's gate, clear of children resident on other nodes, and the
// LISTEN/NOTIFY wake-up of followers with polling as the fallback.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// startWith starts node id with extra server flags.
func (e *env) startWith(id string, extra ...string) *testenv.Process {
	e.t.Helper()
	args := append([]string{"-postgres", e.url, "-node-id", id, "-lease", lease(), "-delay", "10ms"}, extra...)
	p := testenv.StartProcess(e.t, 60*time.Second, bin.Path(e.t), args...)
	e.nodes[id] = p
	return p
}

// three starts nodes a, b and c with extra flags and waits for balanced
// shards.
func (e *env) three(extra ...string) (a, b, c *testenv.Process) {
	a, b, c = e.startWith("a", extra...), e.startWith("b", extra...), e.startWith("c", extra...)
	e.balanced("a", "b", "c")
	return a, b, c
}

// tagOn returns a tag whose run tag-0 of class under the fan name has its
// child on node id.
func (e *env) tagOn(name, class, prefix, id string) string {
	e.t.Helper()
	own := e.owners()
	parent := agent.Path{{Class: "Fan", Name: name}}
	for i := range 100000 {
		tag := fmt.Sprint(prefix, i)
		if own[cluster.ShardOf(parent.Child(class, tag+"-0"), cluster.DefaultShards)] == id {
			return tag
		}
	}
	e.t.Fatal("no tag")
	return ""
}

// fetch sends a request and returns its status and body.
func fetch(t *testing.T, method, url string, header http.Header, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// resident asks node host whether it holds the instance at path in memory.
func resident(t *testing.T, host string, path agent.Path) bool {
	t.Helper()
	var out map[string]bool
	if err := get(t, host, "/debug/resident?path="+path.String(), &out); err != nil {
		t.Fatal(err)
	}
	return out["resident"]
}

// detachedLedger reads the Fan's OnFinish ledger of detached runs.
func (e *env) detachedLedger(host, name string) map[string]int {
	var fin map[string]int
	if err := get(e.t, host, "/agents/fan/"+name+"/detached-ledger", &fin); err != nil {
		return nil
	}
	return fin
}

// TestRemoteDetachedRuns dispatches detached runs from a parent on a to
// children on every node: each run completes and its OnFinish is delivered
// exactly once. A detached run on c is then canceled from the parent: the
// child's owner aborts it, and the abort is delivered once.
func TestRemoteDetachedRuns(t *testing.T) {
	e := newEnv(t)
	a, b, _ := e.three("-step", "300ms")
	name := e.fanName("a")
	const n = 30
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/detached?n=%d&tag=d&class=Worker", name, n), &st); err != nil {
		t.Fatal(err)
	}
	if st["running"] != n {
		t.Fatalf("detached dispatch: %v, want %d running", st, n)
	}
	e.spread(name, "d", n, "a", "b", "c")
	// The delivery is marked after OnFinish returned: wait for the marks.
	e.until(60*time.Second, "every detached run delivered", func() bool {
		return e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE 'd-%' AND finish_delivered_at IS NOT NULL`) == n
	})
	if fin := e.detachedLedger(a.Host, name); fin["repeated"] != 0 || fin["status:completed"] != n || fin["runs"] != n {
		t.Errorf("detached ledger %v, want %d completed once each", fin, n)
	}
	if got := e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE 'd-%' AND status = 'completed'`); got != n {
		t.Errorf("%d of %d runs completed", got, n)
	}

	// Cancel: a Prog child on c (about 1.5 s of work) is aborted by its
	// owner on the parent's cancel.
	tag := e.tagOn(name, "Prog", "dc", "c")
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/detached?n=1&tag=%s&class=Prog", name, tag), &st); err != nil || st["running"] != 1 {
		t.Fatalf("detached dispatch: %v %v", st, err)
	}
	run := tag + "-0"
	e.until(30*time.Second, "the Prog child started", func() bool {
		return e.count(`SELECT count(*) FROM agent_tool_child_runs WHERE run_id = $1`, run) == 1
	})
	var none map[string]string
	if err := get(t, b.Host, "/agents/fan/"+name+"/cancel?id="+run, &none); err != nil {
		t.Fatal(err)
	}
	if got := e.count(`SELECT count(*) FROM agent_tool_child_runs WHERE run_id = $1 AND status = 'aborted' AND completed_at IS NOT NULL`, run); got != 1 {
		t.Errorf("the child's record of the canceled run is not aborted")
	}
	if got := e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id = $1 AND status = 'aborted'`, run); got != 1 {
		t.Errorf("the canceled run is not aborted in the registry")
	}
	e.until(30*time.Second, "the abort delivered", func() bool { return e.detachedLedger(a.Host, name)["status:aborted"] == 1 })
	if fin := e.detachedLedger(a.Host, name); fin["repeated"] != 0 || fin["runs"] != n+1 {
		t.Errorf("detached ledger after the cancel: %v", fin)
	}
}

// TestRemoteDetachedRecoveryAfterParentRestart kills the parent's node
// while its detached runs work on the other nodes, and starts it again:
// the parent's new owner follows the runs again, and each run's OnFinish is
// delivered exactly once.
func TestRemoteDetachedRecoveryAfterParentRestart(t *testing.T) {
	e := newEnv(t)
	_, b, _ := e.three("-step", "1s")
	name := e.fanName("a")
	const n = 12
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/detached?n=%d&tag=r&class=Prog", name, n), &st); err != nil || st["running"] != n {
		t.Fatalf("detached dispatch: %v %v", st, err)
	}
	// Each child works about 5 s: none has finished, so no delivery can
	// be cut by the kill (a cut delivery may repeat: at least once).
	done := e.childrenDone("r")
	_ = e.nodes["a"].Kill()
	delete(e.nodes, "a")
	if done != 0 {
		t.Fatalf("%d children finished before the kill: the children are too fast for this test", done)
	}
	e.startWith("a", "-step", "1s")
	var last map[string]int
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the detached ledger last read: %v; children done: %d", last, e.childrenDone("r"))
		}
	})
	e.until(90*time.Second, "every detached run delivered", func() bool {
		if fin := e.detachedLedger(b.Host, name); fin != nil {
			last = fin
		}
		return last["runs"] == n
	})
	if fin := e.detachedLedger(b.Host, name); fin["repeated"] != 0 || fin["status:completed"] != n {
		t.Errorf("detached ledger %v, want %d completed once each", fin, n)
	}
	if twice := e.count(`SELECT count(*) FROM (SELECT s.instance_id FROM chat_streams s JOIN instances i ON i.id = s.instance_id
		WHERE i.class = 'Prog' AND i.name LIKE 'r-%' GROUP BY s.instance_id HAVING count(*) > 1) x`); twice != 0 {
		t.Errorf("%d children ran more than one turn", twice)
	}
}

// frame is a server frame as the tests read it: testenv.WireFrame,
// the tests' one frame type.
type frame = testenv.WireFrame

// signalOf names a chunk body that is progress ("p:<fraction>") or a
// milestone ("m:<name>"), or returns "".
func signalOf(body string) string {
	var c struct {
		Type string `json:"type"`
		Data struct {
			Fraction *float64 `json:"fraction"`
			Name     string   `json:"name"`
		} `json:"data"`
	}
	if json.Unmarshal([]byte(body), &c) != nil {
		return ""
	}
	switch c.Type {
	case "data-agent-progress":
		if c.Data.Fraction == nil {
			return "p:"
		}
		return fmt.Sprint("p:", *c.Data.Fraction)
	case "data-agent-milestone":
		return "m:" + c.Data.Name
	}
	return ""
}

// TestRemoteProgressReachesParent runs a Prog child on c for a parent on
// a, with a client of the parent connected through b: the child's progress
// and milestones reach the client's frames and the parent's OnProgress in
// order, each once, and the milestones are stored. A detached Prog run on
// c gets its milestone notice in the parent's chat once.
func TestRemoteProgressReachesParent(t *testing.T) {
	e := newEnv(t)
	_, b, _ := e.three()
	name := e.fanName("a")
	run := e.tagOn(name, "Prog", "pr", "c") + "-0"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ws := testenv.DialWS[frame](t, 90*time.Second, "ws://"+b.Host+"/agents/fan/"+name)
	var res map[string]any
	if err := get(t, b.Host, "/agents/fan/"+name+"/run?class=Prog&id="+run, &res); err != nil {
		t.Fatal(err)
	}
	if res["status"] != "completed" {
		t.Fatalf("run: %v", res)
	}
	isEnd := func(f testenv.Frame[frame]) bool {
		return f.Value.Type == wire.AgentToolEvent && f.Value.Event.RunID == run && f.Value.Event.Kind == "finished"
	}
	frames, err := ws.Wait(ctx, func(fs []testenv.Frame[frame]) bool { return slices.ContainsFunc(fs, isEnd) })
	if err != nil {
		t.Fatalf("waiting for the run's end event: %v", err)
	}
	want := []string{"p:0.25", "m:half", "p:0.5", "m:most", "p:1"}
	var got []string
	seqs := map[int64]bool{}
	for _, fr := range frames[:slices.IndexFunc(frames, isEnd)] {
		f := fr.Value
		if f.Type != wire.AgentToolEvent || f.Event.RunID != run || f.Event.Kind != "chunk" {
			continue
		}
		if seqs[f.Sequence] {
			t.Errorf("frame sequence %d twice", f.Sequence)
		}
		seqs[f.Sequence] = true
		if s := signalOf(f.Event.Body); s != "" {
			got = append(got, s)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the client's progress frames: %v, want %v", got, want)
	}
	var seen []string
	if err := get(t, b.Host, "/agents/fan/"+name+"/progress?id="+run, &seen); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, want) {
		t.Errorf("the parent's OnProgress: %v, want %v", seen, want)
	}
	if n := e.count(`SELECT count(*) FROM agent_tool_milestones WHERE run_id = $1`, run); n != 2 {
		t.Errorf("%d milestones stored, want 2", n)
	}

	// Detached: the milestone "half" is noticed in the parent's chat once.
	tag := e.tagOn(name, "Prog", "pd", "c")
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/detached?n=1&tag=%s&class=Prog", name, tag), &st); err != nil || st["running"] != 1 {
		t.Fatalf("detached dispatch: %v %v", st, err)
	}
	e.until(60*time.Second, "the detached run delivered", func() bool { return e.detachedLedger(b.Host, name)["runs"] == 1 })
	if n := e.count(`SELECT count(*) FROM chat_messages WHERE id = $1`, "detached-ms:"+tag+"-0:half"); n != 1 {
		t.Errorf("%d milestone notices in the parent's chat, want 1", n)
	}
	seen = nil
	if err := get(t, b.Host, "/agents/fan/"+name+"/progress?id="+tag+"-0", &seen); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, want) {
		t.Errorf("the parent's OnProgress of the detached run: %v, want %v", seen, want)
	}
}

// TestRemoteDrillIn opens a child's routes through a node that owns
// neither the child (c) nor its parent (a): the parent's OnBeforeSubAgent
// decides, over a node-to-node call, and an admitted client sees the
// child's transcript over HTTP and its socket, and the live stream of a
// run in flight. The node-to-node calls
// refuse requests without the cluster's secret and answer bad input with
// 400.
func TestRemoteDrillIn(t *testing.T) {
	e := newEnv(t)
	_, b, c := e.three("-step", "1s")
	name := e.fanName("a")
	run := e.tagOn(name, "Worker", "di", "c") + "-0"
	var res map[string]any
	if err := get(t, b.Host, "/agents/fan/"+name+"/run?class=Worker&id="+run, &res); err != nil || res["status"] != "completed" {
		t.Fatalf("run: %v %v", res, err)
	}
	route := "http://" + b.Host + "/agents/fan/" + name + "/sub/worker/" + run
	if code, body := fetch(t, "GET", route+"/get-messages", nil, nil); code != http.StatusForbidden || !strings.Contains(body, "refused by the parent") {
		t.Errorf("drill-in without leave: %d %q, want 403 from the parent", code, body)
	}
	if code, body := fetch(t, "GET", route+"/get-messages?drill=yes", nil, nil); code != http.StatusOK || !strings.Contains(body, "done done") {
		t.Errorf("drill-in with leave: %d %q, want the child's transcript", code, body)
	}
	// A run the registry does not hold is not found (the registry's gate).
	if code, _ := fetch(t, "GET", "http://"+b.Host+"/agents/fan/"+name+"/sub/worker/agent-tool:nope/get-messages?drill=yes", nil, nil); code != http.StatusNotFound {
		t.Errorf("drill-in to an unknown run: %d, want 404", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, resp, err := testenv.TryDialWS[frame](t, 60*time.Second, "ws"+strings.TrimPrefix(route, "http"), nil); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("socket without leave: %v %v, want 403", resp, err)
	}
	ws := testenv.DialWS[frame](t, 60*time.Second, "ws"+strings.TrimPrefix(route, "http")+"?drill=yes")
	fs, err := ws.Wait(ctx, func(fs []testenv.Frame[frame]) bool {
		return len(fs) > 0 && fs[len(fs)-1].Value.Type == wire.ChatMessages
	})
	if err != nil {
		t.Fatalf("the child's socket ended before its transcript: %v", err)
	}
	if msgs := fs[len(fs)-1].Value.Messages; !strings.Contains(string(msgs), "done done") {
		t.Errorf("child transcript %s", msgs)
	}
	ws.CloseNormally()

	// A run streaming on c (a detached Prog child, about 5 s of steps):
	// the admitted socket gets its live stream.
	tag := e.tagOn(name, "Prog", "ds", "c")
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/detached?n=1&tag=%s&class=Prog", name, tag), &st); err != nil || st["running"] != 1 {
		t.Fatalf("detached dispatch: %v %v", st, err)
	}
	live := "ws://" + b.Host + "/agents/fan/" + name + "/sub/prog/" + tag + "-0?drill=yes"
	lws := testenv.DialWS[wire.ChatResponseFrame](t, 60*time.Second, live)
	var stream strings.Builder
	for done := false; !done; {
		fr, err := lws.Next(ctx)
		if err != nil {
			t.Fatalf("the child's socket ended before its stream did: %v", err)
		}
		if fr.Err != nil {
			continue
		}
		switch f := fr.Value; f.Type {
		case wire.StreamResuming:
			if err := lws.SendContext(ctx, map[string]string{"type": wire.StreamResumeAck, "id": f.ID}); err != nil {
				t.Fatal(err)
			}
		case wire.ChatResponse:
			stream.WriteString(f.Body)
			done = f.Done
		case wire.ChatMessages:
			if strings.Contains(string(fr.Raw), "finished the work") && stream.Len() == 0 {
				t.Fatalf("the run ended before the socket connected: the test's child is too fast")
			}
		}
	}
	if !strings.Contains(stream.String(), "finished the work") || !strings.Contains(stream.String(), "data-agent-milestone") {
		t.Errorf("the child's stream through b: %s", stream.String())
	}
	lws.CloseNormally()

	// The node-to-node calls: no secret, a wrong secret, bad input.
	peer := "http://" + c.Host + cluster.PeerPrefix
	if code, _ := fetch(t, "POST", peer+"check-sub-agent", nil, []byte(`{}`)); code != http.StatusForbidden {
		t.Errorf("peer call without the secret: %d, want 403", code)
	}
	if code, _ := fetch(t, "POST", peer+"destroy-child", http.Header{"X-Agentry-Cluster-Secret": {"guess"}}, []byte(`{}`)); code != http.StatusForbidden {
		t.Errorf("peer call with a wrong secret: %d, want 403", code)
	}
	var secret string
	if err := e.pool.QueryRow(context.Background(), `SELECT value FROM cluster_config WHERE key = 'peer_secret'`).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	auth := http.Header{"X-Agentry-Cluster-Secret": {secret}}
	for _, tc := range []struct{ op, body string }{
		{"check-sub-agent", `{"path":`},
		{"check-sub-agent", `{"path":"Fan/x"}`},
		{"check-sub-agent", `{"path":"Fan/x/Worker/y","uri":"/%zz"}`},
		{"destroy-child", `{"child":[{"class":"Fan","name":"x"}]}`},
		{"destroy-child", `{"child":7}`},
		{"forget-destroyed", `{"paths":[[{"class":"Fan","name":"x"}]]}`},
		{"forget-destroyed", `{"paths":7}`},
		{"cancel-child", `{"child":[]}`},
		{"start-child", `{"parentPath":[],"class":"Worker","runId":"z"}`},
	} {
		if code, body := fetch(t, "POST", peer+tc.op, auth, []byte(tc.body)); code != http.StatusBadRequest || body == "" {
			t.Errorf("%s %s: %d %q, want 400 with a reason", tc.op, tc.body, code, body)
		}
	}
}

// TestRemoteClearDestroysResidentChildren clears a parent on a whose
// child lives in c's memory: the child's rows are gone and c no longer
// holds it.
func TestRemoteClearDestroysResidentChildren(t *testing.T) {
	e := newEnv(t)
	_, b, c := e.three()
	name := e.fanName("a")
	run := e.tagOn(name, "Worker", "cl", "c") + "-0"
	child := agent.Path{{Class: "Fan", Name: name}}.Child("Worker", run)
	var res map[string]any
	if err := get(t, b.Host, "/agents/fan/"+name+"/run?class=Worker&id="+run, &res); err != nil || res["status"] != "completed" {
		t.Fatalf("run: %v %v", res, err)
	}
	if !resident(t, c.Host, child) {
		t.Fatalf("the child is not in c's memory after its run")
	}
	var out map[string]int
	if err := get(t, b.Host, "/agents/fan/"+name+"/clear", &out); err != nil || out["cleared"] != 1 {
		t.Fatalf("clear: %v %v", out, err)
	}
	if resident(t, c.Host, child) {
		t.Errorf("the cleared child is still in c's memory")
	}
	if n := e.count(`SELECT count(*) FROM instances WHERE path = $1`, child.String()); n != 0 {
		t.Errorf("the cleared child's instance row remains")
	}
	if n := e.count(`SELECT count(*) FROM agent_tool_child_runs WHERE run_id = $1`, run); n != 0 {
		t.Errorf("the cleared child's run record remains")
	}
}

// TestRemoteClearDropsDescendantsOnOtherNodes clears a parent on a whose
// child (a Nester on c) ran a run of its own, whose child lives in b's
// memory: every row of the tree is gone, and neither c nor b holds its
// instance any more. (Clear dropped only the child from its owner's
// memory; the grandchild stayed resident on b until evicted.)
func TestRemoteClearDropsDescendantsOnOtherNodes(t *testing.T) {
	e := newEnv(t)
	_, b, c := e.three()
	name := e.fanName("a")
	own := e.owners()
	parent := agent.Path{{Class: "Fan", Name: name}}
	var child, grandchild agent.Path
	run := ""
	for i := 0; i < 100000 && run == ""; i++ {
		id := fmt.Sprint("nest", i)
		ch := parent.Child("Nester", id)
		g := ch.Child("Worker", "g-"+id)
		if own[cluster.ShardOf(ch, cluster.DefaultShards)] == "c" && own[cluster.ShardOf(g, cluster.DefaultShards)] == "b" {
			run, child, grandchild = id, ch, g
		}
	}
	if run == "" {
		t.Fatal("no run id puts the child on c and its child on b")
	}
	var res map[string]any
	if err := get(t, b.Host, "/agents/fan/"+name+"/run?class=Nester&id="+run, &res); err != nil || res["status"] != "completed" {
		t.Fatalf("run: %v %v", res, err)
	}
	if !resident(t, c.Host, child) || !resident(t, b.Host, grandchild) {
		t.Fatalf("after the run: child on c resident %v, its child on b resident %v, want both",
			resident(t, c.Host, child), resident(t, b.Host, grandchild))
	}
	var out map[string]int
	if err := get(t, b.Host, "/agents/fan/"+name+"/clear", &out); err != nil || out["cleared"] != 1 {
		t.Fatalf("clear: %v %v", out, err)
	}
	if resident(t, c.Host, child) {
		t.Errorf("the cleared child is still in c's memory")
	}
	if resident(t, b.Host, grandchild) {
		t.Errorf("the cleared child's child is still in b's memory")
	}
	if n := e.count(`SELECT count(*) FROM instances WHERE path LIKE $1`, child.String()+"%"); n != 0 {
		t.Errorf("%d instance rows of the cleared tree remain", n)
	}
}

// TestRemoteUndeliveredEndDeliveredOnTakeover kills the parent's node
// after a run's end was recorded and before its finish hook ran there: the
// node that takes the parent's shard over delivers the end at once, from
// the end's own wake reason, though no client uses the parent and nothing
// else of it is unfinished; the hook runs once (the killed node's never
// wrote). (The end waited for the parent's next use.)
func TestRemoteUndeliveredEndDeliveredOnTakeover(t *testing.T) {
	e := newEnv(t)
	a, b, _ := e.three()
	name := e.fanName("a")
	run := e.tagOn(name, "Worker", "hold-a-", "b") + "-0"
	go func() {
		var res map[string]any
		_ = get(t, a.Host, "/agents/fan/"+name+"/run?class=Worker&id="+run, &res) // cut by the kill
	}()
	e.until(60*time.Second, "the run's end recorded, not delivered", func() bool {
		return e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id = $1 AND status = 'completed' AND finish_delivered_at IS NULL`, run) == 1
	})
	if n := e.count(`SELECT count(*) FROM instance_wake WHERE reason = $1`, "agent-tool-finish:"+run); n != 1 {
		t.Fatalf("%d wake reasons for the undelivered end, want 1", n)
	}
	_ = e.nodes["a"].Kill()
	delete(e.nodes, "a")
	e.until(60*time.Second, "the end delivered by the node that took the parent over", func() bool {
		return e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id = $1 AND finish_delivered_at IS NOT NULL`, run) == 1
	})
	if n := e.count(`SELECT count(*) FROM instance_wake WHERE reason = $1`, "agent-tool-finish:"+run); n != 0 {
		t.Errorf("%d wake reasons after the delivery, want 0", n)
	}
	var fin map[string]int
	if err := get(t, b.Host, "/agents/fan/"+name+"/finishes", &fin); err != nil || fin["runs"] != 1 || fin["repeated"] != 0 || fin["status:completed"] != 1 {
		t.Errorf("finish ledger %v (%v), want the run completed once", fin, err)
	}
}

// TestRemoteHintsWakeFollowers polls only once an hour: a fan-out over
// three nodes completes because the children's nodes notify the parent's
// (LISTEN/NOTIFY), also across a loss of every listening connection
// mid fan-out (a reconnected listener wakes its followers).
func TestRemoteHintsWakeFollowers(t *testing.T) {
	e := newEnv(t)
	_, b, _ := e.three("-remote-poll", "1h")
	name := e.fanName("a")
	const n = 30
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=h", name, n), &st); err != nil || st["completed"] != n {
		t.Fatalf("fan-out woken by hints: %v %v", st, err)
	}
	e.spread(name, "h", n, "a", "b", "c")
	name = e.fanNameFrom("a", 100000) // a fresh finish ledger
	done := make(chan error, 1)
	go func() {
		var st map[string]int
		err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=hl", name, n), &st)
		if err == nil && st["completed"] != n {
			err = fmt.Errorf("statuses %v", st)
		}
		done <- err
	}()
	e.until(60*time.Second, "some children done", func() bool { return e.childrenDone("hl") >= 3 })
	if _, err := e.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'agentry-hints'`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("fan-out across the listeners' loss: %v", err)
	}
	e.check(b.Host, name, "hl", n)
}

// TestRemotePollWithoutHints turns the hints off: followers of children on
// other nodes find their progress by polling alone.
func TestRemotePollWithoutHints(t *testing.T) {
	e := newEnv(t)
	_, b, _ := e.three("-no-hints")
	name := e.fanName("a")
	const n = 30
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=np", name, n), &st); err != nil || st["completed"] != n {
		t.Fatalf("fan-out by polling: %v %v", st, err)
	}
	e.check(b.Host, name, "np", n)
}
