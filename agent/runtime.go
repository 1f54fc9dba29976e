// Package agent is Agentry's runtime: agent classes and instances addressed
// by class and name, sub-agents addressed by their parent's path, durable
// per-instance state synced to clients, durable schedules whose callbacks are
// named methods, eviction of idle instances and rehydration with an OnStart
// hook, client connections with broadcast and callable RPC methods, and the
// observability channels.
//
// An agent is a Go type that embeds Base and is registered with a Runtime as
// a Class. Hooks (OnStart, OnConnect, OnBeforeSubAgent, …) are optional
// interfaces found by type assertion.
//
// An instance takes one input at a time (an RPC call, a frame, a schedule
// callback, a framework delivery), in arrival order per connection; inputs
// interleave only at await points (Await, Runtime.Call, and the framework's
// own waits). An instance in use is pinned: never evicted, never hydrated
// twice. docs/concurrency.md is the contract.
package agent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// Options configure a Runtime.
type Options struct {
	// DB stores every instance. Required.
	DB store.DB
	// Clock is the time source; nil means the real clock.
	Clock clockwork.Clock
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
	// Diag is the observability hub; nil creates one.
	Diag *diag.Hub
	// IdleTimeout is how long an instance with no connections and no work
	// in flight stays in memory. Zero means 5 minutes; a negative value
	// disables eviction.
	IdleTimeout time.Duration
	// RPCTimeout bounds a non-streaming RPC call; zero means 30 seconds.
	RPCTimeout time.Duration
	// MaxCallsPerConn bounds the RPC calls in flight on one client
	// connection (running, waiting at an await point, or streaming). A
	// call beyond it is refused at once with an error response, and the
	// connection's later frames go on being read. Zero means 64.
	MaxCallsPerConn int
	// MaxInstances bounds the instances in memory. Hydrating one more
	// evicts the least recently used idle instance first; when every
	// resident instance is in use, the hydration fails with
	// ErrTooManyInstances. Zero means 10,000.
	MaxInstances int
	// TracerProvider makes the runtime's spans: client RPC calls, and its
	// layers' (chat turns, model and tool calls, agent-tool runs). Nil
	// means the global provider (otel.GetTracerProvider), which records
	// nothing unless the program installs an OpenTelemetry SDK.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the runtime's metrics (RPC durations,
	// connections, resident instances, and the layers' runs, turns,
	// tokens and queue depths). Nil means the global provider
	// (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
	// Placement, when set, makes the runtime one node of a cluster: it
	// hydrates only the instances the placement owns (others fail with
	// ErrNotOwner), wakes and fires the schedules of those only, and every
	// write transaction of an instance runs the placement's fence first.
	Placement Placement
}

// The defaults of Options.
const (
	DefaultMaxCallsPerConn = 64
	DefaultMaxInstances    = 10_000
)

// Runtime hosts agent instances. Create one with New, register classes,
// call Start, and Close it when done.
type Runtime struct {
	db     store.DB
	place  Placement
	clock  clockwork.Clock
	log    *slog.Logger
	diag   *diag.Hub
	idle   time.Duration
	rpcTTL time.Duration

	maxCalls     int // per connection
	maxInstances int

	classes     map[string]*classInfo // by class name
	routes      map[string]*classInfo // by kebab route
	classByType map[reflect.Type]*classInfo

	mu        sync.Mutex
	instances map[string]*instance // by Path.String()
	idleList  idleList             // resident instances not in use, least recently used first
	closed    bool

	values     sync.Map // layer configuration, see SetValue
	migrated   sync.Map // component → *migration, see Migrate
	extensions []Extension
	hooks      []Hook                        // declared by layers (DeclareHooks)
	checks     []func(context.Context) error // start-time checks (AddCheck)
	started    bool                          // Start was called (guarded by mu)

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines
	sched  *scheduler
	tel    *telemetry
}

// New returns a Runtime. It applies the runtime's schema to opts.DB.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	if opts.DB == nil {
		return nil, errors.New("agent: Options.DB is required")
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Diag == nil {
		opts.Diag = diag.New(opts.Logger, opts.Clock.Now)
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = 5 * time.Minute
	}
	if opts.RPCTimeout == 0 {
		opts.RPCTimeout = 30 * time.Second
	}
	if opts.MaxCallsPerConn <= 0 {
		opts.MaxCallsPerConn = DefaultMaxCallsPerConn
	}
	if opts.MaxInstances <= 0 {
		opts.MaxInstances = DefaultMaxInstances
	}
	if err := store.Migrate(ctx, opts.DB, "agent", migrations); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	rt := &Runtime{
		db: opts.DB, place: opts.Placement, clock: opts.Clock, log: opts.Logger, diag: opts.Diag,
		idle: opts.IdleTimeout, rpcTTL: opts.RPCTimeout,
		maxCalls: opts.MaxCallsPerConn, maxInstances: opts.MaxInstances,
		classes: map[string]*classInfo{}, routes: map[string]*classInfo{},
		classByType: map[reflect.Type]*classInfo{},
		instances:   map[string]*instance{},
		ctx:         rctx, cancel: cancel,
	}
	rt.sched = newScheduler(rt)
	rt.tel = newTelemetry(rt, opts.TracerProvider, opts.MeterProvider)
	done := &migration{}
	done.once.Do(func() {})
	rt.migrated.Store("agent", done)
	return rt, nil
}

