package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// moduleRoot returns the folder of the module's go.mod: the nearest
// folder above this file's that has one, so the kit may move in the tree.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return findModuleRoot(filepath.Dir(file))
}

// findModuleRoot returns dir or the nearest folder above it that holds a
// go.mod, or dir itself when none does.
func findModuleRoot(dir string) string {
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return dir
		}
		d = parent
	}
}

// BuildBinary builds the command pkg (an import path of this module) into a
// new temporary folder, with -race when race is set (pass Race to build it
// like the tests), and returns the binary's path and a function that removes
// the folder.
func BuildBinary(pkg string, race bool) (path string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "agentry-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	path = filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", path}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return path, cleanup, nil
}

// Binary is a command that a test package builds at most once, on first
// use, so that tests that skip never build it. Declare it as a package
// variable and call Remove from TestMain after the tests ran.
type Binary struct {
	// Pkg is the command's import path.
	Pkg string
	// Race builds it with -race (pass Race to build it like the tests).
	Race bool

	once    sync.Once
	path    string
	cleanup func()
	err     error
}

// Path builds the binary on the first call and returns its path; a build
// error fails t (and every later caller).
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() { b.path, b.cleanup, b.err = BuildBinary(b.Pkg, b.Race) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Remove deletes the binary if it was built.
func (b *Binary) Remove() {
	b.once.Do(func() {}) // after this, nothing builds it any more
	if b.cleanup != nil {
		b.cleanup()
	}
}

// Main is the TestMain of a package that builds binaries: it runs the tests
// under goleak.VerifyTestMain, then removes bins and exits with the tests'
// code.
func Main(m *testing.M, bins ...*Binary) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		for _, b := range bins {
			b.Remove()
		}
		os.Exit(code)
	}))
}

// Process is a server subprocess started by StartProcess.
type Process struct {
	// Host is the "127.0.0.1:port" the server listens on, as it logged it.
	Host string

	t     testing.TB
	name  string
	cmd   *exec.Cmd
	limit time.Duration

	mu     sync.Mutex
	stderr strings.Builder

	eof     chan struct{} // closed when stderr reached EOF
	waited  bool
	waitErr error
}

// listening matches the line cmd/agentry (and ServeMain) logs once it
// listens.
var listening = regexp.MustCompile(`msg="agentry listening" addr=http://(\S+)`)

// StartProcess runs bin with args and returns once the process logged
// "agentry listening addr=http://…" on stderr, as cmd/agentry and ServeMain
// do; limit bounds that wait and the one of Stop. The environment has
// GORACE=atexit_sleep_ms=0, so that a -race build exits at once (a race
// still fails its exit status).
//
// On the test's cleanup a process still running is killed. When the test
// failed, a process still running first gets SIGQUIT (its goroutine dump
// shows where it waited, for up to 5s), and the process's stderr is logged.
func StartProcess(t testing.TB, limit time.Duration, bin string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{t: t, name: filepath.Base(bin), cmd: cmd, limit: limit, eof: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(p.eof)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr.WriteString(line + "\n")
			p.mu.Unlock()
			if !found {
				if m := listening.FindStringSubmatch(line); m != nil {
					found = true
					addr <- m[1]
				}
			}
		}
	}()
	t.Cleanup(func() {
		if t.Failed() && !p.waited {
			p.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.eof:
			case <-time.After(5 * time.Second):
			}
		}
		p.Kill()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", p.name, p.Log())
		}
	})
	select {
	case p.Host = <-addr:
	case <-p.eof:
		t.Fatalf("%s exited before listening (stderr follows)", p.name)
	case <-time.After(limit):
		t.Fatalf("%s did not log its address within %v (stderr follows)", p.name, limit)
	}
	return p
}

// Log returns what the process wrote to stderr so far.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// wait waits for the process to exit (after its stderr closed, as
// exec.Cmd.Wait requires) and returns Wait's error.
func (p *Process) wait() error {
	<-p.eof
	p.waitErr = p.cmd.Wait()
	p.waited = true
	return p.waitErr
}

// Kill sends SIGKILL, so that no shutdown code runs, and reaps the process.
// It returns the error of exec.Cmd.Wait (an *exec.ExitError whose status
// names the signal when SIGKILL ended it), or the earlier one when the
// process was already reaped.
func (p *Process) Kill() error {
	if p.waited {
		return p.waitErr
	}
	// The process may have exited by itself; Wait tells.
	p.cmd.Process.Signal(syscall.SIGKILL)
	return p.wait()
}

// Stop sends SIGTERM and waits, within the limit given to StartProcess,
// for the process to exit. Anything but exit status 0 (a -race build that
// saw a race exits 66) fails the test.
func (p *Process) Stop() {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.eof:
	case <-time.After(p.limit):
		p.t.Fatalf("%s did not stop within %v of SIGTERM", p.name, p.limit)
	}
	if err := p.wait(); err != nil {
		p.t.Fatalf("after SIGTERM, %s exited with %v; want status 0 (stderr follows)", p.name, err)
	}
}

// Signal sends sig to the process (SIGSTOP and SIGCONT, for tests of a
// paused node).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }
