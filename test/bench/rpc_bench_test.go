package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// BenchmarkRPC measures RPC round trips over real WebSockets to the server
// on 127.0.0.1: send {"type":"rpc",…}, wait for the final rpc response.
// get() reads the in-memory state; increment(1) commits the state to SQLite
// and broadcasts it (the caller receives that cf_agent_state frame before
// its response). Each client has its own connection and its own Counter
// instance. One op is one call; p50/p95/p99 are per-call latencies and
// calls/s is the aggregate throughput of all clients.
func BenchmarkRPC(b *testing.B) {
	for _, method := range []string{"get", "increment"} {
		for _, clients := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", method, clients), func(b *testing.B) {
				benchRPC(b, method, clients)
			})
		}
	}
}

func benchRPC(b *testing.B, method string, clients int) {
	env := testenv.Start(b, testenv.Options{Classes: []agent.Class{counter.Class()}})
	ctx := context.Background()
	var args []any
	if method == "increment" {
		args = []any{1}
	}
	conns := make([]*rpcClient, clients)
	for i := range conns {
		c, err := dialRPC(ctx, env.URL(fmt.Sprintf("/agents/counter/rpc-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.c.CloseNow() })
		// Warm up: hydrate the instance and give it a state.
		if _, err := c.call(ctx, "increment", []any{1}); err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}

	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i, c := range conns {
		// Client i makes calls i, i+clients, … and records their latencies.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := i; k < b.N; k += clients {
				t0 := time.Now()
				res, err := c.call(ctx, method, args)
				lat[k] = time.Since(t0)
				if err != nil {
					b.Error(err)
					return
				}
				if len(res) == 0 || res[0] < '0' || res[0] > '9' {
					b.Errorf("%s returned %s; want a count", method, res)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()

	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 50).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(percentile(lat, 95).Nanoseconds())/1e3, "p95-µs")
	b.ReportMetric(float64(percentile(lat, 99).Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
}

// percentile returns the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return sorted[max(rank, 1)-1]
}

// rpcClient is one WebSocket connection that makes one call at a time.
type rpcClient struct {
	c      *websocket.Conn
	nextID int
}

func dialRPC(ctx context.Context, url string) (*rpcClient, error) {
	// Skip the connect frames: identity, state (for a stored instance) and
	// MCP servers, which is always last.
	c, err := testenv.DialRawUntil(ctx, url, wire.MCPServers)
	if err != nil {
		return nil, err
	}
	return &rpcClient{c: c}, nil
}

// rpcReply is the part of an RPC response the benchmark reads: a type of
// its own rather than testenv.WireFrame, whose decoding costs the measured
// client about twice as much.
type rpcReply struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Success bool            `json:"success"`
	Result  json.RawMessage `json:"result"`
	Done    *bool           `json:"done"`
	Error   string          `json:"error"`
}

// call makes one RPC call and returns its result.
func (c *rpcClient) call(ctx context.Context, method string, args []any) (json.RawMessage, error) {
	c.nextID++
	id := strconv.Itoa(c.nextID)
	if args == nil {
		args = []any{}
	}
	req, err := json.Marshal(map[string]any{"type": wire.RPC, "id": id, "method": method, "args": args})
	if err != nil {
		return nil, err
	}
	if err := c.c.Write(ctx, websocket.MessageText, req); err != nil {
		return nil, err
	}
	for {
		_, data, err := c.c.Read(ctx)
		if err != nil {
			return nil, err
		}
		var r rpcReply
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, err
		}
		if r.Type != wire.RPC || r.ID != id {
			continue // a state broadcast
		}
		if !r.Success {
			return nil, fmt.Errorf("rpc %s: %s", method, r.Error)
		}
		if r.Done != nil && *r.Done {
			return r.Result, nil
		}
	}
}
