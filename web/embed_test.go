package web_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
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
