package clustercrash

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/cluster"
)

// TestNodeRefusesNewerSchema (issue 24, item 3, mixed versions): the rule
// for two builds on one database is that a node refuses to start when the
// database records a schema newer than it knows (a newer build migrated
// it). With node a serving, the test records the chat schema one version
// past this build's (the row a newer build's migration writes) and starts
// node b: b exits with status 1 and an error naming the component and
// both versions, before it joins the cluster (no cluster_nodes row, no
// shard taken from a), and a keeps every shard and serves.
func TestNodeRefusesNewerSchema(t *testing.T) {
	e := newEnv(t)
	a := e.start("a")
	e.balanced("a")
	name := e.fanName("a")
	var st map[string]int
	if err := get(t, a.Host, "/agents/fan/"+name+"/fan-out?n=3&tag=v", &st); err != nil || st["completed"] != 3 {
		t.Fatalf("fan-out before: %v %v", st, err)
	}
	newer := chat.SchemaVersion() + 1
	if _, err := e.pool.Exec(context.Background(), `UPDATE schema_versions SET version = $1 WHERE component = 'chat'`, newer); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Path(t), "-postgres", e.url, "-node-id", "b", "-lease", lease())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("node b on a newer schema: %v, want exit status 1\n%s", err, out.String())
	}
	want := `"chat" schema is at version ` + strconv.Itoa(newer) + `, newer than this build knows (` + strconv.Itoa(newer-1) + `)`
	if !strings.Contains(out.String(), want) {
		t.Errorf("node b's error does not say %s:\n%s", want, out.String())
	}
	t.Logf("node b refused: %s", lastLine(out.String()))
	if n := e.count(`SELECT count(*) FROM cluster_nodes WHERE node_id = 'b'`); n != 0 {
		t.Errorf("node b joined the cluster (%d rows) before refusing", n)
	}
	if n := e.count(`SELECT count(*) FROM cluster_shards WHERE owner = 'a'`); n != cluster.DefaultShards {
		t.Errorf("a owns %d shards after b's refusal, want all %d", n, cluster.DefaultShards)
	}
	if err := get(t, a.Host, "/agents/fan/"+name+"/finishes", &st); err != nil || st["runs"] != 3 {
		t.Errorf("a after b's refusal: %v %v", st, err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
