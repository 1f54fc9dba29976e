package message

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"

	"github.com/agentry/agentry/model"
)

// Tool result texts that ToModel puts in place of results a transcript
// lacks, so that every tool call has an answer, as providers require.
const (
	// ResultMissing answers a call that has no result yet: its input was
	// available but it never ran or never reported back.
	ResultMissing = "tool result missing"
	// ResultDenied answers a call the user refused to approve.
	ResultDenied = "tool execution denied"
)

// ToModel converts a UI transcript into the provider-neutral conversation
// of package model.
//
//   - The texts of system messages are joined, separated by blank lines,
//     into system.
//   - A user message becomes a user message of its text and file parts. A
//     file part becomes a model.ContentFile: the bytes of a data: URL
//     (base64 or percent-encoded), or the URL itself for any other URL (a
//     provider takes http and https URLs and refuses others with a
//     *model.RequestError). Data parts are skipped.
//   - An assistant message is split at its step-start parts. Each step
//     becomes an assistant message of its reasoning, text and tool calls,
//     followed by a tool message with the calls' results: Output for an
//     output-available part; the error text as a JSON string with IsError
//     for an output-error part. A call with no result (input-available,
//     approval-requested, approval-responded) is answered by the error
//     ResultMissing, and a denied call by the error ResultDenied. Tool parts
//     whose input is still streaming are left out: the model never finished
//     the call.
//   - In assistant messages, data, source and file parts are skipped; a
//     message left with no content is skipped too.
func ToModel(msgs []Message) (system string, conv []model.Message) {
	var sys []string
	for _, m := range msgs {
		switch m.Role {
		case RoleSystem:
			if t := joinText(m.Parts); t != "" {
				sys = append(sys, t)
			}
		case RoleUser:
			var content []model.Content
			for _, p := range m.Parts {
				switch {
				case p.Type == PartText && p.Text != "":
					content = append(content, model.Text(p.Text))
				case p.Type == PartFile:
					content = append(content, FileContent(p))
				}
			}
			if len(content) > 0 {
				conv = append(conv, model.Message{Role: model.RoleUser, Content: content})
			}
		case RoleAssistant:
			conv = appendAssistant(conv, m.Parts)
		}
	}
	return strings.Join(sys, "\n\n"), conv
}

// FileContent returns the model content of a file part: the data of a
// data: URL, else the URL as it is. The part's media type wins over the
// data URL's.
func FileContent(p Part) model.Content {
	c := model.Content{Kind: model.ContentFile, MediaType: p.MediaType, Filename: p.Filename}
	mt, data, ok := DecodeDataURL(p.URL)
	switch {
	case ok:
		c.Data = data
		if c.MediaType == "" {
			c.MediaType = mt
		}
	default:
		c.URL = p.URL
	}
	return c
}

// DecodeDataURL decodes a data: URL (RFC 2397) into its media type and
// bytes; ok is false when u is not a well-formed data: URL.
func DecodeDataURL(u string) (mediaType string, data []byte, ok bool) {
	rest, found := strings.CutPrefix(u, "data:")
	if !found {
		if len(u) < 5 || !strings.EqualFold(u[:5], "data:") {
			return "", nil, false
		}
		rest = u[5:]
	}
	meta, payload, found := strings.Cut(rest, ",")
	if !found {
		return "", nil, false
	}
	meta, b64 := strings.CutSuffix(meta, ";base64")
	mediaType = strings.SplitN(meta, ";", 2)[0]
	if mediaType == "" {
		mediaType = "text/plain"
	}
	if b64 {
		d, err := base64.StdEncoding.DecodeString(payload)
		if err != nil {
			if d, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(payload, "=")); err != nil {
				return "", nil, false
			}
		}
		return mediaType, d, true
	}
	s, err := url.PathUnescape(payload)
	if err != nil {
		return "", nil, false
	}
	return mediaType, []byte(s), true
}

// joinText concatenates the text parts of a message.
func joinText(parts []Part) string {
	var b strings.Builder
	for _, p := range parts {
		if p.Type == PartText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// visible returns Visible(parts) for a caller that only reads it: parts
// itself when Visible would leave nothing out (a message no restart cut
// short), without Visible's copy of every part.
func visible(parts []Part) []Part {
	for i := range parts {
		if parts[i].Type == DataPartPrefix+InterruptedStepName || parts[i].Interrupted() {
			return Visible(parts)
		}
	}
	return parts
}

// appendAssistant appends the model messages of one assistant UI message,
// one assistant message (and its tool results) per step.
func appendAssistant(conv []model.Message, parts []Part) []model.Message {
	var content, results []model.Content
	flush := func() {
		if len(content) > 0 {
			conv = append(conv, model.Message{Role: model.RoleAssistant, Content: content})
		}
		if len(results) > 0 {
			conv = append(conv, model.Message{Role: model.RoleTool, Content: results})
		}
		content, results = nil, nil
	}
	// What a restart cut short stays for clients; the model answers anew.
	for _, p := range visible(parts) {
		switch {
		case p.Type == PartStepStart:
			flush()
		case p.Type == PartText && p.Text != "":
			content = append(content, model.Text(p.Text))
		case p.Type == PartReasoning && p.Text != "":
			content = append(content, model.Content{Kind: model.ContentReasoning, Text: p.Text})
		case p.IsTool() && p.State != StateInputStreaming && p.State != "":
			content = append(content, model.Content{
				Kind:       model.ContentToolCall,
				ToolCallID: p.ToolCallID,
				ToolName:   p.ToolName(),
				Input:      callInput(p),
			})
			results = append(results, toolResult(p))
		}
	}
	flush()
	return conv
}

// callInput returns the JSON arguments of a tool part's call: its input,
// else the raw input of a call whose input was rejected if that is an
// object, else an empty object.
func callInput(p Part) json.RawMessage {
	if !isNull(p.Input) {
		return cloneRaw(p.Input)
	}
	if isObject(p.RawInput) && json.Valid(p.RawInput) {
		return cloneRaw(p.RawInput)
	}
	return json.RawMessage("{}")
}

// toolResult returns the result content answering the call of tool part p.
func toolResult(p Part) model.Content {
	c := model.Content{
		Kind:       model.ContentToolResult,
		ToolCallID: p.ToolCallID,
		ToolName:   p.ToolName(),
	}
	switch p.State {
	case StateOutputAvailable:
		c.Output = cloneRaw(p.Output)
		if len(c.Output) == 0 {
			c.Output = json.RawMessage("null")
		}
		return c
	case StateOutputError:
		c.Output = jsonString(p.ErrorText)
	case StateOutputDenied:
		text := ResultDenied
		if p.Approval != nil && p.Approval.Reason != "" {
			text += ": " + p.Approval.Reason
		}
		c.Output = jsonString(text)
	default:
		c.Output = jsonString(ResultMissing)
	}
	c.IsError = true
	return c
}

// jsonString encodes s as a JSON string.
func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}
