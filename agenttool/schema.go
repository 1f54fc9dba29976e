package agenttool

import "github.com/agentry/agentry/store"

// SchemaVersion is the newest version of the agenttool layer's schema
// (component "agenttool" of store.Migrate) this build knows; a database
// migrated further by a newer build is refused (store.ErrSchemaTooNew).
func SchemaVersion() int { return store.LatestVersion(migrations) }

// migrations is the package's schema: the parent's registry of runs and the
// child's record of the runs it executes. Both cascade with their instance.
var migrations = []store.Migration{{
	Version: 1,
	Statements: []string{
		`CREATE TABLE IF NOT EXISTS agent_tool_runs (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			run_id TEXT NOT NULL,
			parent_tool_call_id TEXT,
			agent_type TEXT NOT NULL,
			input_preview TEXT,
			status TEXT NOT NULL,
			summary TEXT,
			output_json TEXT,
			error_message TEXT,
			interrupted_reason TEXT,
			child_still_running INTEGER,
			display_metadata TEXT,
			display_order BIGINT NOT NULL DEFAULT 0,
			started_at BIGINT NOT NULL,
			completed_at BIGINT,
			terminal_marks TEXT,
			PRIMARY KEY (instance_id, run_id))`,
		`CREATE INDEX IF NOT EXISTS agent_tool_runs_started ON agent_tool_runs(instance_id, started_at)`,
		`CREATE INDEX IF NOT EXISTS agent_tool_runs_tool_call ON agent_tool_runs(instance_id, parent_tool_call_id, display_order)`,
		`CREATE TABLE IF NOT EXISTS agent_tool_child_runs (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			run_id TEXT NOT NULL,
			request_id TEXT,
			status TEXT NOT NULL,
			input_json TEXT,
			output_json TEXT,
			summary TEXT,
			error_message TEXT,
			started_at BIGINT NOT NULL,
			completed_at BIGINT,
			progress_json TEXT,
			last_signal_at BIGINT,
			PRIMARY KEY (instance_id, run_id))`,
	},
}, {
	// Detached runs: callbacks, budgets and the two-slot delivery ledger;
	// milestones and their notifications.
	Version: 2,
	Statements: []string{
		`ALTER TABLE agent_tool_runs ADD COLUMN detached INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE agent_tool_runs ADD COLUMN detached_on_finish TEXT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN detached_notify INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE agent_tool_runs ADD COLUMN detached_notify_source TEXT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN detached_max_budget_at BIGINT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN detached_no_progress_budget_ms BIGINT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN detached_on_milestones TEXT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN finish_claimed_at BIGINT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN finish_delivered_at BIGINT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN give_up_claimed_at BIGINT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN give_up_delivered_at BIGINT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN given_up_at BIGINT`,
		`CREATE TABLE IF NOT EXISTS agent_tool_milestones (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			run_id TEXT NOT NULL,
			sequence BIGINT NOT NULL,
			name TEXT NOT NULL,
			data_json TEXT,
			at BIGINT NOT NULL,
			PRIMARY KEY (instance_id, run_id, sequence))`,
		`CREATE TABLE IF NOT EXISTS agent_tool_classes (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			agent_type TEXT NOT NULL,
			PRIMARY KEY (instance_id, agent_type))`,
		`CREATE TABLE IF NOT EXISTS agent_tool_milestone_notices (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			run_id TEXT NOT NULL,
			name TEXT NOT NULL,
			delivered_at BIGINT NOT NULL,
			PRIMARY KEY (instance_id, run_id, name))`,
	},
}, {
	// Token usage and budgets of runs.
	Version: 3,
	Statements: []string{
		`ALTER TABLE agent_tool_runs ADD COLUMN usage_json TEXT`,
		`ALTER TABLE agent_tool_runs ADD COLUMN token_budget TEXT`,
	},
}, {
	// trace_parent is the W3C traceparent of the run's span: work on the
	// run after a restart (re-attach, delivery of a detached run's end)
	// joins the trace of the turn that dispatched it.
	Version:    4,
	Statements: []string{`ALTER TABLE agent_tool_runs ADD COLUMN trace_parent TEXT`},
}, {
	// An awaited run's end is delivered durably too (finish_delivered_at,
	// null while the parent's OnAgentToolFinish is still to be told):
	// the ends recorded before count as delivered.
	Version: 5,
	Statements: []string{`UPDATE agent_tool_runs SET finish_delivered_at = COALESCE(completed_at, started_at)
		WHERE detached = 0 AND finish_delivered_at IS NULL AND status IN ('completed', 'error', 'aborted', 'interrupted')`},
}, {
	// waiting_json is what a child's run waits for (its approvals and
	// client tools' outputs), null while it does not wait: a parent on
	// another node of a cluster reads it to tell waiting from silence.
	Version:    6,
	Statements: []string{`ALTER TABLE agent_tool_child_runs ADD COLUMN waiting_json TEXT`},
}, {
	// The registry is listed in start order with the run id breaking ties
	// (queryRuns): an index in that whole order lets a connect replay read
	// the runs without sorting them first. It replaces the index on
	// (instance_id, started_at), which it covers.
	//
	// agent_tool_runs_active holds only the runs in flight, so that the
	// concurrency cap of a dispatch counts those and not every retained
	// run of the parent (insertRunTx).
	Version: 7,
	Statements: []string{
		`CREATE INDEX IF NOT EXISTS agent_tool_runs_order ON agent_tool_runs(instance_id, started_at, run_id)`,
		`DROP INDEX IF EXISTS agent_tool_runs_started`,
		`CREATE INDEX IF NOT EXISTS agent_tool_runs_active ON agent_tool_runs(instance_id) WHERE status IN ('starting', 'running')`,
	},
}, {
	// queued_input is the input of a run that waits for a slot of its
	// parent's bound on runs executing at once (RunningLimiter), null once
	// its child started: a run that was waiting when the process stopped
	// is started after the restart with the input of its dispatch.
	Version:    8,
	Statements: []string{`ALTER TABLE agent_tool_runs ADD COLUMN queued_input TEXT`},
}}
