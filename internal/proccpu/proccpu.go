// Package proccpu reads the CPU time of processes from /proc, for the
// benchmarks and load commands that report CPU per operation: of a
// process (and optionally its waited-for children), and of a PostgreSQL
// server with all its processes. Linux only; times have the resolution of
// USER_HZ (10 ms), so measure long enough.
package proccpu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux this runs on).
const clockTicks = 100

// stat returns the fields of /proc/<pid>/stat after the command name.
func stat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, errors.New("proccpu: bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return nil, errors.New("proccpu: short /proc stat")
	}
	return f, nil
}

// Process returns a process's user + system time, all threads; with
// children, also that of its children it has waited for.
func Process(pid int, children bool) (time.Duration, error) {
	f, err := stat(pid)
	if err != nil {
		return 0, err
	}
	// After the name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
	idx := []int{11, 12}
	if children {
		idx = append(idx, 13, 14)
	}
	var ticks int64
	for _, i := range idx {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// Parent returns a process's parent's pid.
func Parent(pid int) (int, error) {
	f, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// Tree returns the CPU time of a process, its exited children and its live
// children: for a PostgreSQL postmaster (the parent of any backend, see
// Parent of pg_backend_pid()), the whole server's.
func Tree(root int) (time.Duration, error) {
	total, err := Process(root, true)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := Parent(pid); err != nil || pp != root {
			continue
		}
		if t, err := Process(pid, false); err == nil {
			total += t
		}
	}
	return total, nil
}
