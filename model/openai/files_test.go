package openai

import (
	"encoding/base64"
	"testing"

	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/internal/replaytest"
)

// TestFilesInRequestBody sends an image (inline and by URL) and a PDF
// through the SDK and checks the request body the server received carries
// them as OpenAI content parts.
func TestFilesInRequestBody(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	req := replaytest.FilesRequest()
	if _, err := collect(newModel(srv, nil).Stream(t.Context(), req)); err != nil {
		t.Fatal(err)
	}
	srv.CheckUserContent(t, `[
		{"type": "text", "text": "What is in these?"},
		{"type": "image_url", "image_url": {"url": "data:image/png;base64,`+base64.StdEncoding.EncodeToString(replaytest.PNG)+`"}},
		{"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
		{"type": "file", "file": {"file_data": "data:application/pdf;base64,`+base64.StdEncoding.EncodeToString(replaytest.PDF)+`", "filename": "report.pdf"}}
	]`)
}

// TestFileLimits: a file over the limit, of a type OpenAI does not take,
// or a PDF by URL fails with a *model.RequestError naming the file, and
// nothing is sent.
func TestFileLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		file model.Content
		want string
	}{
		{"too large", model.Content{Kind: model.ContentFile, MediaType: "image/png", Data: make([]byte, 2048), Filename: "big.png"},
			`file "big.png" is 2 KiB, more than the OpenAI limit of 1 KiB per image`},
		{"unsupported", model.Content{Kind: model.ContentFile, MediaType: "audio/wav", Data: []byte("RIFF")},
			"OpenAI does not take audio/wav files"},
		{"pdf by url", model.Content{Kind: model.ContentFile, MediaType: "application/pdf", URL: "https://example.com/a.pdf"},
			"OpenAI takes a PDF only inline"},
		{"bad url", model.Content{Kind: model.ContentFile, MediaType: "image/png", URL: "ftp://example.com/a.png"},
			"its url must be a base64 data: URL or an http(s) URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := replaytest.New(t)
			m := New(Config{BaseURL: srv.URL + "/v1", APIKey: "sk-test", HTTPClient: srv.Client(), MaxImageBytes: 1024})
			req := &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: []model.Content{model.Text("look"), tc.file}}}}
			_, err := collect(m.Stream(t.Context(), req))
			srv.CheckRefused(t, err, tc.want)
		})
	}
}
