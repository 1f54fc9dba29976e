package main

import (
	"fmt"
	"io"
	"log"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// recorder collects what the users measure; it is safe for concurrent use.
type recorder struct {
	log     *log.Logger // nil: errors are only counted
	mu      sync.Mutex
	first   []time.Duration
	content []time.Duration
	end     []time.Duration
	turns   int
	runs    int
	// until ends the run's window; wturns and wruns are the turns and runs
	// that ended in it.
	until         time.Time
	wturns, wruns int
	// start is the window's start; firstByMinute holds the times to the
	// first chunk of the turns that ended in each minute of the run.
	start         time.Time
	firstByMinute [][]time.Duration
	actions       map[string]int
	errs          map[string]int
	refused       map[string]int
	samples       map[string]string // one message per error kind
}

func newRecorder(l *log.Logger) *recorder {
	return &recorder{log: l, actions: map[string]int{}, errs: map[string]int{}, refused: map[string]int{}, samples: map[string]string{}}
}

// turn records a finished turn: its time to the first chunk and to the
// first content chunk (0: none measured) and to its end, and the child
// runs it finished.
func (r *recorder) turn(first, content, end time.Duration, runs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if first > 0 {
		r.first = append(r.first, first)
		if !r.start.IsZero() {
			m := max(0, int(time.Since(r.start)/time.Minute))
			for len(r.firstByMinute) <= m {
				r.firstByMinute = append(r.firstByMinute, nil)
			}
			r.firstByMinute[m] = append(r.firstByMinute[m], first)
		}
	}
	if content > 0 {
		r.content = append(r.content, content)
	}
	r.end = append(r.end, end)
	r.turns++
	r.runs += runs
	if time.Now().Before(r.until) {
		r.wturns++
		r.wruns += runs
	}
}

// addRuns records child runs finished outside a turn (background runs).
func (r *recorder) addRuns(n int) {
	r.mu.Lock()
	r.runs += n
	if time.Now().Before(r.until) {
		r.wruns += n
	}
	r.mu.Unlock()
}

// action records an action done (whatever its outcome).
func (r *recorder) action(name string) {
	r.mu.Lock()
	r.actions[name]++
	r.mu.Unlock()
}

// fail records an error of a kind, with its message as a sample.
func (r *recorder) fail(kind string, err error) {
	r.mu.Lock()
	r.errs[kind]++
	if _, ok := r.samples[kind]; !ok && err != nil {
		r.samples[kind] = err.Error()
	}
	r.mu.Unlock()
	if r.log != nil {
		r.log.Printf("error %s: %v", kind, err)
	}
}

// refuse records a documented refusal (docs/limits.md).
func (r *recorder) refuse(kind string, err error) {
	r.mu.Lock()
	r.refused[kind]++
	if _, ok := r.samples["refused "+kind]; !ok && err != nil {
		r.samples["refused "+kind] = err.Error()
	}
	r.mu.Unlock()
}

// Report is the outcome of a run.
type Report struct {
	Config  Config
	Elapsed time.Duration // from the first user's start to the last action's end
	Turns   int
	Runs    int
	// WindowTurns and WindowRuns ended within Config.Duration of the
	// start (the rates are over that window; after it, users finish what
	// they started but start nothing new).
	WindowTurns, WindowRuns int
	Actions                 map[string]int
	// First, Content and End are the p50, p95 and p99 times from sending
	// a message to the turn's first chunk, to its first content chunk
	// (not start or start-step; Go users only) and to its end; MaxEnd is
	// the longest turn.
	First, Content, End [3]time.Duration
	MaxEnd              time.Duration
	// FirstByMinute is First of the turns that ended in each minute of
	// the run (the last ones in the drain): whether the tail grows as the
	// users' transcripts and the database do.
	FirstByMinute [][3]time.Duration
	Errors        map[string]int
	Refusals      map[string]int
	Samples       map[string]string
	// Server figures; zero when unknown.
	RSSPeak, RSSEnd int64
	CPU             time.Duration
	Goroutines      int // peak: -serve, or -debug
	DBBytes         int64
	Load            [2]string // /proc/loadavg before and after
	Cores           int
	// Check is the transcript check.
	Check CheckResult
	// NPMUsers is how many users were npm clients.
	NPMUsers int
	// Heavy is what the heavy user did (-heavy), if there was one.
	Heavy *HeavyResult
}

// OK reports whether the run had no errors other than documented refusals
// and its transcripts passed the check.
func (r *Report) OK() bool { return len(r.Errors) == 0 && r.Check.OK() }

func (r *recorder) report(elapsed time.Duration) *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := &Report{Elapsed: elapsed, Turns: r.turns, Runs: r.runs, WindowTurns: r.wturns, WindowRuns: r.wruns, Actions: maps.Clone(r.actions),
		Errors: maps.Clone(r.errs), Refusals: maps.Clone(r.refused), Samples: maps.Clone(r.samples)}
	rep.First = percentiles(r.first)
	for _, ds := range r.firstByMinute {
		rep.FirstByMinute = append(rep.FirstByMinute, percentiles(ds))
	}
	rep.Content = percentiles(r.content)
	rep.End = percentiles(r.end)
	if len(r.end) > 0 {
		rep.MaxEnd = slices.Max(r.end)
	}
	return rep
}

