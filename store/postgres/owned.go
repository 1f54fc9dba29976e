package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"

	"github.com/agentry/agentry/store"
)

// Instances' own tables (see the package comment): one shared table per
// (class, name), its rows keyed by agentry_instance, seen by an instance
// through a view that selects its rows.

const instanceColumn = "agentry_instance"

// currentInstance is the SQL of the transaction's current instance.
const currentInstance = `NULLIF(current_setting('agentry.instance', true), '')::bigint`

// sharedName is the physical table of class's table name.
func sharedName(class, name string) string {
	name = strings.ToLower(name)
	h := fnv.New32a()
	h.Write([]byte(class))
	h.Write([]byte{0})
	h.Write([]byte(name))
	short := name
	if len(short) > 40 {
		short = short[:40]
	}
	return fmt.Sprintf("ut_%s_%08x", short, h.Sum32())
}

func viewName(class, name string) string { return sharedName(class, name) + "_v" }

// Owned implements store.OwnedTables.
func (t *tx) Owned(o store.Owner) store.Tx { return &owned{t: t, o: o} }

// DropOwned implements store.OwnedTables: the instance's rows go; the
// shared table stays for the other instances.
func (t *tx) DropOwned(ctx context.Context, o store.Owner, name string) error {
	base := sharedName(o.Class, name)
	if ok, err := relationExists(ctx, t, base); err != nil || !ok {
		return err
	}
	_, err := t.Exec(ctx, `DELETE FROM `+base+` WHERE `+instanceColumn+` = ?`, o.ID)
	return err
}

// owned is the store.Tx of an instance's own tables.
type owned struct {
	t *tx
	o store.Owner
}

var (
	ownedCreate   = regexp.MustCompile(`(?is)^\s*CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?\{(\w+)\}\s*\((.*)\)\s*;?\s*$`)
	ownedDrop     = regexp.MustCompile(`(?is)^\s*DROP\s+TABLE\s+(IF\s+EXISTS\s+)?\{(\w+)\}\s*;?\s*$`)
	ownedAlter    = regexp.MustCompile(`(?is)^\s*ALTER\s+TABLE\s+\{(\w+)\}\s+ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+(.*?)\s*;?\s*$`)
	ownedAlterAny = regexp.MustCompile(`(?is)^\s*ALTER\s+TABLE\s+\{`)
	ownedIndex    = regexp.MustCompile(`(?is)^\s*CREATE\s+(UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+ON\s+\{(\w+)\}\s*\((.*)\)\s*;?\s*$`)
	ownedInsert   = regexp.MustCompile(`(?is)^(\s*INSERT\s+INTO\s+)\{(\w+)\}`)
	onConflict    = regexp.MustCompile(`(?i)\bON\s+CONFLICT\s*\(`)
)

// result is the sql.Result of a statement this package answered itself.
type result int64

func (r result) LastInsertId() (int64, error) {
	return 0, errors.New("postgres: LastInsertId is not supported")
}
func (r result) RowsAffected() (int64, error) { return int64(r), nil }

// use sets the transaction's current instance, if it is not o already.
func (w *owned) use(ctx context.Context) error {
	if w.t.instance == w.o.ID {
		return nil
	}
	if err := w.t.begin(ctx); err != nil {
		return err
	}
	if _, err := w.t.tx.ExecContext(context.WithoutCancel(ctx), `SELECT set_config('agentry.instance', $1, true)`,
		strconv.FormatInt(w.o.ID, 10)); err != nil {
		return w.t.note(err)
	}
	w.t.instance = w.o.ID
	return nil
}

// views replaces every {name} with the instance's view of it.
func (w *owned) views(q string) string {
	return store.OwnedTableRef.ReplaceAllStringFunc(q, func(m string) string {
		return viewName(w.o.Class, m[1:len(m)-1])
	})
}

