// Command load is Agentry's load generator: N concurrent simulated users,
// each a WebSocket client speaking what the npm clients speak (package
// client: chat requests with resumable streams, the resume protocol, and
// the agent-tool events folded by client/agenttools), drive the demo
// Assistant of `agentry serve` for a set time, then every transcript is
// checked.
//
//	agentry serve --data /tmp/load --debug-addr 127.0.0.1:6060 &
//	go run ./bench/load -url http://127.0.0.1:8787 -pid $! -data /tmp/load \
//		-debug 127.0.0.1:6060 -users 1000 -duration 5m
//
// or, with the server in the generator's own process (a fresh SQLite
// database in -data; RSS, CPU and goroutines are then the process's, the
// generator's included):
//
//	go run ./bench/load -serve -data /tmp/load -users 100 -duration 1m
//
// Each user owns an Assistant instance (its own name), or, for the share
// -shared of the users, joins one shared by -group users; users of a shared
// instance take turns (a chat request carries the whole transcript and
// replaces the server's, as in the AI SDK, so two users sending at once
// would overwrite each other's messages by the protocol's design), and
// each user sees the others' turns stream. A user repeats, with -think
// between actions, an action drawn from -mix (weights):
//
//	research    "research <topic>": an awaited Researcher under the tool call
//	fanout      "compare A, B and C": three Researchers side by side
//	background  "research <topic> in the background": a detached run; the
//	            user waits for its completion notice to be answered
//	drill       a follow-up question in the child's own chat (its
//	            sub-agent route) of one of the user's earlier runs
//	reconnect   a research turn whose connection is closed after its first
//	            chunk; a new connection resumes the stream
//
// Every foreground turn also waits for the agent-tool events of its runs to
// reach a terminal status. At the end the generator reports runs/s (child
// runs finished), turns/s, p50/p95/p99 of the time from sending a message
// to its first streamed chunk, to its first content chunk (text, a tool
// call: anything but start and start-step) and to the end of the turn
// (over the window of -duration; the drain after it is reported apart),
// errors by kind
// (documented refusals apart: see docs/limits.md), the server's peak RSS
// and CPU (from /proc/<pid> with -pid, or this process with -serve),
// goroutines (with -serve, or -debug pointing at `agentry serve
// --debug-addr`, whose goroutine profile is read every 2 s), and the size of
// the database (-data). Then it reads every instance's transcript (GET
// …/get-messages, the drilled children's too) and checks that nothing was
// lost or doubled: every message a user sent is there once, every answer a
// user received is there once, every user message is followed by exactly
// one answer, and no message id or tool call id appears twice.
//
// With -stuck N, N more sockets join the first users' instances and never
// read: compare the users' figures with and without them (a client that
// does not read must not slow the others).
//
// With -heavy N (and -serve), one more user repeats fan-outs of N
// Researcher runs at once, through an agent class registered for it that,
// unlike the demo's Assistant, refuses none of them: at most
// -heavy-running of them execute at once (0: agenttool's default bound,
// negative: all), the others wait for a slot. Compare the users' figures
// with and without it. Its fan-outs are reported apart and its failures
// are errors.
//
// With -npm-share, that share of the users are the real npm clients
// (agents' AgentClient with @cloudflare/ai-chat's transport and the AI
// SDK's chat, run by npm-user.mjs in test/npm under node): they run the
// research, fanout and reconnect actions against their own instances and
// their transcripts go through the same check, so the frames of the Go
// users are proven against theirs on the same server. Their node processes
// start before the window (a few at a time, each opening its tab), and the
// window starts once every one is up, so their start-up is not measured.
//
// With -cpuprofile FILE, the generator writes its own CPU profile (the
// server's too with -serve) for the window and the drain: on a machine
// where both share the cores, what the generator costs is load the server
// does not get.
//
// With -memprofile FILE, it writes its heap profile at the end of the
// window, when what the users keep is largest.
//
// The exit status is 1 when any error other than a documented refusal
// occurred or the transcript check failed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

func main() { os.Exit(run()) }

