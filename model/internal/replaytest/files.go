package replaytest

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/agentry/agentry/model"
)

// PNG is a 1×1 transparent PNG and PDF a minimal PDF: the files of the
// providers' file tests.
var (
	PNG, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
	PDF    = []byte("%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n")
)

// FilesRequest is a request of one user message: the text "What is in
// these?", PNG inline, a JPEG by URL (https://example.com/cat.jpg), PDF
// inline named report.pdf, then extra.
func FilesRequest(extra ...model.Content) *model.Request {
	content := append([]model.Content{
		model.Text("What is in these?"),
		model.File("image/png", PNG),
		{Kind: model.ContentFile, MediaType: "image/jpeg", URL: "https://example.com/cat.jpg"},
		{Kind: model.ContentFile, MediaType: "application/pdf", Data: PDF, Filename: "report.pdf"},
	}, extra...)
	return &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: content}}}
}

// CheckUserContent checks that the first request s received has one
// message, a user one (the body's "messages" array), whose content is the
// JSON want.
func (s *Server) CheckUserContent(t testing.TB, want string) {
	t.Helper()
	var body struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(s.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	var w []any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want: %v", err)
	}
	if len(body.Messages) != 1 || body.Messages[0]["role"] != "user" {
		t.Fatalf("messages = %v", body.Messages)
	}
	if got := body.Messages[0]["content"]; !reflect.DeepEqual(got, w) {
		g, _ := json.MarshalIndent(got, "", "  ")
		t.Errorf("user content:\n%s", g)
	}
}

// CheckRefused checks that err is a *model.RequestError whose message
// contains want, and that s received no request.
func (s *Server) CheckRefused(t testing.TB, err error, want string) {
	t.Helper()
	var re *model.RequestError
	if !errors.As(err, &re) || !strings.Contains(re.Message, want) {
		t.Fatalf("err = %v, want a RequestError containing %q", err, want)
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("%d requests sent, want none", n)
	}
}
