package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/client/agenttools"
)

// Frames the chat command queues itself, in order with the server's: the
// socket was lost (Data is the error text as JSON), a new one is up.
const (
	frameLost        = "agentry-chat:lost"
	frameReconnected = "agentry-chat:reconnected"
)

const chatUsage = `usage: agentry chat [--addr 127.0.0.1:8787] [--name default] [--token T]

Chat with the Assistant of a running agentry server: every line read from
standard input is sent as a message. The answer streams as it arrives, and
each helper run is shown with its progress, phase, milestones and result;
background runs and the notification turns they cause are shown too. A lost
connection is reconnected, and a turn in flight resumes where it was.
The client-side tool get_local_time is answered with this machine's clock;
a tool call that needs approval is answered with /approve or /deny.
Ctrl-C cancels the turn in flight; a second Ctrl-C, or end of input, exits.
`

// errQuit ends a chat session without an error (a second Ctrl-C).
var errQuit = errors.New("quit")

// runChat is the chat command: a terminal client for the Assistant that
// reads messages from in and writes the conversation to out. Ctrl-C
// (os.Interrupt) cancels the turn in flight; a second one exits.
func runChat(ctx context.Context, args []string, in io.Reader, out io.Writer) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)
	return chatSession(ctx, args, in, out, sig)
}

// chatSession runs the chat command with interrupts delivered on intr.
func chatSession(ctx context.Context, args []string, in io.Reader, out io.Writer, intr <-chan os.Signal) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(fs.Output(), chatUsage); fs.PrintDefaults() }
	var cf connFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("chat: unexpected arguments %q", fs.Args())
	}

	q := newFrameQueue()
	// An interrupt while connecting gives up.
	sctx, stopSetup := interruptible(ctx, intr)
	conn, err := cf.dial(sctx, client.Options{OnFrame: q.push, Chat: true, Reconnect: &client.Reconnect{
		OnDisconnect: func(err error) {
			b, _ := json.Marshal(err.Error())
			q.push(client.Frame{Type: frameLost, Data: b})
		},
		OnReconnect: func() { q.push(client.Frame{Type: frameReconnected}) },
	}})
	if err != nil {
		stopSetup()
		return fmt.Errorf("chat: %w", err)
	}
	defer conn.Close()
	scr := newScreen(out, isTerminal(out), agenttools.NewTracker(nil))
	// Notices already in the transcript are history, not news.
	if msgs, err := conn.Chat().Messages(sctx); err == nil {
		scr.seenNotices(msgs)
	}
	setupErr := context.Cause(sctx)
	stopSetup()
	if setupErr != nil {
		return fmt.Errorf("chat: %w", setupErr)
	}

	// One goroutine renders every frame, the connect replay included, in
	// the order the server sent them.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer scr.end() // after the rendering goroutine is done
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() {
		q.drain(scr.handle, conn.Done(), stop)
		scr.lost()
	})

	quit := make(chan struct{})
	defer close(quit)
	lines, inputErr := readLines(in, quit)

	echo := !isTerminal(in)
	scr.line(fmt.Sprintf("connected to %s %q at %s; Ctrl-C cancels a turn, Ctrl-D exits", assistantClass, cf.name, cf.addr))
	for {
		select {
		case text, ok := <-lines:
			if !ok {
				if err := inputErr(); err != nil {
					return fmt.Errorf("chat: read input: %w", err)
				}
				return nil
			}
			text = strings.TrimSpace(text)
			if text == "" {
				continue
			}
			if echo {
				scr.line("you> " + text)
			}
			var err error
			switch text {
			case "/approve", "/deny":
				err = answerApprovals(ctx, conn, scr, text == "/approve", intr)
			default:
				err = chatTurn(ctx, conn, scr, text, intr)
			}
			if errors.Is(err, errQuit) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("chat: %w", err)
			}
		case <-intr:
			return nil
		case <-conn.Done():
			return fmt.Errorf("chat: %w", conn.Err())
		case <-ctx.Done():
			return fmt.Errorf("chat: %w", ctx.Err())
		}
	}
}

// chatTurn sends text as a turn and waits until the screen has rendered its
// end. An interrupt cancels the turn; a second one returns errQuit.
func chatTurn(ctx context.Context, conn *client.Conn, scr *screen, text string, intr <-chan os.Signal) error {
	s, err := conn.Chat().Send(ctx, text)
	if err != nil {
		return err
	}
	return followTurn(ctx, conn, scr, s, intr)
}

// followTurn waits for the turn s to end, answers the client-side tools it
// ended waiting for (get_local_time) and follows the continuation, until a
// turn ends that waits for nothing this client answers.
func followTurn(ctx context.Context, conn *client.Conn, scr *screen, s *client.Stream, intr <-chan os.Signal) error {
	for s != nil {
		if err := waitTurn(ctx, conn, scr, s, intr); err != nil {
			return err
		}
		next, err := answerWaiting(ctx, conn, scr)
		if err != nil {
			return err
		}
		s = next
	}
	return nil
}