// run is the command; its result is the exit status.
func run() int {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "load: -cpuprofile:", err)
			return 2
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	rep, err := Run(ctx, cfg, os.Stderr)
	if rep != nil {
		rep.Print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		return 1
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

func parseFlags(args []string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	urls := fs.String("url", "http://127.0.0.1:8787", "base URL of the server, or comma-separated URLs of a cluster's nodes (users are dealt to them in turn; ignored with -serve)")
	fs.BoolVar(&c.Serve, "serve", false, "serve the demo in this process on a fresh SQLite database in -data")
	fs.DurationVar(&c.Delay, "delay", 50*time.Millisecond, "with -serve: the scripted model's delay between chunks (as agentry serve --delay)")
	fs.IntVar(&c.MaxTurns, "max-turns", 0, "with -serve: chat turns in flight before clients' requests are refused (as agentry serve --max-turns; 0: the default)")
	fs.IntVar(&c.Users, "users", 10, "concurrent users")
	fs.DurationVar(&c.Duration, "duration", 30*time.Second, "how long users start new actions")
	fs.DurationVar(&c.Ramp, "ramp", 0, "spread the users' first connections over this long (0: min(duration/4, users×10ms))")
	mix := fs.String("mix", DefaultMix, "weights of the actions: research, fanout, background, drill, reconnect")
	fs.DurationVar(&c.Think, "think", time.Second, "pause of each user between actions")
	fs.Float64Var(&c.Shared, "shared", 0, "share of the users on shared instances (0 to 1)")
	fs.IntVar(&c.Group, "group", 4, "users per shared instance")
	fs.StringVar(&c.Prefix, "prefix", "", "instance name prefix (default load-<unix time>)")
	pids := fs.String("pid", "", "the server's process id, for its RSS and CPU (/proc/<pid>); comma-separated for a cluster's nodes (summed)")
	debug := fs.String("debug", "", "the server's profile address (agentry serve --debug-addr), http://host:port, for its goroutines; comma-separated for a cluster's nodes (summed)")
	fs.StringVar(&c.Data, "data", "", "the server's data folder, for the database size (with -serve: where it is created)")
	fs.StringVar(&c.Token, "token", "", "bearer token for a server started with --auth-token")
	fs.DurationVar(&c.TurnTimeout, "turn-timeout", 2*time.Minute, "longest wait for one turn, or a background run's answer")
	fs.Float64Var(&c.NPMShare, "npm-share", 0, "share of the users driven by the real npm clients (node test/npm/npm-user.mjs)")
	fs.StringVar(&c.NPMDir, "npm-dir", "test/npm", "folder with npm-user.mjs and its node_modules")
	fs.IntVar(&c.Stuck, "stuck", 0, "sockets that join the first users' instances and never read (compare the users' p99 with and without)")
	fs.IntVar(&c.Heavy, "heavy", 0, "with -serve: one more user who repeats fan-outs of this many Researchers at once (compare the users' p99 with and without)")
	fs.IntVar(&c.HeavyRunning, "heavy-running", 0, "with -heavy: the heavy parent's bound on its children executing at once (MaxRunningAgentTools; 0: the default, negative: unlimited)")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of the users' choices")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write the generator's CPU profile (the server's too with -serve) to this file")
	fs.StringVar(&c.MemProfile, "memprofile", "", "write the generator's heap profile at the end of the window to this file")
	fs.BoolVar(&c.Verbose, "v", false, "log every error as it happens")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	m, err := ParseMix(*mix)
	if err != nil {
		return c, err
	}
	c.Mix = m
	for _, u := range strings.Split(*urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.URLs = append(c.URLs, strings.TrimSuffix(u, "/"))
		}
	}
	for _, d := range strings.Split(*debug, ",") {
		if d = strings.TrimSpace(d); d != "" {
			if !strings.Contains(d, "://") {
				d = "http://" + d
			}
			c.Debug = append(c.Debug, strings.TrimSuffix(d, "/"))
		}
	}
	for _, p := range strings.Split(*pids, ",") {
		if p = strings.TrimSpace(p); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n <= 0 {
				return c, fmt.Errorf("bad -pid %q", p)
			}
			c.PIDs = append(c.PIDs, n)
		}
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %s", strings.Join(fs.Args(), " "))
	}
	return c, c.validate()
}
