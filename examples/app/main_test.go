package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestApp runs the complete program: its health route in the application's
// mux answers, a chat turn through the agent routes runs the Researcher as
// a tool and ends with the Assistant's answer, the data survives a
// restart, and run returns nil once its context is done (the graceful
// shutdown).
func TestApp(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for life := 0; life < 2; life++ {
		host, stop := startApp(t, ctx, dir)
		resp, err := http.Get("http://" + host + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
			t.Fatalf("healthz: %d %q", resp.StatusCode, body)
		}
		conn, err := client.Dial(ctx, client.Options{Host: host, Agent: "Assistant", Name: "readme"})
		if err != nil {
			t.Fatal(err)
		}
		if life == 0 {
			st, err := conn.Chat().Send(ctx, "HTTP/3")
			if err != nil {
				t.Fatal(err)
			}
			res, err := st.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != chat.OutcomeCompleted || !strings.Contains(chat.MessageText(st.Message()), "researcher found") {
				t.Fatalf("turn %+v: %q", res, chat.MessageText(st.Message()))
			}
		}
		msgs, err := conn.Chat().Messages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 2 {
			t.Fatalf("life %d: %d messages, want the question and the answer", life, len(msgs))
		}
		conn.Close()
		stop()
	}
}

// startApp runs the program on a free port and returns its address and a
// function that stops it and checks that it returned nil.
func startApp(t *testing.T, ctx context.Context, dir string) (string, func()) {
	t.Helper()
	rctx, cancel := context.WithCancel(ctx)
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- run(rctx, logger, "127.0.0.1:0", dir, func(a net.Addr) { addrc <- a }) }()
	select {
	case a := <-addrc:
		return a.String(), func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	case err := <-done:
		cancel()
		t.Fatalf("run returned before listening: %v", err)
	}
	return "", nil
}
