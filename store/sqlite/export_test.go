package sqlite

// SetEnqueued sets a hook that every Update calls once its transaction is
// queued for the writer (set it before the first Update).
func SetEnqueued(db *DB, f func()) { db.w.enqueued = f }