// rewrite is the statement for q; handled reports statements answered
// here (DDL), with their result.
func (w *owned) rewrite(ctx context.Context, q string) (out string, handled bool, err error) {
	switch {
	case ownedCreate.MatchString(q):
		m := ownedCreate.FindStringSubmatch(q)
		return "", true, w.create(ctx, m[2], m[3])
	case ownedDrop.MatchString(q):
		m := ownedDrop.FindStringSubmatch(q)
		return "", true, w.t.DropOwned(ctx, w.o, m[2])
	case ownedAlter.MatchString(q):
		m := ownedAlter.FindStringSubmatch(q)
		return "", true, w.addColumn(ctx, m[1], m[2], m[3])
	case ownedAlterAny.MatchString(q):
		return "", true, errors.New("postgres: on an instance's own table only ALTER TABLE … ADD COLUMN is supported")
	case ownedIndex.MatchString(q):
		m := ownedIndex.FindStringSubmatch(q)
		return "", true, w.index(ctx, m[1] != "", m[2], m[3], m[4])
	case ownedInsert.MatchString(q):
		m := ownedInsert.FindStringSubmatchIndex(q)
		name := q[m[4]:m[5]]
		target := sharedName(w.o.Class, name) + " AS " + viewName(w.o.Class, name)
		rest := q[m[1]:]
		rest = onConflict.ReplaceAllString(rest, "ON CONFLICT ("+instanceColumn+", ")
		return q[:m[3]] + target + w.views(rest), false, nil
	}
	return w.views(q), false, nil
}

func (w *owned) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if err := w.use(ctx); err != nil {
		return nil, err
	}
	out, handled, err := w.rewrite(ctx, q)
	if handled || err != nil {
		return result(0), err
	}
	return w.t.Exec(ctx, out, args...)
}

func (w *owned) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if err := w.use(ctx); err != nil {
		return nil, err
	}
	out, handled, err := w.rewrite(ctx, q)
	if err != nil {
		return nil, err
	}
	if handled {
		return nil, errors.New("postgres: DDL on an instance's own table must run with Exec")
	}
	return w.t.Query(ctx, out, args...)
}

func (w *owned) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if err := w.use(ctx); err != nil {
		return w.t.QueryRow(failedContext{err}, q)
	}
	out, handled, err := w.rewrite(ctx, q)
	if err == nil && handled {
		err = errors.New("postgres: DDL on an instance's own table must run with Exec")
	}
	if err != nil {
		return w.t.QueryRow(failedContext{err}, q)
	}
	return w.t.QueryRow(ctx, out, args...)
}

// lockDDL takes the transaction-scoped advisory lock of a shared table, so
// two instances never create or alter it at once.
func (w *owned) lockDDL(ctx context.Context, base string) error {
	h := fnv.New64a()
	h.Write([]byte("agentry owned table " + base))
	_, err := w.t.Exec(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(h.Sum64()))
	return err
}

func (w *owned) exists(ctx context.Context, rel string) (bool, error) {
	return relationExists(ctx, w.t, rel)
}

