package main

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is one load run.
type Config struct {
	// URLs are the servers' base URLs, http://host:port: one, or a
	// cluster's nodes, to which the users are dealt in turn.
	URLs []string
	// Serve starts the demo in this process (see serveDemo) instead.
	Serve bool
	// CPUProfile is where the command writes its CPU profile; Run does
	// not read it.
	CPUProfile string
	// MemProfile is where Run writes the generator's heap profile at the
	// end of the window, when the users' state is largest (empty: none).
	MemProfile string
	// Delay is the in-process demo's scripted-model delay.
	Delay time.Duration
	// MaxTurns is the in-process demo's chat.Config.MaxTurnsInFlight
	// (zero: the default).
	MaxTurns int
	// Users is the number of concurrent users.
	Users int
	// Duration is how long users start new actions; actions in flight
	// then finish.
	Duration time.Duration
	// Ramp spreads the users' starts.
	Ramp time.Duration
	// Mix weighs the actions.
	Mix Mix
	// Think is each user's pause between actions.
	Think time.Duration
	// Shared is the share of users on shared instances, Group users each.
	Shared float64
	Group  int
	// Prefix starts every instance name.
	Prefix string
	// PIDs are the server processes, for RSS and CPU (summed); none
	// means unknown (this process with Serve).
	PIDs []int
	// Debug are the servers' profile addresses (agentry serve
	// --debug-addr: http://host:port), for their goroutines (summed).
	Debug []string
	// Data is the server's data folder, for the database size.
	Data string
	// Token is a bearer token for the server.
	Token string
	// TurnTimeout bounds one turn, or the wait for a background answer.
	TurnTimeout time.Duration
	// NPMShare of the users run npm-user.mjs from NPMDir under node.
	NPMShare float64
	NPMDir   string
	// Stuck sockets join users' instances and never read.
	Stuck int
	// Heavy, with Serve, adds a user who repeats fan-outs of Heavy
	// children at once.
	Heavy int
	// HeavyRunning is the heavy user's parent's MaxRunningAgentTools:
	// zero the runtime's default (agenttool.DefaultMaxRunningAgentTools),
	// negative unlimited (every child of a fan-out executes at once).
	HeavyRunning int
	// Seed seeds the users' choices.
	Seed int64
	// Verbose logs every error.
	Verbose bool
}

func (c *Config) validate() error {
	switch {
	case len(c.URLs) == 0 && !c.Serve:
		return errors.New("-url is required")
	case c.Users < 1:
		return errors.New("-users must be at least 1")
	case c.Duration <= 0:
		return errors.New("-duration must be positive")
	case c.Shared < 0 || c.Shared > 1:
		return errors.New("-shared must be between 0 and 1")
	case c.NPMShare < 0 || c.NPMShare > 1:
		return errors.New("-npm-share must be between 0 and 1")
	case c.Stuck < 0:
		return errors.New("-stuck must not be negative")
	case c.Heavy < 0 || c.Heavy > maxHeavy:
		return fmt.Errorf("-heavy must be 0 to %d", maxHeavy)
	case c.Heavy > 0 && !c.Serve:
		return errors.New("-heavy needs -serve (its agent class is registered in this process)")
	case c.Group < 1:
		return errors.New("-group must be at least 1")
	case c.Serve && c.Data == "":
		return errors.New("-serve needs -data, the folder of its database")
	case c.TurnTimeout <= 0:
		return errors.New("-turn-timeout must be positive")
	case c.Mix.total() == 0:
		return errors.New("-mix gives every action weight 0")
	}
	return nil
}

// Actions a user draws from the mix.
const (
	ActResearch   = "research"
	ActFanout     = "fanout"
	ActBackground = "background"
	ActDrill      = "drill"
	ActReconnect  = "reconnect"
)

var actions = []string{ActResearch, ActFanout, ActBackground, ActDrill, ActReconnect}

// DefaultMix is the -mix default.
const DefaultMix = "research=4,fanout=2,background=1,drill=2,reconnect=1"

// Mix is the weight of each action.
type Mix map[string]int

// ParseMix reads "name=weight,…"; names not given weigh 0.
func ParseMix(s string) (Mix, error) {
	m := Mix{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, w, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("bad -mix entry %q: want name=weight", f)
		}
		known := false
		for _, a := range actions {
			known = known || a == name
		}
		if !known {
			return nil, fmt.Errorf("bad -mix entry %q: actions are %s", f, strings.Join(actions, ", "))
		}
		n, err := strconv.Atoi(w)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad -mix weight %q", f)
		}
		m[name] = n
	}
	return m, nil
}

func (m Mix) total() int {
	t := 0
	for _, w := range m {
		t += w
	}
	return t
}

// pick maps r in [0, total) to an action.
func (m Mix) pick(r int) string {
	for _, a := range actions {
		if r < m[a] {
			return a
		}
		r -= m[a]
	}
	return ActResearch
}

// String is the mix as ParseMix reads it.
func (m Mix) String() string {
	var fs []string
	for _, a := range actions {
		if m[a] > 0 {
			fs = append(fs, a+"="+strconv.Itoa(m[a]))
		}
	}
	sort.Strings(fs)
	return strings.Join(fs, ",")
}