// Register adds an agent class. Register all classes before Start. A
// class is refused when it cannot work as declared: a callable that is not
// a method, a method named as a hook but with another signature (see
// Hook), a New that does not return the type of the class's handle.
func (rt *Runtime) Register(c Class) error {
	ci, err := newClassInfo(c)
	if err != nil {
		return err
	}
	if err := checkHooks(ci, rt.allHooks()); err != nil {
		return err
	}
	if rt.Started() {
		return fmt.Errorf("agent: register %s: %w", c.Name, ErrStarted)
	}
	if _, dup := rt.classes[c.Name]; dup {
		return fmt.Errorf("agent: class %s registered twice", c.Name)
	}
	if other, dup := rt.routes[ci.route]; dup {
		return fmt.Errorf("agent: classes %s and %s share the route %q", c.Name, other.Name, ci.route)
	}
	rt.classes[c.Name] = ci
	rt.routes[ci.route] = ci
	rt.classByType[ci.typ] = ci
	return nil
}

// MustRegister is Register that panics on error, for program set-up.
func (rt *Runtime) MustRegister(c Class) {
	if err := rt.Register(c); err != nil {
		panic(err)
	}
}

// ClassByRoute returns the class name registered under a kebab-case route
// name.
func (rt *Runtime) ClassByRoute(route string) (string, bool) {
	ci, ok := rt.routes[route]
	if !ok {
		return "", false
	}
	return ci.Name, true
}

// IsPublic reports whether clients may reach root instances of the class
// (Class.Public).
func (rt *Runtime) IsPublic(class string) bool {
	ci, ok := rt.classes[class]
	return ok && ci.Public
}

// HasClass reports whether a class of that name is registered.
func (rt *Runtime) HasClass(name string) bool {
	_, ok := rt.classes[name]
	return ok
}

// ClassOf returns the registered class name of an agent value's type.
func (rt *Runtime) ClassOf(a Agent) (string, bool) {
	ci, ok := rt.classByType[reflect.TypeOf(a)]
	if !ok {
		return "", false
	}
	return ci.Name, true
}

// Route returns the kebab-case route name of a registered class.
func (rt *Runtime) Route(class string) string {
	if ci, ok := rt.classes[class]; ok {
		return ci.route
	}
	return Kebab(class)
}

// Start begins background work: instances with a KeepAwake reason are
// hydrated (their layers resume unfinished work), schedules that came due while the process
// was down fire now, then each as it comes due; idle instances are evicted.
//
// Start first checks the set-up (every class against every hook the
// layers declared, and the layers' own checks, such as agent tools naming
// unknown classes) and returns those errors without starting anything.
func (rt *Runtime) Start(ctx context.Context) error {
	rt.mu.Lock()
	started := rt.started
	rt.started = true
	rt.mu.Unlock()
	if started {
		return errors.New("agent: Start called twice")
	}
	if err := rt.check(ctx); err != nil {
		return err
	}
	if err := rt.wakeAll(ctx); err != nil {
		return err
	}
	// A Close that ran during the wake-up (a server shut down while its
	// runtime recovered) has waited for the background work already:
	// start none after it.
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return ErrClosed
	}
	if err := rt.sched.start(ctx); err != nil {
		return err
	}
	if rt.idle > 0 {
		rt.wg.Add(1)
		go rt.evictLoop()
	}
	return nil
}

// Close stops background work, waits for it, and closes every connection.
// It does not close the DB.
func (rt *Runtime) Close() error {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return nil
	}
	rt.closed = true
	insts := make([]*instance, 0, len(rt.instances))
	for _, in := range rt.instances {
		insts = append(insts, in)
	}
	rt.mu.Unlock()
	rt.cancel()
	for _, in := range insts {
		in.closeConns(1001, "server shutting down")
	}
	rt.wg.Wait()
	rt.tel.close()
	return nil
}

