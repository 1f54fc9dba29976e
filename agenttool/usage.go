package agenttool

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
)

// TokenBudget caps the tokens of a run, awaited or detached. A run whose child goes
// over a cap is stopped: the child is canceled and the run ends
// interrupted with reason budget-exceeded (not retryable: FailureOf says
// so). The child reports its usage after each model call and whenever a
// run it awaits reports; a child that finishes before the parent has seen
// the report that crosses the cap keeps its result (its usage is
// recorded either way).
type TokenBudget struct {
	// MaxTokens caps the child's own model calls (the usage in its
	// messages' metadata); zero means no cap.
	MaxTokens int `json:"maxTokens,omitempty"`
	// MaxTreeTokens caps the whole tree below the run: the child's own
	// calls and those of every run it awaits, all the way down (the tree
	// usage); zero means no cap.
	MaxTreeTokens int `json:"maxTreeTokens,omitempty"`
}

// exceeded reports whether own or tree usage is over the budget.
func (b TokenBudget) exceeded(own, tree chat.Usage) bool {
	return (b.MaxTokens > 0 && own.TotalTokens > b.MaxTokens) ||
		(b.MaxTreeTokens > 0 && tree.TotalTokens > b.MaxTreeTokens)
}

func (b TokenBudget) column() any {
	if b == (TokenBudget{}) {
		return nil
	}
	raw, _ := json.Marshal(b)
	return string(raw)
}

func usageColumn(u *chat.Usage) any {
	if u == nil {
		return nil
	}
	raw, _ := json.Marshal(u)
	return string(raw)
}

// usageWatch follows the usage a child's stream reports (the
// message-metadata and finish chunks of its turns carry it), relays it to
// the parent's turn and checks the run's budget.
type usageWatch struct {
	budget TokenBudget

	mu        sync.Mutex
	own, tree chat.Usage
	seen      bool
	overOnce  sync.Once
	over      chan struct{} // closed when the budget is exceeded
	// relayer relays each new report while a relay runs; without one, a
	// new report waits for the next relay (unrelayed).
	relayer   *onDemand
	unrelayed bool
}

func newUsageWatch(b TokenBudget) *usageWatch {
	return &usageWatch{budget: b, over: make(chan struct{})}
}

// offer looks at one chunk body of the child's stream. It is cheap for
// the chunks that carry no usage and never blocks: it runs under the
// child's chat lock.
func (w *usageWatch) offer(body string) {
	if !strings.Contains(body, `"treeUsage"`) {
		return
	}
	var ch message.Chunk
	if json.Unmarshal([]byte(body), &ch) != nil ||
		(ch.Type != message.ChunkMessageMetadata && ch.Type != message.ChunkFinish) || len(ch.MessageMetadata) == 0 {
		return
	}
	var md chat.Metadata
	if json.Unmarshal(ch.MessageMetadata, &md) != nil || md.TreeUsage == nil {
		return
	}
	w.mu.Lock()
	w.tree, w.seen = *md.TreeUsage, true
	if md.Usage != nil {
		w.own = *md.Usage
	}
	over := w.budget.exceeded(w.own, w.tree)
	r := w.relayer
	w.unrelayed = r == nil
	w.mu.Unlock()
	if over {
		w.overOnce.Do(func() { close(w.over) })
	}
	if r != nil {
		r.kick()
	}
}

// usage returns the tree usage reported last, or nil before any report.
func (w *usageWatch) usage() *chat.Usage {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen {
		return nil
	}
	u := w.tree
	return &u
}

// budgetError is the error text of a run stopped by its token budget.
func (w *usageWatch) budgetError() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.budget.MaxTokens > 0 && w.own.TotalTokens > w.budget.MaxTokens {
		return fmt.Sprintf("Agent tool run used %d tokens, over its budget of %d; the parent stopped it.", w.own.TotalTokens, w.budget.MaxTokens)
	}
	return fmt.Sprintf("Agent tool run's tree used %d tokens, over its budget of %d; the parent stopped it.", w.tree.TotalTokens, w.budget.MaxTreeTokens)
}

// relay reports the child's usage to the chat turn that awaits the run
// (ctx is the tool call's), on a goroutine of its own after each new
// report (onDemand), until stop is called; stop (idempotent) reports the
// last usage once more and returns when the relay ended.
func (w *usageWatch) relay(ctx context.Context, runID string) (stop func()) {
	report := func() {
		if u := w.usage(); u != nil {
			_ = chat.ReportChildUsage(ctx, runID, *u)
		}
	}
	r := newOnDemand(report)
	w.mu.Lock()
	w.relayer = r
	pending := w.unrelayed
	w.unrelayed = false
	w.mu.Unlock()
	if pending {
		r.kick()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			if w.relayer == r {
				w.relayer = nil
			}
			w.mu.Unlock()
			r.stop()
			report()
		})
	}
}

// treeUsage is the usage a child's turn result records for its run: its
// tree usage, or nil when it used no tokens.
func treeUsage(res chat.TurnResult) *chat.Usage {
	if res.TreeUsage.IsZero() {
		return nil
	}
	u := res.TreeUsage
	return &u
}
