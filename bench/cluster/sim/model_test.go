package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestOneNodeIsTheLocalCost(t *testing.T) {
	p := defaults()
	r := Model(p, []int{1})[0]
	if r.Remote != 0 {
		t.Fatalf("remote fraction on one node: %v", r.Remote)
	}
	want := p.NodeCores * p.Utilization * 1000 / p.NodeCPUms
	if math.Abs(r.NodeBound-want) > 1e-9 {
		t.Fatalf("node bound %v, want %v", r.NodeBound, want)
	}
	if r.FailoverSec != 0 || r.StormSec != 0 {
		t.Fatalf("one node has no failover: %+v", r)
	}
}

func TestThroughputIsTheLeastBound(t *testing.T) {
	for _, r := range Model(defaults(), []int{1, 2, 4, 8, 16, 32, 64}) {
		least := math.Min(math.Min(r.NodeBound, r.PGCPUBound), math.Min(r.CommitBound, r.PoolBound))
		if r.Throughput != least {
			t.Fatalf("%d nodes: throughput %v, least bound %v", r.Nodes, r.Throughput, least)
		}
	}
}

func TestUnboundedDatabaseScalesWithNodes(t *testing.T) {
	p := defaults()
	p.PGCores, p.PGCommits = 1e9, 1e12
	rows := Model(p, []int{32, 64})
	if rows[0].Bound != "node CPU" || rows[1].Bound != "node CPU" {
		t.Fatalf("bounds %q %q, want node CPU", rows[0].Bound, rows[1].Bound)
	}
	// From 32 to 64 nodes the remote fraction barely moves: about twice.
	if ratio := rows[1].Throughput / rows[0].Throughput; ratio < 1.95 || ratio > 2.0 {
		t.Fatalf("64/32 nodes: %v", ratio)
	}
}

func TestDatabaseBindsAtScale(t *testing.T) {
	r := Model(defaults(), []int{64})[0]
	if !strings.HasPrefix(r.Bound, "PostgreSQL") {
		t.Fatalf("64 nodes bound by %q, want PostgreSQL", r.Bound)
	}
	p := defaults()
	if r.PGCores > p.PGCores*p.Utilization+1e-9 {
		t.Fatalf("PostgreSQL busy %v cores, more than its %v usable", r.PGCores, p.PGCores*p.Utilization)
	}
}

func TestFailoverIsAtLeastALeaseAndAQuarter(t *testing.T) {
	p := defaults()
	for _, r := range Model(p, []int{2, 64}) {
		if r.FailoverSec < p.Lease*1.25 {
			t.Fatalf("%d nodes: failover %v s < %v", r.Nodes, r.FailoverSec, p.Lease*1.25)
		}
	}
}

func TestPollingCostsPostgreSQL(t *testing.T) {
	p := defaults()
	fast := Model(p, []int{8})[0]
	p.ChildSeconds = 10
	slow := Model(p, []int{8})[0]
	if slow.PGCPUBound >= fast.PGCPUBound {
		t.Fatalf("a 10 s remote child should cost PostgreSQL more: %v vs %v runs/s", slow.PGCPUBound, fast.PGCPUBound)
	}
}

func TestPrintIsDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	Print(&a, defaults(), Model(defaults(), []int{1, 64}))
	Print(&b, defaults(), Model(defaults(), []int{1, 64}))
	if a.String() != b.String() || !strings.Contains(a.String(), "| 64 |") {
		t.Fatalf("output:\n%s", a.String())
	}
}
