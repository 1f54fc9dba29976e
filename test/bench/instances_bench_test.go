package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store/sqlite"
)

// BenchmarkInstanceMemory hydrates 10,000 stored Counter instances (each
// with state) on a fresh runtime and measures what they cost in memory while
// live and idle, and what is left of them after eviction. One op is
// hydrating all 10,000 (rt.Get each, in turn).
//
// Metrics:
//   - heap-B/live: Go heap (runtime.MemStats.HeapAlloc after two GCs) per
//     live idle instance, over the heap before hydration.
//   - heap-B/evicted: the same after rt.EvictIdle removed all of them.
//   - rss-B/live: process RSS growth per live instance. It also counts
//     SQLite's page cache (modernc.org/sqlite allocates outside the Go heap)
//     and the Go heap's headroom, and RSS is not returned on eviction.
//   - sqlite-B/instance: database file bytes per stored instance, over the
//     empty schema.
func BenchmarkInstanceMemory(b *testing.B) {
	ctx := context.Background()
	full := storedFixture(b, storedInstances)
	empty := storedFixture(b, 0)
	var live, evicted, rss float64
	for range b.N {
		b.StopTimer()
		dir := full.copyTo(b)
		db, err := sqlite.Open(ctx, filepath.Join(dir, "agentry.db"))
		if err != nil {
			b.Fatal(err)
		}
		rt, err := agent.New(ctx, agent.Options{DB: db, IdleTimeout: -1}) // no background eviction
		if err != nil {
			b.Fatal(err)
		}
		if err := rt.Register(counter.Class()); err != nil {
			b.Fatal(err)
		}
		if err := rt.Start(ctx); err != nil {
			b.Fatal(err)
		}
		heap0, rss0 := heapAfterGC(), rssBytes(b)

		b.StartTimer()
		for i := range storedInstances {
			if _, err := rt.Get(ctx, agent.Root("Counter", instanceName(i))); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()

		if n := rt.ResidentCount(); n != storedInstances {
			b.Fatalf("%d instances resident after hydrating %d", n, storedInstances)
		}
		heap1, rss1 := heapAfterGC(), rssBytes(b)
		// The instances hold the stored state: the last one's count is its
		// index + 1.
		last := agent.Root("Counter", instanceName(storedInstances-1))
		if got, err := rt.Call(ctx, last, "get"); err != nil || string(got) != strconv.Itoa(storedInstances) {
			b.Fatalf("get on %s = %s, %v; want %d", last, got, err, storedInstances)
		}
		if n := rt.EvictIdle(); n != storedInstances {
			b.Fatalf("EvictIdle evicted %d; want %d", n, storedInstances)
		}
		if n := rt.ResidentCount(); n != 0 {
			b.Fatalf("%d instances resident after EvictIdle", n)
		}
		heap2 := heapAfterGC()
		live = float64(int64(heap1)-int64(heap0)) / storedInstances
		evicted = float64(int64(heap2)-int64(heap0)) / storedInstances
		rss = float64(rss1-rss0) / storedInstances
		runtime.KeepAlive(rt)
		rt.Close()
		db.Close()
	}
	b.ReportMetric(live, "heap-B/live")
	b.ReportMetric(evicted, "heap-B/evicted")
	b.ReportMetric(rss, "rss-B/live")
	b.ReportMetric(float64(full.bytes-empty.bytes)/storedInstances, "sqlite-B/instance")
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// rssBytes returns the process's resident set size (VmRSS).
func rssBytes(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skip("no /proc/self/status:", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("VmRSS not in /proc/self/status")
	return 0
}

// BenchmarkStartup measures a cold start over a data folder that already
// holds a number of stored instances: sqlite.Open, agent.New (migrations),
// Register, Start (the scheduler's first pass), server.New and listening on
// 127.0.0.1, then the first request: a WebSocket connect to a stored
// instance (hydration, connect frames with its state) and an RPC get on it.
// One op is one such start, up to the RPC response; first-request-µs is the
// part from listening to the RPC response. The data folder is a fresh copy
// each time (its file is in the OS page cache).
func BenchmarkStartup(b *testing.B) {
	for _, n := range []int{0, storedInstances} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			benchStartup(b, n)
		})
	}
}

func benchStartup(b *testing.B, n int) {
	ctx := context.Background()
	fx := storedFixture(b, n)
	target, want := instanceName(n/2), n/2+1
	if n == 0 {
		target, want = instanceName(0), 0 // created by the first request
	}
	var first time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		dir := fx.copyTo(b)
		b.StartTimer()

		db, err := sqlite.Open(ctx, filepath.Join(dir, "agentry.db"))
		if err != nil {
			b.Fatal(err)
		}
		rt, err := agent.New(ctx, agent.Options{DB: db})
		if err != nil {
			b.Fatal(err)
		}
		if err := rt.Register(counter.Class()); err != nil {
			b.Fatal(err)
		}
		if err := rt.Start(ctx); err != nil {
			b.Fatal(err)
		}
		srv := server.New(server.Options{Runtime: rt})
		hs := httptest.NewServer(srv)
		started := time.Now()
		c, err := dialRPC(ctx, "ws"+strings.TrimPrefix(hs.URL, "http")+"/agents/counter/"+target)
		if err != nil {
			b.Fatal(err)
		}
		res, err := c.call(ctx, "get", nil)
		if err != nil {
			b.Fatal(err)
		}
		first += time.Since(started)
		b.StopTimer()

		var got int
		if err := json.Unmarshal(res, &got); err != nil || got != want {
			b.Fatalf("first get on %s = %s; want %d", target, res, want)
		}
		c.c.CloseNow()
		srv.Close()
		hs.Close()
		rt.Close()
		db.Close()
	}
	b.ReportMetric(float64(first.Microseconds())/float64(b.N), "first-request-µs")
}
