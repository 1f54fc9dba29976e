package web_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/agentry/agentry/web"
)

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

// TestHandler serves the embedded build: the page at /, every asset it
// links, and nothing else.
func TestHandler(t *testing.T) {
	h := web.Handler()
	res := get(t, h, http.MethodGet, "/")
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || !strings.Contains(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if res.Header.Get("Cache-Control") != "no-cache" {
		t.Errorf("index Cache-Control = %q", res.Header.Get("Cache-Control"))
	}
	if !strings.Contains(string(body), `<div id="root">`) {
		t.Fatalf("index.html has no root element:\n%s", body)
	}
	links := regexp.MustCompile(`(?:src|href)="(/assets/[^"]+)"`).FindAllStringSubmatch(string(body), -1)
	if len(links) < 2 {
		t.Fatalf("index.html links %d assets, want the script and the stylesheet:\n%s", len(links), body)
	}
	for _, l := range links {
		res := get(t, h, http.MethodGet, l[1])
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d", l[1], res.StatusCode)
		}
		if !strings.Contains(res.Header.Get("Cache-Control"), "immutable") {
			t.Errorf("GET %s Cache-Control = %q", l[1], res.Header.Get("Cache-Control"))
		}
		want := "text/css"
		if strings.HasSuffix(l[1], ".js") {
			want = "text/javascript"
		}
		if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, want) {
			t.Errorf("GET %s Content-Type = %q, want %s", l[1], ct, want)
		}
	}
	for path, want := range map[string]int{
		"/nope":                 http.StatusNotFound,
		"/assets/":              http.StatusNotFound,
		"/assets/missing.js":    http.StatusNotFound,
		"/assets/../index.html": http.StatusBadRequest,
		"/index.html":           http.StatusMovedPermanently,
	} {
		if res := get(t, h, http.MethodGet, path); res.StatusCode != want {
			t.Errorf("GET %s = %d, want %d", path, res.StatusCode, want)
		}
	}
	if res := get(t, h, http.MethodPost, "/"); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST / = %d", res.StatusCode)
	}
	if res := get(t, h, http.MethodHead, "/"); res.StatusCode != http.StatusOK {
		t.Errorf("HEAD / = %d", res.StatusCode)
	}
}

// TestDistIsSmall keeps the embedded bundle to the page and its assets:
// no source maps, nothing stray.
func TestDistIsSmall(t *testing.T) {
	total := 0
	err := fs.WalkDir(web.Dist(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if p != "index.html" && !regexp.MustCompile(`^assets/[\w-]+\.(js|css)$`).MatchString(p) {
			t.Errorf("unexpected file in dist: %s", p)
		}
		info, _ := d.Info()
		total += int(info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > 2<<20 {
		t.Errorf("dist is %d bytes; more than 2 MiB", total)
	}
}

// TestHandlerGzip serves the gzip encoding to clients that accept it, with
// its own ETag, and the identity encoding to the others; both revalidate.
func TestHandlerGzip(t *testing.T) {
	h := web.Handler()
	index := get(t, h, http.MethodGet, "/")
	page, _ := io.ReadAll(index.Body)
	script := regexp.MustCompile(`src="(/assets/[^"]+\.js)"`).FindStringSubmatch(string(page))
	if script == nil {
		t.Fatalf("no script in index.html:\n%s", page)
	}
	do := func(path string, header ...string) (*http.Response, []byte) {
		t.Helper()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Add(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		res := rec.Result()
		b, _ := io.ReadAll(res.Body)
		return res, b
	}
	for _, p := range []string{script[1], "/"} {
		plain, plainBody := do(p)
		if plain.Header.Get("Content-Encoding") != "" || plain.Header.Get("Vary") != "Accept-Encoding" || plain.Header.Get("ETag") == "" {
			t.Errorf("%s without Accept-Encoding: headers %v", p, plain.Header)
		}
		zipped, zippedBody := do(p, "Accept-Encoding", "br;q=1.0, gzip;q=0.8, *;q=0.1")
		if zipped.Header.Get("Content-Encoding") != "gzip" || zipped.Header.Get("Vary") != "Accept-Encoding" {
			t.Fatalf("%s with gzip: headers %v", p, zipped.Header)
		}
		if zipped.Header.Get("ETag") == plain.Header.Get("ETag") {
			t.Errorf("%s: both encodings have the ETag %s", p, plain.Header.Get("ETag"))
		}
		if got := zipped.Header.Get("Content-Length"); got != strconv.Itoa(len(zippedBody)) {
			t.Errorf("%s: Content-Length %s for %d bytes", p, got, len(zippedBody))
		}
		zr, err := gzip.NewReader(bytes.NewReader(zippedBody))
		if err != nil {
			t.Fatal(err)
		}
		unzipped, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(unzipped, plainBody) {
			t.Fatalf("%s: the gzip body does not decode to the file (%v)", p, err)
		}
		if p != "/" && len(zippedBody)*3 > len(plainBody) {
			t.Errorf("%s: gzip %d bytes of %d; want under a third", p, len(zippedBody), len(plainBody))
		}
		// Revalidation: each encoding's ETag gives a 304 for that encoding.
		if res, _ := do(p, "Accept-Encoding", "gzip", "If-None-Match", zipped.Header.Get("ETag")); res.StatusCode != http.StatusNotModified {
			t.Errorf("%s: If-None-Match with the gzip ETag = %d, want 304", p, res.StatusCode)
		}
		if res, _ := do(p, "If-None-Match", plain.Header.Get("ETag")); res.StatusCode != http.StatusNotModified {
			t.Errorf("%s: If-None-Match with the identity ETag = %d, want 304", p, res.StatusCode)
		}
		if res, _ := do(p, "Accept-Encoding", "gzip", "If-None-Match", plain.Header.Get("ETag")); res.StatusCode != http.StatusOK {
			t.Errorf("%s: the identity ETag revalidated the gzip encoding (%d)", p, res.StatusCode)
		}
	}
	// Codings that refuse gzip get the identity encoding.
	for _, ae := range []string{"gzip;q=0", "identity", "br", "*;q=0", "gzip;q=0, *"} {
		res, _ := do(script[1], "Accept-Encoding", ae)
		if res.Header.Get("Content-Encoding") != "" {
			t.Errorf("Accept-Encoding %q: got %q", ae, res.Header.Get("Content-Encoding"))
		}
	}
	if res, _ := do(script[1], "Accept-Encoding", "*"); res.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("Accept-Encoding *: got %q", res.Header.Get("Content-Encoding"))
	}
}
