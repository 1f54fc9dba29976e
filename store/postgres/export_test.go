package postgres

// SetCommitFault sets a hook that runs around each COMMIT of db: with sent
// false before it (an error fails the COMMIT, which is not sent), with sent
// true after it, given the COMMIT's outcome, which it may replace (a lost
// answer). nil removes it. Set it before the DB is used.
func SetCommitFault(db *DB, f func(sent bool, err error) error) { db.commitFault = f }
