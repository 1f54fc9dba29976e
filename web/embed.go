// Package web serves Agentry's playground: the React app in this folder,
// built by Vite into dist/ (committed) and embedded in the binary, so
// `agentry serve` needs no Node at run time. check-bundle.sh checks that
// dist/ matches the sources.
package web

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// Dist returns the built playground: index.html and assets/.
func Dist() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // the embed directive guarantees the folder
	}
	return sub
}

// Handler serves the playground: index.html at "/" (never cached, so a
// new build is picked up at once) and the content-hashed files under
// /assets/ (cached for good). Other paths are 404s; the page keeps its
// own state in the URL's hash, so it needs no fallback routes.
func Handler() http.Handler {
	files := Dist()
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := path.Clean("/" + r.URL.Path)
		switch {
		case p == "/" || p == "/index.html":
			w.Header().Set("Cache-Control", "no-cache")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			http.ServeFileFS(w, r, files, "index.html")
		case strings.HasPrefix(p, "/assets/"):
			if st, err := fs.Stat(files, strings.TrimPrefix(p, "/")); err != nil || st.IsDir() {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			fileServer.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	})
}
