package main

import (
	"context"
	"log"
)

// npmUsers are the users driven by the real npm clients.
type npmUsers struct {
	done  chan struct{}
	insts []*instance
}

func startNPM(run, work context.Context, g *gen, n int, logger *log.Logger) *npmUsers {
	u := &npmUsers{done: make(chan struct{})}
	close(u.done)
	return u
}

// wait waits for the npm users and returns their instances, for the check.
func (u *npmUsers) wait() []*instance {
	<-u.done
	return u.insts
}