// relationExists reads pg_class with the statement's snapshot rather than
// resolving the name (to_regclass): name lookups go through the backend's
// catalog cache, which an advisory lock does not refresh, so a table
// another transaction created and committed while this one waited for the
// lock could look absent.
func relationExists(ctx context.Context, t *tx, rel string) (bool, error) {
	var n int
	err := t.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_class WHERE relname = ?
		AND relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema())`, rel).Scan(&n)
	return n > 0, err
}

// create creates the shared table of name with the instance's column and
// constraint list body, and its view, unless it exists.
func (w *owned) create(ctx context.Context, name, body string) error {
	base := sharedName(w.o.Class, name)
	if _, ok := w.t.db.ddl.Load(base); ok {
		return nil
	}
	if ok, err := w.exists(ctx, base); err != nil || ok {
		if ok {
			w.t.db.ddl.Store(base, true)
		}
		return err
	}
	if err := w.lockDDL(ctx, base); err != nil {
		return err
	}
	if ok, err := w.exists(ctx, base); err != nil || ok {
		return err
	}
	defs, keyed, err := w.sharedColumns(body)
	if err != nil {
		return fmt.Errorf("postgres: instance table {%s}: %w", name, err)
	}
	defs = append(defs, instanceColumn+` BIGINT NOT NULL DEFAULT `+currentInstance+` REFERENCES instances(id) ON DELETE CASCADE`)
	if _, err := w.t.Exec(ctx, `CREATE TABLE `+base+` (`+strings.Join(defs, ", ")+`)`); err != nil {
		return err
	}
	if !keyed {
		if _, err := w.t.Exec(ctx, `CREATE INDEX `+base+`_inst ON `+base+` (`+instanceColumn+`)`); err != nil {
			return err
		}
	}
	return w.replaceView(ctx, name)
}

// replaceView (re)creates the instance view of name over the shared
// table's columns.
func (w *owned) replaceView(ctx context.Context, name string) error {
	base := sharedName(w.o.Class, name)
	rows, err := w.t.Query(ctx, `SELECT attname FROM pg_attribute
		WHERE attrelid = ?::regclass AND attnum > 0 AND NOT attisdropped AND attname <> ? ORDER BY attnum`, base, instanceColumn)
	if err != nil {
		return err
	}
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return err
		}
		cols = append(cols, `"`+c+`"`)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = w.t.Exec(ctx, `CREATE OR REPLACE VIEW `+viewName(w.o.Class, name)+` AS SELECT `+strings.Join(cols, ", ")+
		` FROM `+base+` WHERE `+instanceColumn+` = `+currentInstance+` WITH LOCAL CHECK OPTION`)
	return err
}

// addColumn is ALTER TABLE {name} ADD COLUMN col def: the column is added
// to the shared table once, for every instance of the class.
func (w *owned) addColumn(ctx context.Context, name, col, def string) error {
	base := sharedName(w.o.Class, name)
	if err := w.lockDDL(ctx, base); err != nil {
		return err
	}
	var n int
	if err := w.t.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = ?::regclass AND attname = ? AND NOT attisdropped`,
		base, strings.ToLower(col)).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if addedKey.MatchString(def) {
		return errors.New("postgres: an added column of an instance's own table cannot be a key or a reference")
	}
	if _, err := w.t.Exec(ctx, `ALTER TABLE `+base+` ADD COLUMN `+columnDialect(col+" "+def)); err != nil {
		return err
	}
	return w.replaceView(ctx, name)
}

// index is CREATE [UNIQUE] INDEX name ON {table} (cols): one index of the
// shared table, led by the instance column.
func (w *owned) index(ctx context.Context, unique bool, idx, table, cols string) error {
	base := sharedName(w.o.Class, table)
	if err := w.lockDDL(ctx, base); err != nil {
		return err
	}
	h := fnv.New32a()
	h.Write([]byte(strings.ToLower(idx)))
	kind := "INDEX"
	if unique {
		kind = "UNIQUE INDEX"
	}
	_, err := w.t.Exec(ctx, fmt.Sprintf(`CREATE %s IF NOT EXISTS %s_%08x ON %s (%s, %s)`, kind, base, h.Sum32(), base, instanceColumn, cols))
	return err
}

