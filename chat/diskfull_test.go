package chat_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"
	"golang.org/x/sys/unix"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// TestTurnWaitsOutFullDisk (issue 24, item 5): the disk fills up while a
// turn streams (SQLite). The turn's chunk writes wait for space rather
// than fail the turn; reads go on; once space is back the turn completes
// without a restart, its answer whole and said once, and the database
// passes integrity_check. The disk is "filled" by lowering this process's
// file size limit (RLIMIT_FSIZE) to zero: the kernel refuses every write
// to a regular file (EFBIG), which SQLite reports as the I/O error a full
// disk gives it. The limit is the whole process's: no t.Parallel.
func TestTurnWaitsOutFullDisk(t *testing.T) {
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk)
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: m})}})
	sq, ok := r.sq.(*sqlite.DB)
	if !ok {
		t.Skip("the disk-full test is SQLite's")
	}
	ctx := testCtx(t)
	a := getChat(t, r.rt, "Bot", "full")
	const question = "say something long enough to stream across the full disk"
	id, err := a.SubmitMessages(ctx, []message.Message{userMsg(question)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		step(t, mclk, modelDelay)
	}
	r.db.waitFor(t, "the first chunks to be committed", func() bool {
		return count(t, r.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ? AND body LIKE '%"text-delta"%'`, id) >= 3
	})

	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 0, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	freed := false
	free := func() {
		if !freed {
			freed = true
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer free()
	from := sq.Stats().DiskRefused
	type ended struct {
		res chat.TurnResult
		err error
	}
	end := make(chan ended, 1)
	go func() {
		res, err := a.WaitTurn(ctx, id)
		end <- ended{res, err}
	}()
	stop := pump(mclk, modelDelay)
	deadline := time.Now().Add(30 * time.Second)
	for sq.Stats().DiskRefused < from+3 {
		select {
		case e := <-end:
			t.Fatalf("the turn ended while the disk was full: %+v, %v; want it to wait for space", e.res, e.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no write was refused by the full disk")
		}
		time.Sleep(time.Millisecond) // another goroutine's writes: nothing to wait on
	}
	// Reads go on.
	if n := count(t, r.sq, `SELECT COUNT(*) FROM chat_streams WHERE id = ?`, id); n != 1 {
		t.Fatalf("read on a full disk: %d streams", n)
	}
	free()
	e := <-end
	stop()
	res, err := e.res, e.err
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("the turn across the full disk: %+v, %v; want completed", res, err)
	}
	want := "You said: " + question
	asst := onlyAssistant(t, a.Messages())
	if got := allText(asst); got != want || chat.MessageText(asst) != want {
		t.Fatalf("answer %q (text %q), want %q once", got, chat.MessageText(asst), want)
	}
	if got := streamStatusOf(t, r.sq, id); got != "done" {
		t.Fatalf("stream status %q, want done", got)
	}
	var check string
	if err := r.sq.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `PRAGMA integrity_check`).Scan(&check)
	}); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q %v", check, err)
	}
}

// streamStatusOf reads a stream's status through db.
func streamStatusOf(t *testing.T, db store.DB, id string) string {
	t.Helper()
	ctx := testCtx(t)
	var status string
	if err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT status FROM chat_streams WHERE id = ?`, id).Scan(&status)
	}); err != nil {
		t.Fatal(err)
	}
	return status
}

// TestFullDiskRefusesNewAgents: with the disk full (SQLite), a request for
// an agent that must first be created is answered 503 with Retry-After
// (server.Options.DatabaseWait, 2 s) and a WebSocket to one is closed
// with 1013, never left hanging; an existing
// agent's transcript is still served (reads go on); once space is back
// the new agent is created.
func TestFullDiskRefusesNewAgents(t *testing.T) {
	mclk := clockwork.NewFakeClock()
	env, _ := startEnv(t, t.TempDir(), nil, chat.Config{}, chatClass("Bot", &kit{model: slowModel(mclk)}))
	if _, ok := env.DB.(*sqlite.DB); !ok {
		t.Skip("the disk-full test is SQLite's")
	}
	if msgs := getMessages(t, env.HTTP.URL, "/agents/bot/old"); len(msgs) != 0 {
		t.Fatalf("a new agent's transcript: %v", msgs)
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 0, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	freed := false
	free := func() {
		if !freed {
			freed = true
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer free()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(env.HTTP.URL + "/agents/bot/new/get-messages")
	if err != nil {
		t.Fatalf("a request for a new agent on a full disk: %v (it must be answered)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a request for a new agent on a full disk: %s (Retry-After %q), want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	// A WebSocket to a new agent is closed with 1013 (try again later),
	// which the npm client reconnects after.
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := testenv.DialWS[testenv.WireFrame](t, 30*time.Second, "ws"+strings.TrimPrefix(env.HTTP.URL, "http")+"/agents/bot/new-socket")
	if ce, err := ws.CloseError(wctx); err != nil || ce.Code != websocket.StatusTryAgainLater || len(ws.Frames()) != 0 {
		t.Fatalf("WebSocket to a new agent on a full disk: %d frames, then %v %v, want a close with 1013", len(ws.Frames()), ce, err)
	}
	resp, err = c.Get(env.HTTP.URL + "/agents/bot/old/get-messages")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an existing agent's transcript on a full disk: %s, want 200", resp.Status)
	}
	free()
	if msgs := getMessages(t, env.HTTP.URL, "/agents/bot/new"); len(msgs) != 0 {
		t.Fatalf("the new agent's transcript once space is back: %v", msgs)
	}
}
