package chat

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
)

// Usage counts the tokens of model calls. Its JSON form is the one the
// AI SDK's LanguageModelUsage uses, and the one assistant messages carry in
// their metadata ("usage", "treeUsage").
type Usage struct {
	InputTokens  int `json:"inputTokens"`
	OutputTokens int `json:"outputTokens"`
	TotalTokens  int `json:"totalTokens"`
}

// Add returns u plus v.
func (u Usage) Add(v Usage) Usage {
	return Usage{InputTokens: u.InputTokens + v.InputTokens, OutputTokens: u.OutputTokens + v.OutputTokens,
		TotalTokens: u.TotalTokens + v.TotalTokens}
}

// IsZero reports whether u counts nothing.
func (u Usage) IsZero() bool { return u == Usage{} }

func usageOf(m model.Usage) Usage {
	return Usage{InputTokens: m.InputTokens, OutputTokens: m.OutputTokens, TotalTokens: m.InputTokens + m.OutputTokens}
}

// Metadata is what the framework writes into an assistant message's
// metadata (the AI SDK's UIMessage.metadata), next to the application's
// own (MetadataProvider). Every field is optional in the JSON form.
type Metadata struct {
	// CreatedAt is when the turn started, in Unix milliseconds (the
	// "start" chunk).
	CreatedAt int64 `json:"createdAt,omitempty"`
	// Model is the model id of the turn's model calls, when the model
	// tells it (model.Namer).
	Model string `json:"model,omitempty"`
	// FinishReason is how the model's last call ended ("finish" chunk).
	FinishReason string `json:"finishReason,omitempty"`
	// Usage counts the tokens of this message's own model calls.
	Usage *Usage `json:"usage,omitempty"`
	// TreeUsage is Usage plus the usage of every agent-tool run the turn
	// awaited, each counting its own children in turn: the usage of the
	// whole delegation tree below this message.
	TreeUsage *Usage `json:"treeUsage,omitempty"`
	// ChildUsage is the tree usage of each of those runs, by run id.
	ChildUsage map[string]Usage `json:"childUsage,omitempty"`
}

// MessageMetadata decodes the framework's part of an assistant message's
// metadata.
func MessageMetadata(m message.Message) Metadata {
	var md Metadata
	if len(m.Metadata) > 0 {
		_ = json.Unmarshal(m.Metadata, &md)
	}
	return md
}

// MetadataPhase says when a MetadataProvider is asked.
type MetadataPhase string

// Metadata phases, as the AI SDK's messageMetadata callback sees them.
const (
	MetadataStart  MetadataPhase = "start"
	MetadataFinish MetadataPhase = "finish"
)

// MetadataInfo is what a MetadataProvider is told about the turn.
type MetadataInfo struct {
	Phase     MetadataPhase
	TurnID    string
	MessageID string
	// Metadata is the framework's metadata so far (usage and model at
	// the finish).
	Metadata Metadata
}

// MetadataProvider adds the application's own metadata to assistant
// messages (the AI SDK's messageMetadata option): what MessageMetadata
// returns (a JSON object) is merged into the message's metadata when the
// turn starts (with the "start" chunk) and when it ends (a
// "message-metadata" chunk after the turn's last one). It runs as an input
// of the agent; nil adds nothing.
type MetadataProvider interface {
	MessageMetadata(ctx context.Context, info MetadataInfo) any
}

// turnUsage is a turn's token accounting, guarded by its mu.
type turnUsage struct {
	mu       sync.Mutex
	own      Usage
	model    string
	children map[string]Usage // agent-tool run id → its tree usage so far
}

func (u *turnUsage) tree() Usage {
	t := u.own
	for _, c := range u.children {
		t = t.Add(c)
	}
	return t
}

// snapshot returns the framework's metadata of the usage so far.
func (u *turnUsage) snapshot() Metadata {
	u.mu.Lock()
	defer u.mu.Unlock()
	own, tree := u.own, u.tree()
	var children map[string]Usage
	if len(u.children) > 0 {
		children = maps.Clone(u.children)
	}
	return Metadata{Model: u.model, Usage: &own, TreeUsage: &tree, ChildUsage: children}
}

// addModelUsage counts one model call of the turn.
func (t *turn) addModelUsage(m model.Model, u model.Usage) {
	t.usage.mu.Lock()
	defer t.usage.mu.Unlock()
	t.usage.own = t.usage.own.Add(usageOf(u))
	if n, ok := m.(model.Namer); ok && t.usage.model == "" {
		t.usage.model = n.ModelName()
	}
}

// writeUsage streams the usage so far as a message-metadata chunk, so a
// client (and an awaiting parent) sees it grow step by step.
func (t *turn) writeUsage() error {
	md := t.usage.snapshot()
	if md.Usage.IsZero() && md.TreeUsage.IsZero() {
		return nil // a model that reports no usage
	}
	md.Model = ""
	raw, _ := json.Marshal(md)
	return t.write(message.MessageMetadata(raw))
}

