package agent

import (
	"context"
	"errors"
	"net/http"

	"github.com/agentry/agentry/store"
)

// ServeInstance answers a plain HTTP request addressed to the instance at
// path. r.URL.Path must already be the part after the instance prefix ("/"
// for the instance itself). Layers' LayerHTTP run first, then OnRequest;
// with neither, the answer is 404.
func (rt *Runtime) ServeInstance(w http.ResponseWriter, r *http.Request, path Path) {
	ctx := r.Context()
	in, err := rt.acquire(ctx, path)
	if errors.Is(err, ErrTooManyInstances) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "server busy: too many agents in memory, try again later", http.StatusServiceUnavailable)
		return
	}
	if errors.Is(err, store.ErrUnavailable) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "database unavailable, try again shortly", http.StatusServiceUnavailable)
		return
	}
	if err != nil {
		http.Error(w, rt.ClientMessage(err, "agent", path.String(), "in", "ServeInstance"), http.StatusServiceUnavailable)
		return
	}
	defer in.release()
	for _, l := range in.layers {
		if h, ok := l.(LayerHTTPHandler); ok && h.LayerHTTP(ctx, w, r) {
			return
		}
	}
	if h, ok := in.agent.(RequestHandler); ok {
		ctx, leave, err := in.enter(ctx)
		if err != nil {
			http.Error(w, "request canceled", http.StatusServiceUnavailable)
			return
		}
		defer leave()
		h.OnRequest(WithAgent(ctx, in.agent), w, r.WithContext(ctx))
		return
	}
	http.Error(w, "not found", http.StatusNotFound)
}

// CheckSubAgent asks the parent at path.Parent() whether a client may reach
// the sub-agent at path, through its OnBeforeSubAgent hook. A nil error
// admits the request. The parent is hydrated; the child is not touched.
// In a cluster, a parent on another node is asked there (RemoteGate).
func (rt *Runtime) CheckSubAgent(ctx context.Context, r *http.Request, path Path) error {
	parent := path.Parent()
	if parent == nil {
		return nil
	}
	if g, ok := rt.place.(RemoteGate); ok && !rt.place.Owns(parent) {
		// The parent lives on another node of the cluster: its owner
		// decides.
		return g.CheckRemoteSubAgent(ctx, r, path)
	}
	in, err := rt.acquire(ctx, parent)
	if err != nil {
		return err
	}
	defer in.release()
	leaf := path.Leaf()
	ctx, leave, err := in.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	ctx = WithAgent(ctx, in.agent)
	for _, l := range in.layers {
		if g, ok := l.(LayerGate); ok {
			if err := g.LayerGate(ctx, r, leaf.Class, leaf.Name); err != nil {
				return err
			}
		}
	}
	if g, ok := in.agent.(SubAgentGate); ok {
		return g.OnBeforeSubAgent(ctx, r, leaf.Class, leaf.Name)
	}
	return nil
}
