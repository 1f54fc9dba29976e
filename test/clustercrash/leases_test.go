package clustercrash

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// startNamed starts node id with its database connections named
// "node-{id}" (application_name), so that the write log tells which node
// wrote what.
func (e *env) startNamed(id string, extra ...string) *testenv.Process {
	e.t.Helper()
	args := append([]string{"-postgres", e.url + "&application_name=node-" + id, "-node-id", id, "-lease", lease()}, extra...)
	p := testenv.StartProcess(e.t, 60*time.Second, bin.Path(e.t), args...)
	e.nodes[id] = p
	return p
}

// leaseChange is one change of a shard's owner or epoch, as lease_log
// recorded it; owner "" is a release (the owner cleared).
type leaseChange struct {
	owner string
	at    time.Time
}

// leaseHistory is, per shard, its owner when the log started and every
// change since, oldest first.
type leaseHistory struct {
	initial map[int]string
	changes map[int][]leaseChange
}

// logLeases starts recording every change of a shard's owner or epoch
// (a trigger on cluster_shards) and returns the owners at that moment. The
// trigger is created and the owners read in one transaction: CREATE TRIGGER
// locks the table against updates until the commit, so no change falls
// between the two.
func (e *env) logLeases() map[int]string {
	e.t.Helper()
	ctx := context.Background()
	initial := map[int]string{}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`CREATE TABLE lease_log (shard INT, owner TEXT, epoch BIGINT, at TIMESTAMPTZ)`,
			`CREATE FUNCTION log_lease() RETURNS trigger AS $$ BEGIN
				IF NEW.owner IS DISTINCT FROM OLD.owner OR NEW.epoch <> OLD.epoch THEN
					INSERT INTO lease_log VALUES (NEW.shard, NEW.owner, NEW.epoch, clock_timestamp());
				END IF; RETURN NEW; END $$ LANGUAGE plpgsql`,
			`CREATE TRIGGER lease_log AFTER UPDATE ON cluster_shards FOR EACH ROW EXECUTE FUNCTION log_lease()`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, `SELECT shard, COALESCE(owner, '') FROM cluster_shards`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s int
			var o string
			if err := rows.Scan(&s, &o); err != nil {
				return err
			}
			initial[s] = o
		}
		return rows.Err()
	})
	if err != nil {
		e.t.Fatalf("lease log: %v", err)
	}
	return initial
}

// logWrites records every insert or update of tables (each with an
// instance_id column), and every insert and delete of an instance, in
// write_log: the connection's application_name, the table and operation,
// the instance's path, the row's run_id and status when it has them, and
// the time.
func (e *env) logWrites(tables ...string) {
	e.t.Helper()
	qs := []string{
		`CREATE TABLE write_log (app TEXT, tbl TEXT, op TEXT, path TEXT, detail TEXT, at TIMESTAMPTZ)`,
		`CREATE FUNCTION log_write() RETURNS trigger AS $$ BEGIN
			INSERT INTO write_log VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP,
				(SELECT path FROM instances WHERE id = NEW.instance_id),
				concat_ws(' ', to_jsonb(NEW)->>'run_id', to_jsonb(NEW)->>'status'), clock_timestamp());
			RETURN NEW; END $$ LANGUAGE plpgsql`,
		`CREATE FUNCTION log_instance() RETURNS trigger AS $$ BEGIN
			IF TG_OP = 'DELETE' THEN
				INSERT INTO write_log VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP, OLD.path, '', clock_timestamp());
				RETURN OLD;
			END IF;
			INSERT INTO write_log VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP, NEW.path, '', clock_timestamp());
			RETURN NEW; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER write_log AFTER INSERT OR DELETE ON instances FOR EACH ROW EXECUTE FUNCTION log_instance()`,
	}
	for _, tbl := range tables {
		qs = append(qs, fmt.Sprintf(`CREATE TRIGGER write_log AFTER INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION log_write()`, tbl))
	}
	for _, q := range qs {
		if _, err := e.pool.Exec(context.Background(), q); err != nil {
			e.t.Fatalf("write log: %v", err)
		}
	}
}

// writesOf logs the write log's rows whose path or run id mentions run,
// for a failed test.
func (e *env) writesOf(run string) {
	rows, err := e.pool.Query(context.Background(), `SELECT app, tbl, op, COALESCE(path, '-'), detail, at FROM write_log
		WHERE path LIKE $1 OR detail LIKE $2 ORDER BY at`, "%/"+run, run+" %")
	if err != nil {
		e.t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var app, tbl, op, path, detail string
		var at time.Time
		if err := rows.Scan(&app, &tbl, &op, &path, &detail, &at); err != nil {
			e.t.Log(err)
			return
		}
		e.t.Logf("  %s %s %s %s %s %s", at.Format("15:04:05.000000"), app, op, tbl, path, detail)
	}
}

// leases reads the lease log, with the owners initial had when it began.
func (e *env) leases(initial map[int]string) leaseHistory {
	e.t.Helper()
	h := leaseHistory{initial: initial, changes: map[int][]leaseChange{}}
	rows, err := e.pool.Query(context.Background(), `SELECT shard, COALESCE(owner, ''), at FROM lease_log ORDER BY at`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s int
		var c leaseChange
		if err := rows.Scan(&s, &c.owner, &c.at); err != nil {
			e.t.Fatal(err)
		}
		h.changes[s] = append(h.changes[s], c)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return h
}

// heldBy reports whether node held shard's lease at time at, and names
// the holder otherwise. A shard its owner released (handed over: owner
// cleared) and nobody took yet still counts as the releasing node's: no
// other node can write it, and a write the node began before the release
// may commit after it.
func (h leaseHistory) heldBy(shard int, at time.Time, node string) (bool, string) {
	owner, prev := h.initial[shard], ""
	for _, c := range h.changes[shard] {
		if c.at.After(at) {
			break
		}
		prev, owner = owner, c.owner
	}
	if owner == node || owner == "" && prev == node {
		return true, owner
	}
	return false, owner
}

// lateWrite is a write that landed while its node did not hold the lease
// of the instance's shard.
type lateWrite struct {
	node, table, path string
	shard             int
	at                time.Time
	owner             string
}

func (w lateWrite) String() string {
	return fmt.Sprintf("%s wrote %s of %s at %s while shard %d belonged to %q",
		w.node, w.table, w.path, w.at.Format("15:04:05.000000"), w.shard, w.owner)
}

// lateWrites checks every logged write of a node (application_name
// "node-{id}") against the lease history: it returns how many it checked
// and the ones that landed outside their node's lease.
func (e *env) lateWrites(h leaseHistory) (int, []lateWrite) {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT app, tbl, path, at FROM write_log
		WHERE app LIKE 'node-%' AND path IS NOT NULL AND tbl <> 'instances' ORDER BY at`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	checked := 0
	var late []lateWrite
	for rows.Next() {
		var w lateWrite
		if err := rows.Scan(&w.node, &w.table, &w.path, &w.at); err != nil {
			e.t.Fatal(err)
		}
		w.node = strings.TrimPrefix(w.node, "node-")
		p, err := agent.ParsePath(w.path)
		if err != nil {
			e.t.Fatal(err)
		}
		w.shard = cluster.ShardOf(p, cluster.DefaultShards)
		checked++
		var ok bool
		if ok, w.owner = h.heldBy(w.shard, w.at, w.node); !ok {
			late = append(late, w)
		}
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return checked, late
}
