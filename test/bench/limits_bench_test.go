package bench

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// The memory benchmarks of the limits (docs/limits.md). Each op starts a
// server on 127.0.0.1 with the default limits, applies one load with Go
// WebSocket clients in the same process, and reports the Go memory it adds:
// runtime.MemStats.HeapAlloc plus StackInuse (a goroutine's stack is not on
// the heap) after two GCs, minus the same before the load. The clients' own
// memory is in the figures too: both ends of each connection live in the
// process. Run them one op at a time:
//
//	go test -run '^$' -bench 'LimitsMemory' -benchtime 1x -count 3 ./test/bench/
//
// Metrics:
//   - idle-conn: heap-B/conn of 1,000 idle WebSockets to one Counter.
//   - in-flight-rpc: heap-B/call of 1,024 RPC calls waiting at an await
//     point (16 connections × 64, the default MaxCallsPerConn), over the
//     same 16 idle connections.
//   - flood=pipelined: heap-MiB of 40,000 calls pipelined on one socket to
//     a method that awaits, once each call is waiting or answered;
//     goroutines is how many more goroutines the server runs then.
//   - flood=slow-readers: heap-MiB with 30 clients that do not read their
//     20 MiB connect replay, once every replay was queued (or refused).
//   - flood=oversized: heap-MiB after 100 frames of 2 MiB (twice
//     MaxFrameBytes) were each answered, and alloc-MiB/frame, the garbage
//     that reading and discarding one costs.
func BenchmarkLimitsMemory(b *testing.B) {
	b.Run("idle-conn", benchIdleConn)
	b.Run("in-flight-rpc", benchInFlight)
	b.Run("flood=pipelined", benchPipelined)
	b.Run("flood=slow-readers", benchSlowReaders)
	b.Run("flood=oversized", benchOversized)
}

