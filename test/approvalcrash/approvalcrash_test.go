// Package approvalcrash kills the real agentry server (SIGKILL) while a chat
// turn waits for an answer — a tool approval, a client tool's output — and
// answers it with the real npm chat client after the restart: the turn is
// still waiting, and the answer resumes it.
package approvalcrash

import (
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/testenv"
)

// agentry is cmd/agentry, built once (with -race when the tests run with
// -race).
var agentry = &testenv.Binary{Pkg: "github.com/agentry/agentry/cmd/agentry", Race: testenv.Race}

func TestMain(m *testing.M) { testenv.Main(m, agentry) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 30 * time.Second

func serve(t *testing.T, data string) *testenv.Process {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and kills a server")
	}
	testenv.RequireNode(t)
	return testenv.StartProcess(t, waitLimit, agentry.Path(t), "serve", "--addr", "127.0.0.1:0", "--data", data, "--delay", "0s")
}

func node(t *testing.T, host, room, phase string) {
	t.Helper()
	out := testenv.Node(t, 60*time.Second, "approvals.mjs", host, room, phase)
	if !strings.Contains(out, "PASS approvals "+phase) {
		t.Fatalf("%s did not pass:\n%s", phase, out)
	}
}

// acrossKill runs phase ask of room, kills the server, runs phase answer
// on a new server over the same data, and stops that one cleanly.
func acrossKill(t *testing.T, room, ask, answer string) {
	t.Helper()
	data := t.TempDir()
	p := serve(t, data)
	node(t, p.Host, room, ask)
	p.Kill()
	p2 := serve(t, data)
	node(t, p2.Host, room, answer)
	p2.Stop()
}

// TestApprovalAcrossRestart: delete_helper_runs asks for approval; the
// server is killed; the new server shows it still waiting, and the
// approval given to it runs the tool and the model's follow-up.
func TestApprovalAcrossRestart(t *testing.T) {
	acrossKill(t, "restart-approval", "ask-approval", "answer-approval")
}

// TestClientToolAcrossRestart: get_local_time waits for the client; the
// server is killed; the output sent to the new server resumes the turn.
func TestClientToolAcrossRestart(t *testing.T) {
	acrossKill(t, "restart-time", "ask-time", "answer-time")
}
