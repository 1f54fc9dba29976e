package chat_test

import (
	"strings"
	"testing"
)

// Register refuses a callable that is one of chat.Base's methods (the
// transcript's and the layer's own), naming the method and chat.Base, and
// one of agent.Base's promoted through it.
func TestRegisterRefusesChatMethods(t *testing.T) {
	r := newRig(t, rigOptions{})
	for callable, from := range map[string]string{
		"clearMessages":  "chat.Base",
		"saveMessages":   "chat.Base",
		"appendMessages": "chat.Base",
		"layerFrame":     "chat.Base",
		"destroy":        "agent.Base",
	} {
		c := chatClass("Bot", &kit{})
		c.Callable = []string{callable}
		err := r.rt.Register(c)
		if err == nil {
			t.Errorf("callable %q registered", callable)
			continue
		}
		if !strings.Contains(err.Error(), "is a framework method (of "+from+")") || !strings.Contains(err.Error(), `"`+callable+`"`) {
			t.Errorf("callable %q: error %q does not name it and %s", callable, err, from)
		}
	}
}