var (
	addedKey  = regexp.MustCompile(`(?i)\b(PRIMARY\s+KEY|UNIQUE|REFERENCES)\b`)
	colRowid  = regexp.MustCompile(`(?is)^(\w+)\s+INTEGER\s+PRIMARY\s+KEY(?:\s+AUTOINCREMENT)?\b(.*)$`)
	colPK     = regexp.MustCompile(`(?i)\s+PRIMARY\s+KEY(?:\s+(?:ASC|DESC))?`)
	colUnique = regexp.MustCompile(`(?i)\s+UNIQUE\b`)
	colRef    = regexp.MustCompile(`(?is)\s+REFERENCES\s+\{(\w+)\}\s*\(\s*(\w+)\s*\)((?:\s+ON\s+(?:DELETE|UPDATE)\s+(?:CASCADE|RESTRICT|SET\s+NULL|SET\s+DEFAULT|NO\s+ACTION))*)`)
	tblKey    = regexp.MustCompile(`(?is)^(?:CONSTRAINT\s+\w+\s+)?(PRIMARY\s+KEY|UNIQUE)\s*\((.*)\)\s*$`)
	tblFK     = regexp.MustCompile(`(?is)^(?:CONSTRAINT\s+\w+\s+)?FOREIGN\s+KEY\s*\((.*?)\)\s*REFERENCES\s+\{(\w+)\}\s*\((.*?)\)(.*)$`)
	tblOther  = regexp.MustCompile(`(?is)^(?:CONSTRAINT\s+\w+\s+)?CHECK\b`)
)

// sharedColumns turns the column and constraint list of an instance's
// CREATE TABLE into the shared table's: keys and references gain the
// instance column first. keyed reports a primary key (whose index serves
// the instance column too).
func (w *owned) sharedColumns(body string) (defs []string, keyed bool, err error) {
	var constraints []string
	for _, item := range splitTop(body) {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		switch {
		case tblKey.MatchString(item):
			m := tblKey.FindStringSubmatch(item)
			kind := strings.ToUpper(strings.Join(strings.Fields(m[1]), " "))
			keyed = keyed || kind == "PRIMARY KEY"
			constraints = append(constraints, kind+" ("+instanceColumn+", "+m[2]+")")
		case tblFK.MatchString(item):
			m := tblFK.FindStringSubmatch(item)
			constraints = append(constraints, "FOREIGN KEY ("+instanceColumn+", "+m[1]+") REFERENCES "+
				sharedName(w.o.Class, m[2])+" ("+instanceColumn+", "+m[3]+")"+m[4])
		case tblOther.MatchString(item):
			constraints = append(constraints, w.views(item))
		default:
			col := strings.Fields(item)[0]
			if m := colRowid.FindStringSubmatch(item); m != nil {
				item = m[1] + " BIGINT GENERATED BY DEFAULT AS IDENTITY" + m[2]
				keyed = true
				constraints = append(constraints, "PRIMARY KEY ("+instanceColumn+", "+col+")")
			}
			if colPK.MatchString(item) {
				item = colPK.ReplaceAllString(item, "")
				keyed = true
				constraints = append(constraints, "PRIMARY KEY ("+instanceColumn+", "+col+")")
			}
			if colUnique.MatchString(item) {
				item = colUnique.ReplaceAllString(item, "")
				constraints = append(constraints, "UNIQUE ("+instanceColumn+", "+col+")")
			}
			if m := colRef.FindStringSubmatch(item); m != nil {
				item = colRef.ReplaceAllString(item, "")
				constraints = append(constraints, "FOREIGN KEY ("+instanceColumn+", "+col+") REFERENCES "+
					sharedName(w.o.Class, m[1])+" ("+instanceColumn+", "+m[2]+")"+m[3])
			}
			if strings.Contains(item, "{") {
				return nil, false, fmt.Errorf("unsupported reference in column %q", item)
			}
			defs = append(defs, columnDialect(item))
		}
	}
	return append(defs, constraints...), keyed, nil
}

// columnDialect is dialect for one column definition.
func columnDialect(def string) string {
	q := dialect("CREATE TABLE x (" + def + ")")
	return q[len("CREATE TABLE x (") : len(q)-1]
}

// splitTop splits s at the commas outside parentheses and quotes.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// SharedTable returns the physical table that holds the own table name of
// every instance of class, for operators and tests.
func SharedTable(class, name string) string { return sharedName(class, name) }
