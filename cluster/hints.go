package cluster

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
)

// HintChannel is the PostgreSQL notification channel of the wake-up hints
// between nodes.
const HintChannel = "agentry_hint"

// Bounds of the hints.
const (
	// maxHintQueue bounds the hints waiting to be sent; past it a hint is
	// dropped (the follower's poll finds the change).
	maxHintQueue = 4096
	// maxHintBatch bounds the hints sent in one statement.
	maxHintBatch = 256
	// maxHintWatches bounds the followers watching at once; past it Watch
	// returns no channel and the follower polls.
	maxHintWatches = 100_000
)

// Hints is the wake-up between nodes (agenttool.Hints) on PostgreSQL's
// LISTEN/NOTIFY: a child's node notifies after its run's record or stream
// changed, and the node following the run (the parent's) wakes at once
// instead of at its next poll. A node holds one listening connection
// (reconnected after a failure, when every watcher is woken, since hints
// may have been missed) and sends notifications in batches from a bounded
// queue. Notifications carry only a hash of the child's path: a collision
// wakes a follower for nothing, never misleads it, because a woken
// follower reads the database, and a lost one is found by the poll.
type Hints struct {
	pool  *pgxpool.Pool
	log   *slog.Logger
	clock clockwork.Clock

	queue chan string

	mu      sync.Mutex
	watches map[string]map[chan struct{}]struct{}
	n       int
	live    bool // listening now
}

var _ agenttool.Hints = (*Hints)(nil)

// NewHints returns the hints of a node on pool; Run makes them work.
func NewHints(pool *pgxpool.Pool, logger *slog.Logger, clock clockwork.Clock) *Hints {
	if logger == nil {
		logger = slog.Default()
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Hints{pool: pool, log: logger, clock: clock, queue: make(chan string, maxHintQueue),
		watches: map[string]map[chan struct{}]struct{}{}}
}

// hintKey is the payload of a child's hints.
func hintKey(child agent.Path) string {
	f := fnv.New64a()
	f.Write([]byte(child.String()))
	return strconv.FormatUint(f.Sum64(), 36)
}

// Hint queues a notification for child; it never blocks.
func (hs *Hints) Hint(child agent.Path) {
	select {
	case hs.queue <- hintKey(child):
	default: // full: the followers' polls find the change
	}
}

// Watch returns a channel that receives after a notification for child.
func (hs *Hints) Watch(child agent.Path) (<-chan struct{}, func()) {
	key := hintKey(child)
	ch := make(chan struct{}, 1)
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.n >= maxHintWatches {
		return nil, func() {}
	}
	if hs.watches[key] == nil {
		hs.watches[key] = map[chan struct{}]struct{}{}
	}
	hs.watches[key][ch] = struct{}{}
	hs.n++
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			hs.mu.Lock()
			defer hs.mu.Unlock()
			delete(hs.watches[key], ch)
			if len(hs.watches[key]) == 0 {
				delete(hs.watches, key)
			}
			hs.n--
		})
	}
}

// Listening reports whether the listening connection is up.
func (hs *Hints) Listening() bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.live
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wakeKey wakes the watchers of key, or every watcher for "".
func (hs *Hints) wakeKey(key string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if key != "" {
		for ch := range hs.watches[key] {
			wake(ch)
		}
		return
	}
	for _, m := range hs.watches {
		for ch := range m {
			wake(ch)
		}
	}
}

// Run listens and sends until ctx is done.
func (hs *Hints) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		hs.send(ctx)
	}()
	hs.listen(ctx)
	wg.Wait()
}

// send sends the queued hints, a batch per statement, duplicates merged.
func (hs *Hints) send(ctx context.Context) {
	for {
		var first string
		select {
		case <-ctx.Done():
			return
		case first = <-hs.queue:
		}
		batch := []string{first}
		seen := map[string]bool{first: true}
	more:
		for len(batch) < maxHintBatch {
			select {
			case k := <-hs.queue:
				if !seen[k] {
					seen[k] = true
					batch = append(batch, k)
				}
			default:
				break more
			}
		}
		if _, err := hs.pool.Exec(ctx, `SELECT pg_notify('`+HintChannel+`', k) FROM unnest($1::text[]) AS k`, batch); err != nil && ctx.Err() == nil {
			hs.log.Warn("cluster: send hints", "n", len(batch), "err", err)
		}
	}
}

// listen holds the listening connection, reconnecting after a failure.
func (hs *Hints) listen(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := hs.listenOnce(ctx)
		hs.mu.Lock()
		if hs.live {
			backoff = 50 * time.Millisecond // it worked for a while
		}
		hs.live = false
		hs.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		hs.log.Warn("cluster: hint listener", "err", err, "retry", backoff)
		t := hs.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (hs *Hints) listenOnce(ctx context.Context) error {
	cfg := hs.pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "agentry-hints"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `LISTEN `+HintChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs.mu.Lock()
	hs.live = true
	hs.mu.Unlock()
	// Hints sent while no connection listened are lost: wake everyone.
	hs.wakeKey("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload != "" {
			hs.wakeKey(n.Payload)
		}
	}
}
