package sqlite

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
)

// connector opens modernc.org/sqlite connections and wraps each in a
// cachingConn, so that database/sql keeps using the driver as before while
// every connection keeps its prepared statements.
type connector struct {
	dsn   string
	drv   driver.Driver
	cache int       // prepared statements kept per connection
	stats *counters // shared by every connection of the DB
}

func (c *connector) Connect(context.Context) (driver.Conn, error) {
	inner, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &cachingConn{inner: inner, max: c.cache, stats: c.stats,
		byQuery: make(map[string]*list.Element)}, nil
}

func (c *connector) Driver() driver.Driver { return c.drv }

// cachingConn is one SQLite connection with a bounded cache of prepared
// statements, most recently used first. database/sql serializes every call
// on a connection (statements, row iteration, Close), so the cache needs no
// lock of its own.
//
// A cached statement serves one caller at a time: while the rows of a query
// on it are open it is busy, and the same SQL gets a fresh statement that is
// finalized when its rows close (a nested loop over one query, or a Row that
// was never scanned). A busy statement pushed out of the cache is finalized
// when its rows close, never under them.
type cachingConn struct {
	inner   driver.Conn
	max     int
	stats   *counters
	lru     list.List // of *cachedStmt, most recently used at the front
	byQuery map[string]*list.Element

	// calls counts the calls that reached the connection (statements and
	// row steps); inCall is set while one runs. The writer's stall watchdog
	// reads both from another goroutine.
	calls  atomic.Int64
	inCall atomic.Bool
}

type cachedStmt struct {
	query   string
	st      driver.Stmt
	busy    bool // rows of a query on st are open
	evicted bool // out of the cache: finalize once no longer busy
}

var (
	_ driver.ExecerContext      = (*cachingConn)(nil)
	_ driver.QueryerContext     = (*cachingConn)(nil)
	_ driver.SessionResetter    = (*cachingConn)(nil)
	_ driver.Validator          = (*cachingConn)(nil)
	_ driver.ConnPrepareContext = (*cachingConn)(nil)
)

func (c *cachingConn) enter() { c.calls.Add(1); c.inCall.Store(true) }
func (c *cachingConn) leave() { c.inCall.Store(false); c.calls.Add(1) }

// stmt returns a statement for query, from the cache when it has one that is
// not busy; temp reports a statement the caller must finalize after use.
func (c *cachingConn) stmt(ctx context.Context, query string) (cs *cachedStmt, temp bool, err error) {
	if e, ok := c.byQuery[query]; ok {
		cs = e.Value.(*cachedStmt)
		if !cs.busy {
			c.lru.MoveToFront(e)
			return cs, false, nil
		}
		temp = true
	}
	st, err := c.prepare(ctx, query)
	if err != nil {
		return nil, false, err
	}
	c.stats.prepares.Add(1)
	cs = &cachedStmt{query: query, st: st}
	if temp || c.max <= 0 {
		cs.evicted = true
		return cs, true, nil
	}
	c.byQuery[query] = c.lru.PushFront(cs)
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		o := old.Value.(*cachedStmt)
		delete(c.byQuery, o.query)
		o.evicted = true
		if !o.busy {
			o.st.Close()
		}
	}
	return cs, false, nil
}

func (c *cachingConn) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if p, ok := c.inner.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.inner.Prepare(query)
}

// ExecContext runs query on a cached prepared statement.
func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.enter()
	defer c.leave()
	cs, temp, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if temp {
		defer cs.st.Close()
	}
	ex, ok := cs.st.(driver.StmtExecContext)
	if !ok {
		return nil, errors.New("sqlite: driver statement has no ExecContext")
	}
	return ex.ExecContext(ctx, args)
}

// QueryContext runs query on a cached prepared statement, which stays busy
// until the rows are closed.
func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.enter()
	defer c.leave()
	cs, _, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	q, ok := cs.st.(driver.StmtQueryContext)
	if !ok {
		return nil, errors.New("sqlite: driver statement has no QueryContext")
	}
	cs.busy = true
	r, err := q.QueryContext(ctx, args)
	if err != nil {
		c.release(cs)
		return nil, err
	}
	return &cachedRows{Rows: r, c: c, cs: cs}, nil
}

// release marks cs free again, finalizing it if it left the cache.
func (c *cachingConn) release(cs *cachedStmt) {
	cs.busy = false
	if cs.evicted {
		cs.st.Close()
	}
}

// PrepareContext prepares a statement outside the cache (database/sql's
// Prepare; this package does not use it).
func (c *cachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.prepare(ctx, query)
}

func (c *cachingConn) Prepare(query string) (driver.Stmt, error) {
	return c.prepare(context.Background(), query)
}

// Begin is database/sql's transaction; this package runs BEGIN, SAVEPOINT
// and COMMIT as statements instead.
func (c *cachingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx is the inner driver's.
func (c *cachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	b, ok := c.inner.(driver.ConnBeginTx)
	if !ok {
		return nil, errors.New("sqlite: driver connection has no BeginTx")
	}
	return b.BeginTx(ctx, opts)
}

// Close finalizes the cached statements and closes the connection.
func (c *cachingConn) Close() error {
	var errs []error
	for e := c.lru.Front(); e != nil; e = e.Next() {
		if err := e.Value.(*cachedStmt).st.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	c.lru.Init()
	clear(c.byQuery)
	if err := c.inner.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqlite: close connection: %w", err)
	}
	return nil
}

func (c *cachingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *cachingConn) IsValid() bool {
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// cachedRows frees its statement for the next caller on Close.
type cachedRows struct {
	driver.Rows
	c      *cachingConn
	cs     *cachedStmt
	closed bool
}

func (r *cachedRows) Next(dest []driver.Value) error {
	r.c.enter()
	defer r.c.leave()
	return r.Rows.Next(dest)
}

func (r *cachedRows) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	err := r.Rows.Close()
	r.c.release(r.cs)
	return err
}

// The column type methods are passed on when the driver has them
// (sql.Rows.ColumnTypes).

func (r *cachedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *cachedRows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

func (r *cachedRows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *cachedRows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *cachedRows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}
