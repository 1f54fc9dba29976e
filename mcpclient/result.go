package mcpclient

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/chat"
)

// mapResult maps a tools/call result to the AI SDK's parts:
//
//   - isError: the call fails (tool-output-error) with the text content as
//     its error text;
//   - images, audio and embedded resources: file parts (data: URLs) written
//     into the message while the call runs; resource links: file parts
//     with the link's URI;
//   - the output (tool-output-available, what the model reads): the
//     structuredContent when the server gave one, else the text content
//     joined by blank lines, with a note for each file part so that the
//     model knows what was shown.
func (c *Client) mapResult(ctx context.Context, res *mcp.CallToolResult) (any, error) {
	var texts []string
	ts, stream := chat.ToolStreamFrom(ctx)
	file := func(kind, mediaType string, data []byte, url string) {
		if mediaType == "" {
			mediaType = "application/octet-stream"
		}
		if url == "" {
			if len(data) > c.opts.MaxFileBytes {
				texts = append(texts, fmt.Sprintf("[%s %s of %d bytes left out: over the %d-byte limit]", kind, mediaType, len(data), c.opts.MaxFileBytes))
				return
			}
			url = "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(data)
		}
		if !stream || ts.File(mediaType, url) != nil {
			texts = append(texts, fmt.Sprintf("[%s %s not shown]", kind, mediaType))
			return
		}
		texts = append(texts, fmt.Sprintf("[%s %s shown to the user as a file part]", kind, mediaType))
	}
	var plain []string // the text blocks only, for an error's text
	for _, ct := range res.Content {
		switch ct := ct.(type) {
		case *mcp.TextContent:
			texts = append(texts, ct.Text)
			plain = append(plain, ct.Text)
		case *mcp.ImageContent:
			file("image", ct.MIMEType, ct.Data, "")
		case *mcp.AudioContent:
			file("audio", ct.MIMEType, ct.Data, "")
		case *mcp.EmbeddedResource:
			r := ct.Resource
			if r == nil {
				continue
			}
			data := r.Blob
			mediaType := r.MIMEType
			if data == nil {
				data = []byte(r.Text)
				if mediaType == "" {
					mediaType = "text/plain"
				}
			}
			file("resource "+r.URI, mediaType, data, "")
		case *mcp.ResourceLink:
			file("resource link "+ct.URI, ct.MIMEType, nil, ct.URI)
		default:
			texts = append(texts, fmt.Sprintf("[content of type %T left out]", ct))
		}
	}
	if res.IsError {
		msg := strings.Join(plain, "\n\n")
		if msg == "" {
			msg = "the MCP tool reported an error"
		}
		return nil, errors.New(msg)
	}
	if res.StructuredContent != nil {
		return res.StructuredContent, nil
	}
	return strings.Join(texts, "\n\n"), nil
}