// answerWaiting answers the calls the last assistant message waits for
// that this client can: get_local_time with the local time. For an
// approval it tells the user how to answer (/approve, /deny). It returns
// the continuation's stream, or nil.
func answerWaiting(ctx context.Context, conn *client.Conn, scr *screen) (*client.Stream, error) {
	last := lastAssistantOf(conn.Chat().Transcript())
	if last == nil {
		return nil, nil
	}
	var next *client.Stream
	for _, p := range client.WaitingCalls(*last) {
		switch {
		case p.State == message.StateApprovalRequested:
			scr.line(fmt.Sprintf("(%s waits for your approval: type /approve or /deny)", p.ToolName()))
		case p.ToolName() == localTimeTool:
			now := time.Now()
			zone, _ := now.Zone()
			out := map[string]string{"time": now.Format("15:04"), "date": now.Format("2006-01-02"), "timeZone": zone}
			scr.line(fmt.Sprintf("(answering %s: %s %s)", localTimeTool, out["time"], zone))
			s, err := conn.Chat().AddToolOutput(ctx, p.ToolCallID, p.ToolName(), out)
			switch {
			case errors.Is(err, client.ErrNoStream):
			case err != nil:
				return nil, err
			default:
				next = s
			}
		}
	}
	return next, nil
}

// answerApprovals answers every approval the last assistant message waits
// for and follows the continuation.
func answerApprovals(ctx context.Context, conn *client.Conn, scr *screen, approved bool, intr <-chan os.Signal) error {
	last := lastAssistantOf(conn.Chat().Transcript())
	var next *client.Stream
	asked := false
	if last != nil {
		for _, p := range client.WaitingCalls(*last) {
			if p.State != message.StateApprovalRequested {
				continue
			}
			asked = true
			s, err := conn.Chat().AddToolApprovalResponse(ctx, p.ToolCallID, approved)
			switch {
			case errors.Is(err, client.ErrNoStream):
			case err != nil:
				return err
			default:
				next = s
			}
		}
	}
	if !asked {
		scr.line("(nothing waits for an approval)")
		return nil
	}
	return followTurn(ctx, conn, scr, next, intr)
}

// localTimeTool is the demo's client-side tool that agentry chat answers.
const localTimeTool = "get_local_time"

func lastAssistantOf(msgs []message.Message) *message.Message {
	if n := len(msgs); n > 0 && msgs[n-1].Role == message.RoleAssistant {
		return &msgs[n-1]
	}
	return nil
}

// waitTurn waits until the screen has rendered the end of the turn s. An
// interrupt cancels the turn; a second one returns errQuit.
func waitTurn(ctx context.Context, conn *client.Conn, scr *screen, s *client.Stream, intr <-chan os.Signal) error {
	done := scr.turnDone(s.ID())
	cancelled := false
	for {
		select {
		case <-done:
			return nil
		case <-intr:
			if cancelled {
				return errQuit
			}
			cancelled = true
			scr.line("cancelling the turn (Ctrl-C again to exit)")
			if err := conn.Chat().Cancel(ctx, s.ID()); err != nil {
				return err
			}
		case <-conn.Done():
			return conn.Err()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// interruptible returns a context canceled by an interrupt on intr; stop
// releases it and stops watching intr.
func interruptible(ctx context.Context, intr <-chan os.Signal) (context.Context, func()) {
	ictx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-intr:
			cancel(errors.New("interrupted"))
		case <-ictx.Done():
		}
	}()
	return ictx, func() {
		cancel(nil)
		<-done
	}
}

// frameQueue hands the frames of a connection from its reading goroutine
// (Options.OnFrame, which must not block) to the rendering goroutine, in
// order and without bound.
type frameQueue struct {
	mu     sync.Mutex
	frames []client.Frame
	signal chan struct{} // capacity 1: frames were queued
}

func newFrameQueue() *frameQueue { return &frameQueue{signal: make(chan struct{}, 1)} }

// push queues f; it never blocks.
func (q *frameQueue) push(f client.Frame) {
	q.mu.Lock()
	q.frames = append(q.frames, f)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take removes and returns the queued frames.
func (q *frameQueue) take() []client.Frame {
	q.mu.Lock()
	defer q.mu.Unlock()
	fs := q.frames
	q.frames = nil
	return fs
}

// drain calls handle with every frame queued, in order, until stop is
// closed, or until ended is closed and the frames queued by then are
// handled.
func (q *frameQueue) drain(handle func(client.Frame), ended, stop <-chan struct{}) {
	for {
		for _, f := range q.take() {
			handle(f)
		}
		select {
		case <-q.signal:
		case <-ended:
			// The connection's reading goroutine has pushed its last frame.
			for _, f := range q.take() {
				handle(f)
			}
			return
		case <-stop:
			return
		}
	}
}

// readLines reads lines from in on a goroutine of its own and delivers them
// on the returned channel, which is closed at the end of the input; the
// returned function reports a read error after that. The goroutine stops
// delivering when quit is closed (it may stay blocked in a Read of in until
// in is closed).
func readLines(in io.Reader, quit <-chan struct{}) (<-chan string, func() error) {
	lines := make(chan string)
	var err error
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-quit:
				return
			}
		}
		err = sc.Err()
	}()
	// err is written before lines is closed and read after.
	return lines, func() error { return err }
}

// isTerminal reports whether v is a character device (an interactive
// terminal).
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
