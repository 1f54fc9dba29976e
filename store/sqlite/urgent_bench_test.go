package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// BenchmarkUpdateUnderLoad measures one Update's latency, from the call to
// its return, while 256 goroutines keep the writer busy with ordinary
// Updates of one 200-byte row each (the chunk commits of streams that are
// flowing). One op is one measured Update, marked store.WithUrgent or not;
// p50 and p99 are reported, and bg-tx/s, the ordinary Updates committed
// per second meanwhile (what the measured ones cost the others). The urgent one is what a chat request's
// acceptance and a turn's first commit pay at load.
func BenchmarkUpdateUnderLoad(b *testing.B) {
	for _, urgent := range []bool{false, true} {
		b.Run(fmt.Sprint("urgent=", urgent), func(b *testing.B) { benchUpdateUnderLoad(b, urgent) })
	}
}

func benchUpdateUnderLoad(b *testing.B, urgent bool) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "load.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE rows (k TEXT PRIMARY KEY, v TEXT)`)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	body := strings.Repeat("x", 200)
	var n atomic.Int64
	insert := func(ctx context.Context) error {
		return db.Update(ctx, func(tx store.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO rows (k, v) VALUES (?, ?)`, fmt.Sprint(n.Add(1)), body)
			return err
		})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := insert(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	mctx := ctx
	if urgent {
		mctx = store.WithUrgent(ctx)
	}
	// The writer's queue fills before the first measured op.
	for range 512 {
		if err := insert(ctx); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	n0, t0 := n.Load(), time.Now()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := insert(mctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(float64(n.Load()-n0-int64(b.N))/time.Since(t0).Seconds(), "bg-tx/s")
	slices.Sort(lat)
	for _, p := range []int{50, 99} {
		b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*p/100)].Microseconds()), fmt.Sprintf("p%d-µs", p))
	}
}
