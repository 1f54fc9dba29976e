package browsertest_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentry/agentry/internal/testkit/browsertest"
)

// TestDirAndEnv: Dir is the folder of the browser scripts, and Env names
// the Chromium and a profile folder that exists.
func TestDirAndEnv(t *testing.T) {
	if _, err := os.Stat(filepath.Join(browsertest.Dir(), "playground.mjs")); err != nil {
		t.Fatalf("Dir() = %s: %v", browsertest.Dir(), err)
	}
	env := browsertest.Env(t)
	if !slices.Contains(env, "CHROMIUM="+browsertest.Chromium) {
		t.Fatalf("Env() has no CHROMIUM=%s", browsertest.Chromium)
	}
	var profile string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CHROMIUM_USER_DATA_DIR="); ok {
			profile = v
		}
	}
	if st, err := os.Stat(profile); err != nil || !st.IsDir() {
		t.Fatalf("profile folder %q: %v", profile, err)
	}
}