// ReportChildUsage records the usage so far of agent-tool run runID (its
// tree usage, its own children included) in the chat turn whose code runs
// in ctx, replacing the run's earlier report, and streams the turn's new
// tree usage. The agenttool package calls it as a run it awaits reports
// usage; a parent turn's tree usage so includes its children's all the
// way up the tree.
func ReportChildUsage(ctx context.Context, runID string, u Usage) error {
	t, ok := ctx.Value(turnKey{}).(*turn)
	if !ok {
		return errors.New("chat: no turn in context")
	}
	t.usage.mu.Lock()
	if t.usage.children == nil {
		t.usage.children = map[string]Usage{}
	}
	if t.usage.children[runID] == u {
		t.usage.mu.Unlock()
		return nil
	}
	t.usage.children[runID] = u
	t.usage.mu.Unlock()
	return t.writeUsage()
}

// finishMetadata merges the turn's usage and model into a finish chunk's
// metadata.
func (t *turn) finishMetadata(ch message.Chunk) message.Chunk {
	md := t.usage.snapshot()
	if md.Usage.IsZero() && md.TreeUsage.IsZero() && md.Model == "" {
		return ch
	}
	var m map[string]json.RawMessage
	if len(ch.MessageMetadata) > 0 && json.Unmarshal(ch.MessageMetadata, &m) != nil {
		return ch // not an object: left as it is
	}
	raw, _ := json.Marshal(md)
	var add map[string]json.RawMessage
	_ = json.Unmarshal(raw, &add)
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	maps.Copy(m, add)
	ch.MessageMetadata, _ = json.Marshal(m)
	return ch
}

// appMetadata asks the agent's MetadataProvider, as an input of the
// agent, for its metadata of phase; it returns nil without one or when it
// adds nothing.
func (c *core) appMetadata(t *turn, phase MetadataPhase) json.RawMessage {
	p, ok := c.self.(MetadataProvider)
	if !ok {
		return nil
	}
	info := MetadataInfo{Phase: phase, TurnID: t.row.ID, MessageID: t.row.MessageID}
	if phase == MetadataFinish {
		info.Metadata = t.usage.snapshot()
	} else {
		info.Metadata.CreatedAt = c.rt.Clock().Now().UnixMilli()
	}
	var v any
	_ = agent.Enter(t.ctx, c.self, func(ctx context.Context) error {
		return safeCall(func() error { v = p.MessageMetadata(ctx, info); return nil })
	})
	if v == nil {
		return nil
	}
	raw, err := json.Marshal(v)
	if err != nil || len(raw) == 0 || raw[0] != '{' {
		c.log.Warn("chat: MessageMetadata did not return a JSON object; ignored", "stream", t.row.ID, "err", err)
		return nil
	}
	return raw
}

// startMetadata is the metadata of a new message's start chunk: its
// creation time and the application's start metadata.
func (c *core) startMetadata(t *turn) json.RawMessage {
	m := map[string]json.RawMessage{}
	if app := c.appMetadata(t, MetadataStart); app != nil {
		_ = json.Unmarshal(app, &m)
	}
	m["createdAt"], _ = json.Marshal(c.rt.Clock().Now().UnixMilli())
	raw, _ := json.Marshal(m)
	return raw
}

// TreeUsageOf returns the tree usage recorded in an assistant message's
// metadata, else its own usage.
func TreeUsageOf(m message.Message) Usage {
	md := MessageMetadata(m)
	switch {
	case md.TreeUsage != nil:
		return *md.TreeUsage
	case md.Usage != nil:
		return *md.Usage
	}
	return Usage{}
}

// seedUsage starts the turn's accounting from the usage its message
// already records: a recovered turn's kept steps, a continuation's
// earlier turn.
func (t *turn) seedUsage() {
	if t.builder == nil {
		return
	}
	md := MessageMetadata(t.builder.Message())
	t.usage.mu.Lock()
	defer t.usage.mu.Unlock()
	if md.Usage != nil {
		t.usage.own = *md.Usage
	}
	if len(md.ChildUsage) > 0 {
		// By run: a run the turn awaits again reports anew, replacing its
		// earlier report rather than adding to it.
		t.usage.children = maps.Clone(md.ChildUsage)
	}
	if md.Model != "" {
		t.usage.model = md.Model
	}
}

// usageResult returns the usage of a turn's result: what the message's
// metadata records (the framework wrote it with the turn's writes), else
// the turn's own accounting.
func (t *turn) usageResult(m message.Message) (own, tree Usage) {
	md := MessageMetadata(m)
	if md.Usage != nil {
		own = *md.Usage
		tree = own
		if md.TreeUsage != nil {
			tree = *md.TreeUsage
		}
		return own, tree
	}
	t.usage.mu.Lock()
	defer t.usage.mu.Unlock()
	return t.usage.own, t.usage.tree()
}

// awaitsResult reports whether tool part p still waits for its final
// result: its input is available, or only a preliminary output arrived.
func awaitsResult(p message.Part) bool {
	return p.State == message.StateInputAvailable ||
		(p.State == message.StateOutputAvailable && p.Preliminary != nil && *p.Preliminary)
}

// publicModelError makes a *model.RequestError (a file too large, say)
// an error whose text the user sees.
func publicModelError(err error) error {
	if re, ok := errors.AsType[*model.RequestError](err); ok {
		return &agent.PublicError{Message: re.Message, Err: err}
	}
	return err
}