// Context returns a context that is canceled when the runtime closes. Work
// that outlives a request (a detached run, a schedule) derives from it.
func (rt *Runtime) Context() context.Context { return rt.ctx }

// Go runs fn in a goroutine that Close waits for. fn should return when ctx
// (the runtime's context) is canceled.
//
// Once Close has begun, fn still runs in a goroutine, with the canceled
// context, but Close does not wait for it: a WaitGroup must not grow from
// zero while Close waits on it (a run's watcher started during Close was a
// data race).
func (rt *Runtime) Go(fn func(ctx context.Context)) {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		go fn(rt.ctx)
		return
	}
	rt.wg.Add(1)
	rt.mu.Unlock()
	go func() {
		defer rt.wg.Done()
		fn(rt.ctx)
	}()
}

// SetValue stores runtime-wide configuration of a layer under key (use an
// unexported key type, as with context values). Set values before Start.
func (rt *Runtime) SetValue(key, v any) { rt.values.Store(key, v) }

// Value returns what SetValue stored under key, or nil.
func (rt *Runtime) Value(key any) any {
	v, _ := rt.values.Load(key)
	return v
}

type migration struct {
	once sync.Once
	err  error
}

// Migrate applies a framework layer's schema (store.Migrate) once per
// runtime: the first instance of a layer to hydrate migrates, every later
// one gets the remembered outcome at no cost.
func (rt *Runtime) Migrate(ctx context.Context, component string, ms []store.Migration) error {
	v, _ := rt.migrated.LoadOrStore(component, &migration{})
	m := v.(*migration)
	m.once.Do(func() { m.err = store.Migrate(context.WithoutCancel(ctx), rt.db, component, ms) })
	return m.err
}

// Clock returns the runtime's time source.
func (rt *Runtime) Clock() clockwork.Clock { return rt.clock }

// DB returns the runtime's database.
func (rt *Runtime) DB() store.DB { return rt.db }

// Diag returns the observability hub.
func (rt *Runtime) Diag() *diag.Hub { return rt.diag }

// Logger returns the runtime's logger.
func (rt *Runtime) Logger() *slog.Logger { return rt.log }

// ErrUnknownClass is returned for a class name that was never registered.
var ErrUnknownClass = errors.New("agent: unknown class")

// ErrClosed is returned after the runtime was closed.
var ErrClosed = errors.New("agent: runtime closed")

// ErrTooManyInstances is returned when an instance must be hydrated while
// Options.MaxInstances instances are resident and all of them are in use.
// It is temporary: retry once some work has finished.
var ErrTooManyInstances = errors.New("agent: too many instances in memory")

// ErrDestroyed is returned for an instance that was destroyed while the
// caller held it.
var ErrDestroyed = errors.New("agent: instance destroyed")

// Get returns the instance at path, creating it on first use and hydrating
// it (state loaded, OnStart run) if it is not in memory. Called from an
// input of another instance (ctx holds its gate), the instance stays pinned
// in memory until that input ends; otherwise it may be evicted once idle,
// and code that keeps using it should pin it with Acquire.
func (rt *Runtime) Get(ctx context.Context, path Path) (Agent, error) {
	in, err := rt.acquire(ctx, path)
	if err != nil {
		return nil, err
	}
	if h := holdOf(ctx); h != nil && h.held.Load() {
		h.pin(in)
	} else {
		in.release()
	}
	return in.agent, nil
}