// benchDial dials path and reads its connect frames up to one of type
// last ("" reads none).
func benchDial(b *testing.B, env *testenv.Env, path string, last string) *websocket.Conn {
	b.Helper()
	c, err := testenv.DialRawUntil(context.Background(), env.URL(path), last)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func benchIdleConn(b *testing.B) {
	const n = 1000
	var perConn float64
	for range b.N {
		env := testenv.Start(b, testenv.Options{Classes: []agent.Class{counter.Class()}})
		benchDial(b, env, "/agents/counter/idle", wire.MCPServers).CloseNow() // hydrate first
		heap0 := memAfterGC()
		conns := make([]*websocket.Conn, n)
		for i := range conns {
			conns[i] = benchDial(b, env, "/agents/counter/idle", wire.MCPServers)
		}
		perConn += float64(int64(memAfterGC())-int64(heap0)) / n
		for _, c := range conns {
			c.CloseNow()
		}
		env.Close()
	}
	b.ReportMetric(perConn/float64(b.N), "heap-B/conn")
}

func benchInFlight(b *testing.B) {
	const conns, calls = 16, 64
	var perCall float64
	for range b.N {
		release := make(chan struct{})
		parked := make(chan struct{}, conns*calls)
		env := testenv.Start(b, testenv.Options{Classes: []agent.Class{testenv.ParkerClass(release, parked)}})
		cs := make([]*websocket.Conn, conns)
		for i := range cs {
			cs[i] = benchDial(b, env, fmt.Sprintf("/agents/parker/p%d", i), wire.MCPServers)
		}
		heap0 := memAfterGC()
		for _, c := range cs {
			for j := range calls {
				if err := c.Write(context.Background(), websocket.MessageText, fmt.Appendf(nil, `{"type":%q,"id":"c%d","method":"park","args":[]}`, wire.RPC, j)); err != nil {
					b.Fatal(err)
				}
			}
		}
		for range conns * calls {
			<-parked
		}
		perCall += float64(int64(memAfterGC())-int64(heap0)) / (conns * calls)
		close(release)
		for _, c := range cs {
			for range calls {
				if _, _, err := c.Read(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			c.CloseNow()
		}
		env.Close()
	}
	b.ReportMetric(perCall/float64(b.N), "heap-B/call")
}

func benchPipelined(b *testing.B) {
	const total = 40_000
	var heap, goroutines float64
	for range b.N {
		release := make(chan struct{})
		parked := make(chan struct{}, total)
		env := testenv.Start(b, testenv.Options{Classes: []agent.Class{testenv.ParkerClass(release, parked)}})
		c := benchDial(b, env, "/agents/parker/flood", wire.MCPServers)
		heap0, g0 := memAfterGC(), runtime.NumGoroutine()
		// Every call ends up waiting (parked) or refused (an error
		// response): the load is complete when all of them are one or the
		// other.
		refused := make(chan struct{}, total)
		readerDone := make(chan struct{})
		go func() {
			defer close(readerDone)
			for {
				_, data, err := c.Read(context.Background())
				if err != nil {
					return
				}
				if bytes.Contains(data, []byte(`"success":false`)) {
					refused <- struct{}{}
				}
			}
		}()
		for i := range total {
			if err := c.Write(context.Background(), websocket.MessageText, fmt.Appendf(nil, `{"type":%q,"id":"p%d","method":"park","args":[]}`, wire.RPC, i)); err != nil {
				b.Fatal(err)
			}
		}
		for range total {
			select {
			case <-parked:
			case <-refused:
			}
		}
		heap += float64(int64(memAfterGC())-int64(heap0)) / (1 << 20)
		goroutines += float64(runtime.NumGoroutine() - g0)
		close(release)
		c.CloseNow()
		<-readerDone
		env.Close()
	}
	b.ReportMetric(heap/float64(b.N), "heap-MiB")
	b.ReportMetric(goroutines/float64(b.N), "goroutines")
}

func benchSlowReaders(b *testing.B) {
	const clients = 30
	var heap float64
	for range b.N {
		sent := make(chan string, clients)
		env := testenv.Start(b, testenv.Options{Classes: []agent.Class{
			testenv.ReplayerClass(testenv.ReplayOptions{Frames: 320, FrameBytes: 64 << 10, Sent: sent})}})
		heap0 := memAfterGC()
		cs := make([]*websocket.Conn, clients)
		for i := range cs {
			cs[i] = benchDial(b, env, fmt.Sprintf("/agents/replayer/big?_pk=s%d", i), "")
			<-sent
		}
		heap += float64(int64(memAfterGC())-int64(heap0)) / (1 << 20)
		for _, c := range cs {
			c.CloseNow()
		}
		env.Close()
	}
	b.ReportMetric(heap/float64(b.N), "heap-MiB")
}

func benchOversized(b *testing.B) {
	const frames = 100
	var heap, alloc float64
	for range b.N {
		env := testenv.Start(b, testenv.Options{Classes: []agent.Class{counter.Class()}})
		c := benchDial(b, env, "/agents/counter/big", wire.MCPServers)
		big := bytes.Repeat([]byte("x"), 2<<20)
		var ms0, ms1 runtime.MemStats
		heap0 := memAfterGC()
		runtime.ReadMemStats(&ms0)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range frames {
				if _, _, err := c.Read(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		}()
		for range frames {
			if err := c.Write(context.Background(), websocket.MessageText, big); err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
		runtime.ReadMemStats(&ms1)
		alloc += float64(ms1.TotalAlloc-ms0.TotalAlloc) / frames / (1 << 20)
		heap += float64(int64(memAfterGC())-int64(heap0)) / (1 << 20)
		c.CloseNow()
		env.Close()
	}
	b.ReportMetric(heap/float64(b.N), "heap-MiB")
	b.ReportMetric(alloc/float64(b.N), "alloc-MiB/frame")
}

// memAfterGC returns the live heap plus the goroutine stacks after two
// collections.
func memAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}
