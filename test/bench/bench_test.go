// Package bench measures Agentry with real parts: the HTTP/WebSocket server
// on 127.0.0.1, the runtime and a SQLite file. It has benchmarks only; they
// run with -bench (see BENCHMARKS.md for the commands and the figures).
//
//	go test -run '^$' -bench . -benchtime 5000x ./test/bench/
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/store/sqlite"
)

// pg is the scratch PostgreSQL cluster of the BENCH_STORE=postgres runs.
var pg pgtest.Cluster

// tmpDir holds the stored-instance fixtures, shared by the benchmarks of one
// run and removed by TestMain.
var tmpDir string

func TestMain(m *testing.M) {
	var err error
	tmpDir, err = os.MkdirTemp("", "agentry-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(pg.Wrap(m), goleak.Cleanup(func(code int) {
		os.RemoveAll(tmpDir)
		os.Exit(code)
	}))
}

// storedInstances is the number of instances of the memory and start-up
// benchmarks.
const storedInstances = 10_000

func instanceName(i int) string { return fmt.Sprintf("bench-%05d", i) }

// fixture is a data folder with n Counter instances, instance i holding
// {"count": i+1}, written through the runtime and closed cleanly.
type fixture struct {
	dir   string
	bytes int64 // size of agentry.db (plus any WAL) after a clean close
	err   error
}

var (
	fixturesMu sync.Mutex
	fixtures   = map[int]*fixture{}
)

// storedFixture returns the fixture of n instances, creating it on first use.
func storedFixture(b *testing.B, n int) *fixture {
	b.Helper()
	fixturesMu.Lock()
	defer fixturesMu.Unlock()
	if f, ok := fixtures[n]; ok {
		if f.err != nil {
			b.Fatal(f.err)
		}
		return f
	}
	f := &fixture{dir: filepath.Join(tmpDir, fmt.Sprintf("fixture-%d", n))}
	f.err = f.create(n)
	fixtures[n] = f
	if f.err != nil {
		b.Fatal(f.err)
	}
	return f
}

func (f *fixture) create(n int) error {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(f.dir, "agentry.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	rt, err := agent.New(ctx, agent.Options{DB: db, IdleTimeout: -1})
	if err != nil {
		return err
	}
	defer rt.Close()
	if err := rt.Register(counter.Class()); err != nil {
		return err
	}
	// Four writers; the single SQLite writer connection serializes them.
	const workers = 4
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				p := agent.Root("Counter", instanceName(i))
				if _, err := rt.Call(ctx, p, "increment", i+1); err != nil {
					errs <- err
					return
				}
				rt.Evict(p)
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if err := rt.Close(); err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	f.bytes = dirBytes(f.dir)
	return nil
}

// copyTo copies the fixture's files into a new folder and returns it.
func (f *fixture) copyTo(b *testing.B) string {
	b.Helper()
	dst := b.TempDir()
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		if err := copyFile(filepath.Join(f.dir, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			b.Fatal(err)
		}
	}
	return dst
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	// Flush it to disk, as the file of a restarted server would be; a
	// freshly written file's dirty pages would otherwise be flushed by the
	// server's first fsync, inside the measured time.
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func dirBytes(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}
