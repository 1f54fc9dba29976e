package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// PublicError is an error whose message is meant for clients. Errors that
// reach a client (an RPC's error response, an error frame, a failed chat
// turn, a failed agent-tool run) show their text only when they are, or
// wrap, a *PublicError; every other error is logged with a correlation id
// and the client sees "internal error (id …)" (see Runtime.ClientMessage).
// Return one from a callable method for an error the user should read.
type PublicError struct {
	// Message is the text clients see.
	Message string
	// Err is the underlying error, if any; it is logged, never sent.
	Err error
}

func (e *PublicError) Error() string { return e.Message }

func (e *PublicError) Unwrap() error { return e.Err }

// Publicf formats an error whose whole message clients may see, as
// fmt.Errorf does: %w wraps an error (for errors.Is and As) and puts its
// text into the public message, so wrap only errors whose text is safe to
// show.
func Publicf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &PublicError{Message: err.Error(), Err: errors.Unwrap(err)}
}

// ClientMessage returns the text of err that may be sent to a client. The
// message of the first *PublicError in err's chain is shown as it is, and
// so are the framework's own client-facing errors: *ArgumentError (the
// client's arguments do not fit), *HTTPError and *CloseError (a hook's
// refusal), and a deadline or cancellation ("timed out", "canceled").
// Anything else is logged at warning level with attrs and a fresh
// correlation id, and the client is told "internal error (id <id>)". It
// returns "" for a nil err.
func (rt *Runtime) ClientMessage(err error, attrs ...any) string {
	if err == nil {
		return ""
	}
	if pe, ok := errors.AsType[*PublicError](err); ok {
		return pe.Message
	}
	if ae, ok := errors.AsType[*ArgumentError](err); ok {
		return ae.Error()
	}
	if he, ok := errors.AsType[*HTTPError](err); ok && he.Message != "" {
		return he.Message
	}
	if ce, ok := errors.AsType[*CloseError](err); ok && ce.Reason != "" {
		return ce.Reason
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	id := errorID()
	rt.log.Warn("internal error sent to a client as its id", append([]any{"errorId", id, "err", err}, attrs...)...)
	return "internal error (id " + id + ")"
}

// errorID returns a random correlation id of 8 hex digits.
func errorID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
