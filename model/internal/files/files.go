// Package files checks the files of a model request (model.ContentFile)
// against a provider's limits and gives them in the forms the providers'
// SDKs take: base64 data, a data: URL, or the file's own http(s) URL.
package files

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"

	"github.com/agentry/agentry/model"
)

// Kind is the class of a file a provider takes.
type Kind int

// Kinds of files.
const (
	Unsupported Kind = iota
	Image
	PDF
	Text
)

// Default limits on one file's size, in bytes, used for zero fields of
// Limits. They are the providers' own documented ceilings: an image of
// more than 5 MB is refused by Anthropic, a PDF request of more than 32 MB
// by both.
const (
	DefaultMaxImageBytes = 5 << 20
	DefaultMaxPDFBytes   = 32 << 20
	DefaultMaxTextBytes  = 1 << 20
)

// Limits cap the size of one file, by kind. Zero fields take the
// defaults.
type Limits struct {
	MaxImageBytes int
	MaxPDFBytes   int
	MaxTextBytes  int
}

func (l Limits) max(k Kind) int {
	switch k {
	case Image:
		return or(l.MaxImageBytes, DefaultMaxImageBytes)
	case PDF:
		return or(l.MaxPDFBytes, DefaultMaxPDFBytes)
	case Text:
		return or(l.MaxTextBytes, DefaultMaxTextBytes)
	}
	return 0
}

func or(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// KindOf classifies a media type: the images every provider takes (JPEG,
// PNG, GIF, WebP), PDF, and plain text.
func KindOf(mediaType string) Kind {
	mt := strings.ToLower(strings.TrimSpace(strings.SplitN(mediaType, ";", 2)[0]))
	switch mt {
	case "image/jpeg", "image/jpg", "image/png", "image/gif", "image/webp":
		return Image
	case "application/pdf":
		return PDF
	case "text/plain":
		return Text
	}
	return Unsupported
}

// Check returns the kind of file c, or a *model.RequestError naming the
// file when the provider does not take its kind (accepted says which it
// takes), when it is larger than the limit, or when it has neither data
// nor an http(s) URL.
func Check(provider string, c model.Content, lim Limits, accepted ...Kind) (Kind, error) {
	k := KindOf(c.MediaType)
	ok := false
	for _, a := range accepted {
		ok = ok || a == k
	}
	name := Name(c)
	if !ok {
		return 0, &model.RequestError{Message: fmt.Sprintf("%s does not take %s files (%s): attach %s",
			provider, mediaTypeOr(c.MediaType), name, describe(accepted))}
	}
	switch {
	case len(c.Data) > 0:
		if n, max := len(c.Data), lim.max(k); n > max {
			return 0, &model.RequestError{Message: fmt.Sprintf("file %s is %s, more than the %s limit of %s per %s",
				name, size(n), provider, size(max), kindName(k))}
		}
	case c.URL != "":
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return 0, &model.RequestError{Message: fmt.Sprintf("file %s: its url must be a base64 data: URL or an http(s) URL", name)}
		}
	default:
		return 0, &model.RequestError{Message: fmt.Sprintf("file %s is empty", name)}
	}
	return k, nil
}

// Name names a file in an error: its file name, else its media type.
func Name(c model.Content) string {
	if c.Filename != "" {
		return fmt.Sprintf("%q", c.Filename)
	}
	return "of type " + mediaTypeOr(c.MediaType)
}

func mediaTypeOr(mt string) string {
	if mt == "" {
		return "unknown type"
	}
	return mt
}

func describe(kinds []Kind) string {
	var names []string
	for _, k := range kinds {
		switch k {
		case Image:
			names = append(names, "images (JPEG, PNG, GIF, WebP)")
		case PDF:
			names = append(names, "PDFs")
		case Text:
			names = append(names, "plain text")
		}
	}
	return strings.Join(names, ", ")
}

func kindName(k Kind) string {
	switch k {
	case Image:
		return "image"
	case PDF:
		return "PDF"
	case Text:
		return "text file"
	}
	return "file"
}

func size(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%d KiB", (n+1023)/1024)
}

// Base64 returns a file's data in standard base64.
func Base64(c model.Content) string { return base64.StdEncoding.EncodeToString(c.Data) }

// DataURL returns a file's data as a data: URL.
func DataURL(c model.Content) string {
	return "data:" + c.MediaType + ";base64," + Base64(c)
}

// MediaType returns the bare, lower-case media type of c ("image/jpg"
// becomes "image/jpeg").
func MediaType(c model.Content) string {
	mt := strings.ToLower(strings.TrimSpace(strings.SplitN(c.MediaType, ";", 2)[0]))
	if mt == "image/jpg" {
		return "image/jpeg"
	}
	return mt
}
