package clusterclients

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chatTimeout bounds each wait for a line of the chat command; a failover
// (a lease, a renewal round and the client's reconnect backoff) fits in it.
const chatTimeout = 90 * time.Second

// chatCmd is `agentry chat` running as a subprocess.
type chatCmd struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	seen  []string
}

func startChatCmd(t *testing.T, host, name string) *chatCmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, agentry.Path(t), "chat", "--addr", host, "--name", name)
	cmd.WaitDelay = 10 * time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &chatCmd{cmd: cmd, in: in, lines: make(chan string, 4096)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agentry chat output:\n%s", strings.Join(c.seen, "\n"))
		}
	})
	return c
}

func (c *chatCmd) say(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
}

// waitFor reads lines until one matches re, and returns the lines read
// on the way (that one included).
func (c *chatCmd) waitFor(t *testing.T, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.NewTimer(chatTimeout)
	defer timeout.Stop()
	from := len(c.seen)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("the chat's output ended before a line matching %q", re)
			}
			c.seen = append(c.seen, l)
			if rx.MatchString(l) {
				return c.seen[from:]
			}
		case <-timeout.C:
			t.Fatalf("no line matching %q in %v", re, chatTimeout)
		}
	}
}

// exit closes the chat's input and waits for it to exit with status 0.
func (c *chatCmd) exit(t *testing.T) string {
	t.Helper()
	c.in.Close()
	for l := range c.lines {
		c.seen = append(c.seen, l)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("agentry chat: %v", err)
	}
	return strings.Join(c.seen, "\n")
}

func count(lines []string, re string) int {
	rx := regexp.MustCompile(re)
	n := 0
	for _, l := range lines {
		if rx.MatchString(l) {
			n++
		}
	}
	return n
}

// TestChatCommandThroughAnyNode runs `agentry chat` against node b, which
// does not own the chat (a does): research answers stream while c (no
// part in the chat) is killed, then while a is killed. The first answer
// completes with the connection undisturbed; for the second the command
// says the connection was lost (closed with 1012), reconnects through b to
// the new owner and shows the answer once; the chat then goes on.
func TestChatCommandThroughAnyNode(t *testing.T) {
	// At 100 ms a chunk a research answer takes about 8 s: the kills fall
	// inside it.
	c := startCluster(t, 100*time.Millisecond, "a", "b", "c", "d")
	name := c.assistantName("a", "cli")
	ch := startChatCmd(t, c.nodes["b"].Host, name)
	ch.waitFor(t, `^connected to Assistant`)

	ch.say(t, "Research tidal power")
	ch.waitFor(t, `^▸ \[1\] Researcher started · run \S+ · "tidal power"$`)
	c.kill("c", name)
	got := ch.waitFor(t, `^assistant> Tidal power is worth knowing well\.`)
	if count(got, `^✓ \[1\] Researcher \[##########\] 100% completed`) != 1 {
		t.Errorf("the first research did not complete once:\n%s", strings.Join(got, "\n"))
	}
	if n := count(got, `^connection lost`); n != 0 {
		t.Errorf("the connection was lost when a node that plays no part in the chat died:\n%s", strings.Join(got, "\n"))
	}

	ch.say(t, "Research wave energy")
	ch.waitFor(t, `^▸ \[2\] Researcher started · run \S+ · "wave energy"$`)
	c.kill("a", name)
	got = ch.waitFor(t, `^connection lost \(.*\); reconnecting…$`)
	if lost := got[len(got)-1]; !strings.Contains(lost, "1012") && !strings.Contains(lost, "ServiceRestart") {
		t.Errorf("the socket was not closed with 1012 (service restart): %s", lost)
	}
	ch.waitFor(t, `^reconnected$`)
	got = ch.waitFor(t, `^assistant> Wave energy is worth knowing well\.`)
	if n := count(got, `^✓ \[2\] Researcher \[##########\] 100% completed`); n != 1 {
		t.Errorf("the second research completed %d times after the reconnect:\n%s", n, strings.Join(got, "\n"))
	}

	ch.say(t, "hello")
	ch.waitFor(t, `^assistant> Hello! I hand work to helper agents`)
	all := ch.exit(t)
	for _, re := range []string{`^assistant> Tidal power is worth knowing well\.`, `^assistant> Wave energy is worth knowing well\.`} {
		if n := count(strings.Split(all, "\n"), re); n != 1 {
			t.Errorf("%d lines match %q:\n%s", n, re, all)
		}
	}
}
