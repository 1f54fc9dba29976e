package sqlite

// SetEnqueued sets a hook that every Update calls once its transaction is
// queued for the writer (set it before the first Update).
func SetEnqueued(db *DB, f func()) { db.w.enqueued = f }

// SetCheckpointed sets a hook that the background checkpointer calls after
// each checkpoint with the log's length and the pages it moved (set it
// right after Open, before the first Update).
func SetCheckpointed(db *DB, f func(logPages, moved int, err error)) { db.ckpt.ran = f }

// SetCheckpointFault sets a hook that each background checkpoint calls
// first: a non-nil error it returns is the checkpoint's outcome (set it
// right after Open, before the first Update).
func SetCheckpointFault(db *DB, f func() error) { db.ckpt.inject = f }
