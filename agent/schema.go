package agent

import "github.com/agentry/agentry/store"

// SchemaVersion is the newest version of the agent layer's schema
// (component "agent" of store.Migrate) this build knows; a database
// migrated further by a newer build is refused (store.ErrSchemaTooNew).
func SchemaVersion() int { return store.LatestVersion(migrations) }

// migrations is the runtime's schema: instances, their key/value data,
// schedules and the user tables each instance created.
var migrations = []store.Migration{{
	Version: 1,
	Statements: []string{
		`CREATE TABLE IF NOT EXISTS instances (
			id INTEGER PRIMARY KEY AUTOINCREMENT,
			path TEXT NOT NULL UNIQUE,
			class TEXT NOT NULL,
			name TEXT NOT NULL,
			parent_id BIGINT REFERENCES instances(id) ON DELETE CASCADE,
			state TEXT,
			created_at BIGINT NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS instances_parent ON instances(parent_id)`,
		`CREATE TABLE IF NOT EXISTS kv (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			key TEXT NOT NULL,
			value TEXT NOT NULL,
			PRIMARY KEY (instance_id, key))`,
		`CREATE TABLE IF NOT EXISTS schedules (
			id TEXT PRIMARY KEY,
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			method TEXT NOT NULL,
			payload TEXT,
			kind TEXT NOT NULL,
			cron TEXT,
			interval_ms BIGINT,
			due_at BIGINT NOT NULL,
			created_at BIGINT NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS schedules_due ON schedules(due_at)`,
		`CREATE INDEX IF NOT EXISTS schedules_instance ON schedules(instance_id)`,
		`CREATE TABLE IF NOT EXISTS user_tables (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			name TEXT NOT NULL,
			PRIMARY KEY (instance_id, name))`,
	},
}, {
	Version: 2,
	Statements: []string{
		`CREATE TABLE IF NOT EXISTS instance_wake (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			reason TEXT NOT NULL,
			PRIMARY KEY (instance_id, reason))`,
	},
}, {
	// A wake reason carries its instance's shard (Sharder), so that a
	// node that acquires shards reads only their reasons. Rows written
	// before (and on a runtime without a Sharder) have none: the first
	// wake of a Sharder's runtime fills it in (wake.go).
	Version: 3,
	Statements: []string{
		`ALTER TABLE instance_wake ADD COLUMN shard INTEGER`,
		`CREATE INDEX IF NOT EXISTS instance_wake_shard ON instance_wake(shard)`,
	},
}}
