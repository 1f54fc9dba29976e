package store_test

import (
	"context"
	"testing"

	"github.com/agentry/agentry/store"
)

func TestWithUrgent(t *testing.T) {
	ctx := context.Background()
	if store.IsUrgent(ctx) {
		t.Fatal("a plain context is urgent")
	}
	u := store.WithUrgent(ctx)
	if !store.IsUrgent(u) {
		t.Fatal("WithUrgent's context is not urgent")
	}
	if store.WithUrgent(u) != u {
		t.Fatal("marking an urgent context again made a new one")
	}
	c, cancel := context.WithCancel(u)
	defer cancel()
	if !store.IsUrgent(c) {
		t.Fatal("a context derived from an urgent one lost the mark")
	}
}
