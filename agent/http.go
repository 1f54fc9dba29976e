package agent

import (
	"context"
	"net/http"
)

// HTTPHandler lets a layer above the runtime (such as chat, for
// /get-messages) claim HTTP requests to an instance before OnRequest sees
// them. HandleHTTP reports whether it answered the request.
type HTTPHandler interface {
	HandleHTTP(ctx context.Context, w http.ResponseWriter, r *http.Request) bool
}

// ServeInstance answers a plain HTTP request addressed to the instance at
// path. r.URL.Path must already be the part after the instance prefix ("/"
// for the instance itself). Layers' HandleHTTP run first, then OnRequest;
// with neither, the answer is 404.
func (rt *Runtime) ServeInstance(w http.ResponseWriter, r *http.Request, path Path) {
	ctx := r.Context()
	in, err := rt.acquire(ctx, path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer in.release()
	if h, ok := in.agent.(HTTPHandler); ok && h.HandleHTTP(ctx, w, r) {
		return
	}
	if h, ok := in.agent.(RequestHandler); ok {
		h.OnRequest(ctx, w, r)
		return
	}
	http.Error(w, "not found", http.StatusNotFound)
}

// CheckSubAgent asks the parent at path.Parent() whether a client may reach
// the sub-agent at path, through its OnBeforeSubAgent hook. A nil error
// admits the request. The parent is hydrated; the child is not touched.
func (rt *Runtime) CheckSubAgent(ctx context.Context, r *http.Request, path Path) error {
	parent := path.Parent()
	if parent == nil {
		return nil
	}
	in, err := rt.acquire(ctx, parent)
	if err != nil {
		return err
	}
	defer in.release()
	if g, ok := in.agent.(SubAgentGate); ok {
		leaf := path.Leaf()
		return g.OnBeforeSubAgent(ctx, r, leaf.Class, leaf.Name)
	}
	return nil
}
