package sqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// crashEnv names the database file when the test binary runs as the
// crash helper (see TestMain).
const crashEnv = "AGENTRY_SQLITE_CRASH_HELPER"

const (
	crashWriters = 8 // concurrent writers in the helper: they share commits
	crashRows    = 4 // rows per transaction
)

// crashHelper writes forever from crashWriters goroutines. Transaction i
// inserts crashRows rows tagged i; every 5th fails after its inserts. It
// prints "ok i" once Update(i) returned nil, and "failed i" for a failure.
func crashHelper(path string) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	err = db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS r (tag BIGINT NOT NULL, n BIGINT NOT NULL, pad TEXT NOT NULL)`)
		return err
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) {
		mu.Lock()
		out.WriteString(s + "\n")
		out.Flush()
		mu.Unlock()
	}
	fmt.Println("ready")
	pad := strings.Repeat("x", 300)
	for w := range crashWriters {
		go func() {
			for i := w; ; i += crashWriters {
				err := db.Update(ctx, func(tx store.Tx) error {
					for n := range crashRows {
						if _, err := tx.Exec(ctx, `INSERT INTO r (tag, n, pad) VALUES (?, ?, ?)`, i, n, pad); err != nil {
							return err
						}
					}
					if i%5 == 4 {
						return errFail
					}
					return nil
				})
				switch {
				case err == nil:
					st := db.Stats()
					say(fmt.Sprint("ok ", i, " ", st.Committed, " ", st.Commits))
				case errors.Is(err, errFail):
					say(fmt.Sprint("failed ", i))
				default:
					say(fmt.Sprint("error ", i, " ", err))
				}
			}
		}()
	}
	select {}
}

// A process killed (SIGKILL) while its writers' transactions share
// commits leaves each transaction all or nothing: after reopening, every
// tag has all its rows or none, every acknowledged transaction is there and
// no failed one is.
func TestCrashMidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a subprocess")
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	for round := range 3 {
		acked := map[int]bool{}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		want := 200 + round*37 // kill at a different moment each round
		seen := 0
		lines := make(chan string)
		go func() {
			defer close(lines)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		deadline := time.After(limit)
	read:
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("round %d: helper exited: %s", round, stderr.String())
				}
				f := strings.Fields(line)
				switch f[0] {
				case "ready":
				case "ok":
					i, _ := strconv.Atoi(f[1])
					acked[i] = true
					if seen++; seen >= want {
						t.Logf("round %d: killed after %s transactions in %s commits", round, f[2], f[3])
						break read
					}
				case "failed":
				default:
					t.Fatalf("round %d: helper: %s", round, line)
				}
			case <-deadline:
				t.Fatalf("round %d: %d of %d acknowledgements", round, seen, want)
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		for range lines { // drain what was printed before the kill
		}
		cmd.Wait()

		db := open(t, path)
		ctx := context.Background()
		counts := map[int]int{}
		err = db.View(ctx, func(tx store.Tx) error {
			rows, err := tx.Query(ctx, `SELECT tag, count(*) FROM r GROUP BY tag`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var tag, n int
				if err := rows.Scan(&tag, &n); err != nil {
					return err
				}
				counts[tag] = n
			}
			return rows.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		for tag, n := range counts {
			if n != crashRows {
				t.Fatalf("round %d: transaction %d has %d of %d rows", round, tag, n, crashRows)
			}
			if tag%5 == 4 {
				t.Fatalf("round %d: failed transaction %d was committed", round, tag)
			}
		}
		for i := range acked {
			if counts[i] != crashRows {
				t.Fatalf("round %d: acknowledged transaction %d lost", round, i)
			}
		}
		// The next round appends to the same file: start from a clean table.
		if err := db.Update(ctx, func(tx store.Tx) error { _, err := tx.Exec(ctx, `DELETE FROM r`); return err }); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
}
