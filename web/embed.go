// Package web serves Agentry's playground: the React app in this folder,
// built by Vite into dist/ (committed) and embedded in the binary, so
// `agentry serve` needs no Node at run time. check-bundle.sh checks that
// dist/ matches the sources.
package web

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
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

// file is one file of the build as the handler serves it: its bytes, and
// their gzip encoding when that is smaller.
type file struct {
	name        string
	contentType string
	cache       string
	body        []byte
	etag        string
	gz          []byte // nil when compression does not pay
	gzETag      string
}

// Handler serves the playground: index.html at "/" (always revalidated, so
// a new build is picked up at once) and the content-hashed files under
// /assets/ (cached for good). Other paths are 404s; the page keeps its
// own state in the URL's hash, so it needs no fallback routes.
//
// The files are compressed once, when Handler is called: a client whose
// Accept-Encoding admits gzip gets the gzip encoding. Each encoding has an
// ETag of its own, and every response says Vary: Accept-Encoding.
func Handler() http.Handler {
	files, err := load(Dist())
	if err != nil {
		panic(err) // the embedded build is readable and gzip cannot fail on memory
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if containsDotDot(r.URL.Path) {
			http.Error(w, "invalid URL path", http.StatusBadRequest)
			return
		}
		p := path.Clean("/" + r.URL.Path)
		if p == "/index.html" {
			http.Redirect(w, r, "./", http.StatusMovedPermanently)
			return
		}
		if p == "/" {
			p = "/index.html"
		}
		f, ok := files[strings.TrimPrefix(p, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		serve(w, r, f)
	})
}

// load reads and compresses every file of the build.
func load(fsys fs.FS) (map[string]*file, error) {
	files := map[string]*file{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		cache := "public, max-age=31536000, immutable" // assets' names hash their content
		switch {
		case p == "index.html":
			cache = "no-cache"
		case !strings.HasPrefix(p, "assets/"):
			return nil
		}
		body, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = http.DetectContentType(body)
		}
		f := &file{name: p, contentType: ct, cache: cache, body: body, etag: etag(body, "")}
		var buf bytes.Buffer
		zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		if err != nil {
			return err
		}
		if _, err := zw.Write(body); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		if buf.Len() < len(body) {
			f.gz, f.gzETag = buf.Bytes(), etag(body, "-gzip")
		}
		files[p] = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("web: load the build: %w", err)
	}
	return files, nil
}

// etag is a strong validator of content: a hash of it, with suffix naming
// the encoding.
func etag(body []byte, suffix string) string {
	sum := sha256.Sum256(body)
	return `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + suffix + `"`
}

// serve writes f in the encoding r accepts; http.ServeContent answers
// conditional, HEAD and range requests.
func serve(w http.ResponseWriter, r *http.Request, f *file) {
	h := w.Header()
	h.Set("Content-Type", f.contentType)
	h.Set("Cache-Control", f.cache)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Add("Vary", "Accept-Encoding")
	body, tag := f.body, f.etag
	if f.gz != nil && acceptsGzip(r.Header.Values("Accept-Encoding")) {
		body, tag = f.gz, f.gzETag
		h.Set("Content-Encoding", "gzip")
		if r.Header.Get("Range") == "" {
			// ServeContent leaves the length of an encoded body out; a
			// whole one has the length of the gzip bytes (a 304 drops it).
			h.Set("Content-Length", strconv.Itoa(len(body)))
		}
	}
	h.Set("ETag", tag)
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(body))
}

// acceptsGzip reports whether Accept-Encoding values admit gzip: gzip (or
// x-gzip, or *) listed with a q above zero.
func acceptsGzip(values []string) bool {
	star, gzipQ := false, -1.0
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(item), ";")
			q := 1.0
			for _, p := range strings.Split(params, ";") {
				if k, val, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
						q = f
					} else {
						q = 0
					}
				}
			}
			switch c := strings.ToLower(strings.TrimSpace(coding)); c {
			case "gzip", "x-gzip":
				gzipQ = max(gzipQ, q)
			case "*":
				star = star || q > 0
			}
		}
	}
	if gzipQ >= 0 {
		return gzipQ > 0
	}
	return star
}

// containsDotDot reports whether a URL path has a ".." element, which the
// handler refuses as http.ServeFile does.
func containsDotDot(v string) bool {
	if !strings.Contains(v, "..") {
		return false
	}
	for _, ent := range strings.FieldsFunc(v, func(r rune) bool { return r == '/' || r == '\\' }) {
		if ent == ".." {
			return true
		}
	}
	return false
}