// percentiles returns p50, p95 and p99 (nearest rank).
func percentiles(ds []time.Duration) [3]time.Duration {
	if len(ds) == 0 {
		return [3]time.Duration{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return [3]time.Duration{at(0.50), at(0.95), at(0.99)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "load: %d users (%d npm) for %s, mix %s, think %s, shared %.2f×%d, %d sockets that never read, %d cores\n",
		c.Users, r.NPMUsers, c.Duration, c.Mix, c.Think, c.Shared, c.Group, c.Stuck, r.Cores)
	fmt.Fprintf(w, "load average before: %s\nload average after:  %s\n", r.Load[0], r.Load[1])
	secs := r.Elapsed.Seconds()
	win := c.Duration.Seconds()
	fmt.Fprintf(w, "in the %s window: %.1f turns/s, %.1f child runs/s (%d turns, %d runs)\n", c.Duration, float64(r.WindowTurns)/win, float64(r.WindowRuns)/win, r.WindowTurns, r.WindowRuns)
	fmt.Fprintf(w, "all, with the drain: %d turns, %d child runs in %.1f s\n", r.Turns, r.Runs, secs)
	if r.Heavy != nil {
		running := "the default bound"
		switch {
		case c.HeavyRunning > 0:
			running = fmt.Sprintf("at most %d", c.HeavyRunning)
		case c.HeavyRunning < 0:
			running = "all"
		}
		fmt.Fprintf(w, "heavy user (fan-outs of %d, %s executing at once, not in the figures above): %s\n", c.Heavy, running, r.Heavy)
	}
	var as []string
	for _, a := range slices.Sorted(maps.Keys(r.Actions)) {
		as = append(as, fmt.Sprintf("%s %d", a, r.Actions[a]))
	}
	fmt.Fprintf(w, "actions: %s\n", strings.Join(as, ", "))
	fmt.Fprintf(w, "first chunk: p50 %s  p95 %s  p99 %s\n", ms(r.First[0]), ms(r.First[1]), ms(r.First[2]))
	if len(r.FirstByMinute) > 1 {
		var mins []string
		for i, p := range r.FirstByMinute {
			mins = append(mins, fmt.Sprintf("%d: %.0f/%.0f/%.0f", i+1, float64(p[0])/float64(time.Millisecond),
				float64(p[1])/float64(time.Millisecond), float64(p[2])/float64(time.Millisecond)))
		}
		fmt.Fprintf(w, "first chunk p50/p95/p99 ms by minute: %s\n", strings.Join(mins, ", "))
	}
	fmt.Fprintf(w, "first content chunk: p50 %s  p95 %s  p99 %s\n", ms(r.Content[0]), ms(r.Content[1]), ms(r.Content[2]))
	fmt.Fprintf(w, "end of turn: p50 %s  p95 %s  p99 %s  max %s\n", ms(r.End[0]), ms(r.End[1]), ms(r.End[2]), ms(r.MaxEnd))
	if r.RSSPeak > 0 {
		fmt.Fprintf(w, "server RSS: peak %.1f MiB, end %.1f MiB\n", float64(r.RSSPeak)/(1<<20), float64(r.RSSEnd)/(1<<20))
	} else {
		fmt.Fprintln(w, "server RSS: unknown (give -pid)")
	}
	if r.CPU > 0 {
		fmt.Fprintf(w, "server CPU: %.1f s (%.0f%% of one core)\n", r.CPU.Seconds(), 100*r.CPU.Seconds()/secs)
	}
	if c.Serve {
		fmt.Fprintln(w, "  (-serve: RSS and CPU are the whole process, the generator's included)")
	}
	if r.Goroutines > 0 {
		fmt.Fprintf(w, "goroutines: peak %d", r.Goroutines)
		if c.Serve {
			fmt.Fprint(w, " (the generator's included)")
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "goroutines: unknown (give -debug, the address of agentry serve --debug-addr)")
	}
	if r.DBBytes > 0 {
		fmt.Fprintf(w, "database: %.1f MiB\n", float64(r.DBBytes)/(1<<20))
	}
	printCounts(w, "errors", r.Errors, r.Samples, "")
	printCounts(w, "documented refusals", r.Refusals, r.Samples, "refused ")
	r.Check.Print(w)
	if r.OK() {
		fmt.Fprintln(w, "PASS")
	} else {
		fmt.Fprintln(w, "FAIL")
	}
}

func printCounts(w io.Writer, title string, m map[string]int, samples map[string]string, prefix string) {
	if len(m) == 0 {
		fmt.Fprintf(w, "%s: none\n", title)
		return
	}
	fmt.Fprintf(w, "%s:\n", title)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(w, "  %-28s %6d  e.g. %s\n", k, m[k], samples[prefix+k])
	}
}
