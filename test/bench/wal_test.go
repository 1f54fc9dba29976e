package bench

import (
	"database/sql"
	"encoding/binary"
	"io"
	"os"
)

// walLog is what a SQLite write-ahead log holds now: its checkpoint
// sequence number (one more each time the log starts again from its
// beginning) and the number of frames (pages written, one frame per page
// per commit) of the current log.
type walLog struct {
	seq    uint32
	frames int
	// pages lists the page number of each frame, when asked for.
	pages []uint32
}

// readWAL reads the header of the write-ahead log at path (the database
// file's name with "-wal") and counts the frames that carry its salts:
// the frames written since the log last started again. Frames left of an
// older log, beyond the current one, carry other salts.
func readWAL(path string) (walLog, error) { return readWALPages(path, false) }

// readWALPages is readWAL that also lists the frames' page numbers.
func readWALPages(path string, pages bool) (walLog, error) {
	f, err := os.Open(path + "-wal")
	if err != nil {
		return walLog{}, err
	}
	defer f.Close()
	var hdr [32]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return walLog{}, err
	}
	be := binary.BigEndian
	pageSize := int64(be.Uint32(hdr[8:]))
	if pageSize == 1 {
		pageSize = 65536
	}
	l := walLog{seq: be.Uint32(hdr[12:])}
	salt1, salt2 := be.Uint32(hdr[16:]), be.Uint32(hdr[20:])
	var fh [24]byte
	for off := int64(32); ; off += 24 + pageSize {
		if _, err := f.ReadAt(fh[:], off); err != nil {
			return l, nil // the end of the file
		}
		if be.Uint32(fh[8:]) != salt1 || be.Uint32(fh[12:]) != salt2 {
			return l, nil
		}
		l.frames++
		if pages {
			l.pages = append(l.pages, be.Uint32(fh[0:]))
		}
	}
}

// walFrames counts the frames written between two readings of a log:
// the difference, or, when the log started again in between, the frames
// of the new log (those written before the restart are not seen: a
// reading after each run keeps that loss to the frames of one run).
func walFrames(before, after walLog) int {
	if after.seq != before.seq {
		return after.frames
	}
	return after.frames - before.frames
}

// newFrames returns the page numbers of the frames written between two
// readings of a log (see walFrames).
func newFrames(before, after walLog) []uint32 {
	if after.seq != before.seq || before.frames > after.frames {
		return after.pages
	}
	return after.pages[before.frames:]
}

// btreeOfPage maps the pages of the SQLite database at path to the table
// or index whose B-tree holds them (SQLite's dbstat table), read through a
// read-only connection of its own, which sees the write-ahead log.
func btreeOfPage(path string) (map[uint32]string, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name, pageno FROM dbstat`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[uint32]string{}
	for rows.Next() {
		var name string
		var page uint32
		if err := rows.Scan(&name, &page); err != nil {
			return nil, err
		}
		m[page] = name
	}
	return m, rows.Err()
}
