package anthropic

import (
	"encoding/base64"
	"testing"

	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/internal/replaytest"
)

// TestFilesInRequestBody sends images (inline and by URL), a PDF and a
// text file through the SDK and checks the request body the server
// received carries them as Anthropic image and document blocks.
func TestFilesInRequestBody(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	req := replaytest.FilesRequest(
		model.Content{Kind: model.ContentFile, MediaType: "text/plain", Data: []byte("notes"), Filename: "notes.txt"},
	)
	if _, err := collect(newModel(srv, nil).Stream(t.Context(), req)); err != nil {
		t.Fatal(err)
	}
	srv.CheckUserContent(t, `[
		{"type": "text", "text": "What is in these?"},
		{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "`+base64.StdEncoding.EncodeToString(replaytest.PNG)+`"}},
		{"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
		{"type": "document", "title": "report.pdf", "source": {"type": "base64", "media_type": "application/pdf", "data": "`+base64.StdEncoding.EncodeToString(replaytest.PDF)+`"}},
		{"type": "document", "title": "notes.txt", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
	]`)
}

// TestFileLimits: an image over the limit (5 MiB by default) or a file of
// a type Anthropic does not take fails with a *model.RequestError naming
// the file, and nothing is sent.
func TestFileLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		file model.Content
		want string
	}{
		{"default image limit", Config{}, model.Content{Kind: model.ContentFile, MediaType: "image/jpeg", Data: make([]byte, 5<<20+1), Filename: "huge.jpg"},
			`file "huge.jpg" is 5.0 MiB, more than the Anthropic limit of 5.0 MiB per image`},
		{"pdf limit", Config{MaxPDFBytes: 100}, model.Content{Kind: model.ContentFile, MediaType: "application/pdf", Data: make([]byte, 101)},
			"is 101 bytes, more than the Anthropic limit of 100 bytes per PDF"},
		{"unsupported", Config{}, model.Content{Kind: model.ContentFile, MediaType: "video/mp4", Data: []byte("x"), Filename: "clip.mp4"},
			`Anthropic does not take video/mp4 files ("clip.mp4")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := replaytest.New(t)
			cfg := tc.cfg
			cfg.BaseURL, cfg.APIKey, cfg.HTTPClient = srv.URL, "sk-test", srv.Client()
			req := &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: []model.Content{model.Text("look"), tc.file}}}}
			_, err := collect(New(cfg).Stream(t.Context(), req))
			srv.CheckRefused(t, err, tc.want)
		})
	}
}