// Acquire returns the instance at path like Get, pinned: it is neither
// evicted nor hydrated a second time until release is called (release is
// idempotent).
func (rt *Runtime) Acquire(ctx context.Context, path Path) (a Agent, release func(), err error) {
	in, err := rt.acquire(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return in.agent, func() { once.Do(in.release) }, nil
}

// Exists reports whether an instance at path has ever been created and not
// destroyed, without creating it.
func (rt *Runtime) Exists(ctx context.Context, path Path) (bool, error) {
	var id int64
	err := rt.db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id FROM instances WHERE path = ?`, path.String()).Scan(&id)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("agent: look up %s: %w", path, err)
	}
	return true, nil
}

// Resident reports whether the instance at path is in memory.
func (rt *Runtime) Resident(path Path) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	_, ok := rt.instances[path.String()]
	return ok
}

// Lookup returns the instance at path if it is in memory and ready, without
// hydrating it.
func (rt *Runtime) Lookup(path Path) (Agent, bool) {
	rt.mu.Lock()
	in, ok := rt.instances[path.String()]
	rt.mu.Unlock()
	if !ok || !in.isReady() || in.hydrateErr != nil {
		return nil, false
	}
	return in.agent, true
}

// ResidentCount returns how many instances are in memory.
func (rt *Runtime) ResidentCount() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.instances)
}

// acquire returns the hydrated instance at path with a busy reference that
// the caller must release. A busy instance is never evicted.
func (rt *Runtime) acquire(ctx context.Context, path Path) (*instance, error) {
	if len(path) == 0 {
		return nil, errors.New("agent: empty path")
	}
	for _, h := range path {
		if _, ok := rt.classes[h.Class]; !ok {
			return nil, fmt.Errorf("%w %q", ErrUnknownClass, h.Class)
		}
		if h.Name == "" {
			return nil, fmt.Errorf("agent: empty instance name in %s", path)
		}
	}
	key := path.String()
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return nil, ErrClosed
	}
	in, ok := rt.instances[key]
	var stale *instance
	if ok && rt.place != nil && in.epoch != 0 {
		if cur, held := rt.place.Epoch(path); held && cur != in.epoch {
			// Hydrated under a lease this node lost and took again: its
			// writes are fenced. It is forgotten (its holders finish with
			// it) and the instance hydrated anew under the current lease.
			rt.forgetLocked(in)
			stale, ok = in, false
		}
	}
	var epoch int64
	if !ok && rt.place != nil {
		var held bool
		if epoch, held = rt.place.Epoch(path); !held {
			rt.mu.Unlock()
			return nil, notOwned(path)
		}
	}
	var evicted []*instance
	if !ok {
		// Make room first: evict the least recently used idle instances.
		for len(rt.instances) >= rt.maxInstances {
			lru := rt.idleList.front()
			if lru == nil {
				n := len(rt.instances)
				rt.mu.Unlock()
				rt.diag.Publish(ctx, diag.ChannelAgent, "refuse", key, map[string]any{"resident": n})
				return nil, fmt.Errorf("%w: %d resident and none idle (Options.MaxInstances); %s not hydrated", ErrTooManyInstances, n, key)
			}
			rt.forgetLocked(lru)
			evicted = append(evicted, lru)
		}
		in = newInstance(rt, path, rt.classes[path.Leaf().Class])
		in.epoch = epoch
		rt.instances[key] = in
	}
	in.pinLocked()
	rt.mu.Unlock()
	if stale != nil {
		stale.closeConns(1012, "agent moved to another node")
	}
	for _, e := range evicted {
		rt.diag.Publish(ctx, diag.ChannelAgent, "evict", e.key, map[string]any{"reason": "max_instances"})
	}
	if !ok {
		exists, _ := ctx.Value(existsKey{}).(bool)
		in.hydrate(exists, func(c context.Context) context.Context {
			if d, ok := store.RetryLimitOf(ctx); ok {
				return store.WithRetryLimit(c, d)
			}
			return c
		})
	}

	select {
	case <-in.ready:
	case <-ctx.Done():
		in.release()
		return nil, ctx.Err()
	}
	if in.hydrateErr != nil {
		in.release()
		return nil, in.hydrateErr
	}
	return in, nil
}

// evictLoop evicts idle instances every quarter of the idle timeout.
func (rt *Runtime) evictLoop() {
	defer rt.wg.Done()
	tick := rt.clock.NewTicker(max(rt.idle/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-rt.ctx.Done():
			return
		case <-tick.Chan():
			rt.EvictIdle()
		}
	}
}

// EvictIdle removes from memory every instance that has been idle (no
// connections, no work in flight) for at least the idle timeout, and returns
// how many it evicted. The background loop calls it; tests may too.
func (rt *Runtime) EvictIdle() int {
	now := rt.clock.Now()
	var evicted []*instance
	rt.mu.Lock()
	// The idle list is in the order instances went idle: stop at the first
	// one that has not been idle long enough.
	for in := rt.idleList.front(); in != nil && now.Sub(in.lastActive) >= rt.idle; in = rt.idleList.front() {
		rt.forgetLocked(in)
		evicted = append(evicted, in)
	}
	rt.mu.Unlock()
	for _, in := range evicted {
		rt.diag.Publish(rt.ctx, diag.ChannelAgent, "evict", in.key, nil)
	}
	return len(evicted)
}

// Evict removes the instance at path from memory if it is idle now,
// regardless of the idle timeout, and reports whether it did. Storage is
// untouched; the next use rehydrates it.
func (rt *Runtime) Evict(path Path) bool {
	key := path.String()
	rt.mu.Lock()
	in, ok := rt.instances[key]
	if ok && in.busy == 0 && in.isReady() {
		rt.forgetLocked(in)
	} else {
		ok = false
	}
	rt.mu.Unlock()
	if ok {
		rt.diag.Publish(rt.ctx, diag.ChannelAgent, "evict", key, nil)
	}
	return ok
}
