package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds every wait of a test; nothing sleeps.
const testTimeout = 60 * time.Second

// startServer starts the agents-as-tools demo with the given models (nil:
// offline models with no delay) on a real server.
func startServer(t *testing.T, models *agentsastools.Models) *testenv.Env {
	t.Helper()
	if models == nil {
		models = agentsastools.Offline(0, nil)
	}
	return testenv.Start(t, testenv.Options{
		Classes: agentsastools.Classes(agentsastools.Options{Models: models}),
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
}

// output collects what a command writes to a pipe, line by line.
type output struct {
	lines chan string
	seen  []string
}

// newOutput returns the writer end of a pipe whose lines the output
// collects. Closing the writer ends the collecting goroutine.
func newOutput() (*io.PipeWriter, *output) {
	r, w := io.Pipe()
	o := &output{lines: make(chan string, 4096)}
	go func() {
		defer close(o.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			o.lines <- sc.Text()
		}
	}()
	return w, o
}

// waitFor reads lines until one matches re and returns its submatches.
func (o *output) waitFor(t *testing.T, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.NewTimer(testTimeout)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-o.lines:
			if !ok {
				t.Fatalf("output ended before a line matching %q:\n%s", re, strings.Join(o.seen, "\n"))
			}
			o.seen = append(o.seen, l)
			if m := rx.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-timeout.C:
			t.Fatalf("no line matching %q in %v:\n%s", re, testTimeout, strings.Join(o.seen, "\n"))
		}
	}
}

// waitAll reads lines until each of res has matched a line, in any order.
func (o *output) waitAll(t *testing.T, res ...string) {
	t.Helper()
	left := map[*regexp.Regexp]bool{}
	for _, re := range res {
		left[regexp.MustCompile(re)] = true
	}
	timeout := time.NewTimer(testTimeout)
	defer timeout.Stop()
	for len(left) > 0 {
		select {
		case l, ok := <-o.lines:
			if !ok {
				t.Fatalf("output ended before lines matching %v:\n%s", res, strings.Join(o.seen, "\n"))
			}
			o.seen = append(o.seen, l)
			for rx := range left {
				if rx.MatchString(l) {
					delete(left, rx)
				}
			}
		case <-timeout.C:
			t.Fatalf("no lines matching %v in %v:\n%s", res, testTimeout, strings.Join(o.seen, "\n"))
		}
	}
}

// rest drains the output after the command has closed it.
func (o *output) rest() string {
	for l := range o.lines {
		o.seen = append(o.seen, l)
	}
	return strings.Join(o.seen, "\n")
}

// chatProc is a chat command running in the test process.
type chatProc struct {
	in   *io.PipeWriter
	out  *output
	intr chan os.Signal
	done chan error
}

// startChat runs the chat command against env with stdin and stdout
// pipes. With interrupts false it runs runChat itself (real signal
// handling); otherwise the test delivers interrupts on intr.
func startChat(t *testing.T, env *testenv.Env, interrupts bool, args ...string) *chatProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	inR, inW := io.Pipe()
	outW, out := newOutput()
	p := &chatProc{in: inW, out: out, intr: make(chan os.Signal, 1), done: make(chan error, 1)}
	args = append([]string{"--addr", env.Host}, args...)
	go func() {
		var err error
		if interrupts {
			err = chatSession(ctx, args, inR, outW, p.intr)
		} else {
			err = runChat(ctx, args, inR, outW)
		}
		outW.Close()
		p.done <- err
	}()
	t.Cleanup(func() {
		inW.Close()
		inR.Close()
		cancel()
	})
	return p
}

// say writes a line to the chat's input.
func (p *chatProc) say(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
}

// exit closes the chat's input and waits for the command to return nil.
func (p *chatProc) exit(t *testing.T) string {
	t.Helper()
	p.in.Close()
	return p.wait(t)
}

// wait waits for the command to return nil and returns its whole output.
func (p *chatProc) wait(t *testing.T) string {
	t.Helper()
	all := p.out.rest()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("chat: %v\n%s", err, all)
		}
	case <-time.After(testTimeout):
		t.Fatalf("chat did not return:\n%s", all)
	}
	return all
}

// runsCmd runs the runs command against env and returns its output.
func runsCmd(t *testing.T, env *testenv.Env, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := runRuns(ctx, append([]string{"--addr", env.Host}, args...), &out); err != nil {
		t.Fatalf("runs %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}
