package client

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/agentry/agentry/wire"
)

// head is the part of a server frame the dispatcher looks at.
type head struct {
	Type         string          `json:"type"`
	Name         string          `json:"name"`
	Agent        string          `json:"agent"`
	StateFollows bool            `json:"stateFollows"`
	State        json.RawMessage `json:"state"`
	Error        json.RawMessage `json:"error"`
}

// leadingType returns the type of a frame that starts with its "type"
// member, as every frame of the server does, without decoding the rest
// (the frames of streams and agent-tool events are most of the traffic,
// and the handlers that take them decode them anyway). ok is false for
// any other shape, or a type with an escape or not in UTF-8, which
// dispatch decodes. A frame with a second "type" member, which the server
// never writes, is read by its first (encoding/json reads the last).
func leadingType(data []byte) (typ string, ok bool) {
	const prefix = `{"type":"`
	if !bytes.HasPrefix(data, []byte(prefix)) {
		return "", false
	}
	rest := data[len(prefix):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 || !utf8.Valid(rest[:end]) {
		return "", false
	}
	return string(rest[:end]), true
}

// headDecoded reports whether dispatch needs more of a frame of type typ
// than its type.
func headDecoded(typ string) bool {
	switch typ {
	case wire.Identity, wire.State, wire.StateError:
		return true
	}
	return false
}
