// Package pgtest starts a scratch PostgreSQL cluster for tests: initdb in a
// temporary folder, run as an unprivileged user, listening on a free
// loopback port with its unix socket in the same folder, fsync off. No
// external service is needed; the cluster is stopped (and its folder
// removed) when the test binary ends.
//
// A test package holds one Cluster in a package-level variable of its test
// files and wraps its TestMain with it; every test gets a fresh, empty
// database of its own:
//
//	var pg pgtest.Cluster
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }
//
//	func TestSomething(t *testing.T) {
//		url := pg.URL(t) // postgres://postgres@127.0.0.1:port/t_3?sslmode=disable
//		…
//	}
//
// The cluster starts on the first call of URL, so a test binary whose
// PostgreSQL tests are not selected starts nothing.
//
// When the PostgreSQL binaries (initdb, postgres) cannot be found, URL
// skips the test with a message saying so, except under CI (the CI
// variable set) or with AGENTRY_REQUIRE_POSTGRES=1, where it fails it.
// The binaries are looked up in AGENTRY_PG_BIN, then in PATH, then in
// /usr/lib/postgresql/*/bin (Debian's layout, the newest version first).
//
// Running as root (as CI does), initdb and postgres run as the user
// "nobody" (or AGENTRY_PG_USER), since PostgreSQL refuses to run as root.
package pgtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a scratch PostgreSQL cluster, started on first use. The zero
// value is ready to use; a Cluster must not be copied after first use.
type Cluster struct {
	once     sync.Once
	startErr error // why the cluster could not start
	missing  bool  // startErr is: the binaries are absent

	mu     sync.Mutex // serializes CREATE DATABASE and DROP DATABASE
	dir    string     // the temporary folder: data/ and the socket
	admin  *pgx.Conn  // to the "postgres" database, for CREATE DATABASE
	port   int
	proc   *os.Process
	exited chan struct{} // closed once postgres exited
	logs   *tail
	n      int               // databases created
	named  map[string]string // Named's key → database
	bin    string            // the folder of postgres
	cred   *syscall.Credential
	down   bool // the server was stopped by StopServer
}

// Wrap returns m with a Run that stops the cluster after the tests ran,
// for TestMain: goleak.VerifyTestMain(pg.Wrap(m)) or os.Exit(pg.Wrap(m).Run()).
func (c *Cluster) Wrap(m interface{ Run() int }) interface{ Run() int } {
	return wrapped{m: m, c: c}
}

type wrapped struct {
	m interface{ Run() int }
	c *Cluster
}

func (w wrapped) Run() int {
	code := w.m.Run()
	if err := w.c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Required reports whether a missing PostgreSQL fails tests rather than
// skipping them: under CI, or with AGENTRY_REQUIRE_POSTGRES=1.
func Required() bool {
	return os.Getenv("CI") != "" || os.Getenv("AGENTRY_REQUIRE_POSTGRES") == "1"
}

// URL creates a fresh, empty database for t (dropped when t ends) and
// returns its connection URL. It starts the cluster on first use, and
// skips t (or fails it, see Required) when PostgreSQL is absent.
func (c *Cluster) URL(t testing.TB) string {
	t.Helper()
	c.once.Do(func() { c.startErr = c.start() })
	if c.startErr != nil {
		if c.missing && !Required() {
			t.Skipf("pgtest: PostgreSQL not installed, test skipped (set CI or AGENTRY_REQUIRE_POSTGRES=1 to fail instead): %v", c.startErr)
		}
		t.Fatalf("pgtest: %v", c.startErr)
	}
	name, err := c.create()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.admin == nil {
			t.Errorf("pgtest: database %s not dropped: the server is stopped (StopServer without StartServer)", name)
			return
		}
		// WITH (FORCE) ends the connections a failed test left open.
		if _, err := c.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return c.url(name)
}

// create makes a fresh, empty database and returns its name; the cluster
// must have started.
func (c *Cluster) create() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admin == nil {
		return "", errors.New("the server is stopped")
	}
	c.n++
	name := "t_" + strconv.Itoa(c.n)
	if _, err := c.admin.Exec(context.Background(), "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return name, nil
}

// NewDatabase is URL for a program that is not a test (a load command):
// it starts the cluster on first use and creates a fresh, empty database,
// which lives until Stop. A missing PostgreSQL is an error.
func (c *Cluster) NewDatabase() (string, error) {
	c.once.Do(func() { c.startErr = c.start() })
	if c.startErr != nil {
		return "", fmt.Errorf("pgtest: %w", c.startErr)
	}
	name, err := c.create()
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	return c.url(name), nil
}

// Named is URL for a database that outlives one open: the first call with
// key creates the database (dropped when that t ends), later calls with
// the same key return the same one. A test that restarts a server on the
// same data folder passes the folder as key.
func (c *Cluster) Named(t testing.TB, key string) string {
	t.Helper()
	c.mu.Lock()
	url, ok := c.named[key]
	c.mu.Unlock()
	if ok {
		return url
	}
	url = c.URL(t)
	c.mu.Lock()
	if c.named == nil {
		c.named = make(map[string]string)
	}
	c.named[key] = url
	c.mu.Unlock()
	t.Cleanup(func() {
		c.mu.Lock()
		delete(c.named, key)
		c.mu.Unlock()
	})
	return url
}

// AdminURL returns the URL of the cluster's "postgres" database, for
// tests that need to act on the server itself (pg_terminate_backend and
// the like). It starts the cluster like URL.
func (c *Cluster) AdminURL(t testing.TB) string {
	t.Helper()
	c.once.Do(func() { c.startErr = c.start() })
	if c.startErr != nil {
		if c.missing && !Required() {
			t.Skipf("pgtest: PostgreSQL not installed, test skipped: %v", c.startErr)
		}
		t.Fatalf("pgtest: %v", c.startErr)
	}
	return c.url("postgres")
}

func (c *Cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Stop stops the cluster, if it started, and removes its folder.
func (c *Cluster) Stop() error {
	c.once.Do(func() { c.startErr = errors.New("stopped") })
	return c.stop()
}

func (c *Cluster) stop() error {
	if c.proc == nil {
		return nil
	}
	if c.admin != nil {
		c.admin.Close(context.Background())
	}
	var err error
	c.proc.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.proc.Kill()
		<-c.exited
		err = errors.New("postgres did not stop within 30 s; killed")
	}
	c.proc = nil
	if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
		err = fmt.Errorf("remove cluster folder: %w", rerr)
	}
	return err
}

// StopServer stops the server without removing its data, as `pg_ctl stop`
// does: with immediate, at once (SIGQUIT, `-m immediate`: the server
// processes exit without a checkpoint, and the next start recovers from
// the WAL, as after a crash), else with a fast shutdown (SIGINT: open
// transactions are rolled back and the clients disconnected). The
// connections of every client are gone either way. StartServer starts it
// again on the same port; Restart does both.
func (c *Cluster) StopServer(immediate bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.down {
		return errors.New("pgtest: the server is not running")
	}
	if c.admin != nil {
		c.admin.Close(context.Background())
		c.admin = nil
	}
	sig := syscall.SIGINT
	if immediate {
		sig = syscall.SIGQUIT
	}
	if err := c.proc.Signal(sig); err != nil {
		return fmt.Errorf("pgtest: signal postgres: %w", err)
	}
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.proc.Kill()
		<-c.exited
		return errors.New("pgtest: postgres did not stop within 30 s; killed")
	}
	c.down = true
	return nil
}

// StartServer starts the server StopServer stopped, on the same data
// folder and port, and waits until it accepts connections (after the
// recovery an immediate stop calls for).
func (c *Cluster) StartServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.down {
		return errors.New("pgtest: the server was not stopped")
	}
	if err := c.run(c.bin, filepath.Join(c.dir, "data"), c.port, c.cred); err != nil {
		return fmt.Errorf("pgtest: restart: %w", err)
	}
	c.down = false
	return nil
}

// Restart is StopServer, then StartServer: `pg_ctl restart` (with
// immediate, `-m immediate`).
func (c *Cluster) Restart(immediate bool) error {
	if err := c.StopServer(immediate); err != nil {
		return err
	}
	return c.StartServer()
}

// Bin returns the folder that holds initdb and postgres.
func Bin() (string, error) {
	if d := os.Getenv("AGENTRY_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("AGENTRY_PG_BIN=%s has no initdb", d)
		}
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		d := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb in AGENTRY_PG_BIN, PATH or /usr/lib/postgresql/*/bin (install Debian's postgresql)")
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// start runs initdb and postgres; the caller is c.once.
func (c *Cluster) start() error {
	bin, err := Bin()
	if err != nil {
		c.missing = true
		return err
	}
	cred, err := credential()
	if err != nil {
		return err
	}
	// os.MkdirTemp, not t.TempDir: the unprivileged user must reach the
	// folder, and a short path keeps the socket's under the 107-byte limit.
	dir, err := os.MkdirTemp("", "agentry-pg-")
	if err != nil {
		return fmt.Errorf("temporary folder: %w", err)
	}
	c.dir = dir
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("give the cluster folder to uid %d: %w", cred.Uid, err)
		}
	}
	c.bin, c.cred = bin, cred
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Env = env()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	var lastErr error
	for range 5 { // a port taken between choosing and binding: choose another
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		if lastErr = c.run(bin, data, port, cred); lastErr == nil {
			return nil
		}
	}
	os.RemoveAll(dir)
	return lastErr
}

// run starts postgres on port and waits for it to accept connections.
func (c *Cluster) run(bin, data string, port int, cred *syscall.Credential) error {
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", c.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=on",
		"-c", "shared_buffers=32MB", "-c", "max_connections=300",
		"-c", "lc_messages=C",
		"-c", "log_line_prefix=", "-c", "logging_collector=off"}
	logs := &tail{max: 60}
	started := make(chan error, 1)
	ready := make(chan struct{})
	exited := make(chan struct{})
	// The process starts on a goroutine that holds its OS thread for the
	// server's life: Pdeathsig fires when the starting thread ends, so
	// postgres dies with the test binary, even a killed one, and not before.
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
		cmd.Env = env()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			started <- err
			return
		}
		cmd.Stdout = nil
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		c.proc = cmd.Process
		started <- nil
		logs.scan(stderr, "database system is ready to accept connections", ready)
		cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	select {
	case <-ready:
	case <-exited:
		c.proc = nil
		return fmt.Errorf("postgres exited before accepting connections:\n%s", logs)
	case <-time.After(60 * time.Second):
		c.proc.Kill()
		<-exited
		c.proc = nil
		return fmt.Errorf("postgres not ready within 60 s:\n%s", logs)
	}
	c.port, c.exited, c.logs = port, exited, logs
	conn, err := pgx.Connect(context.Background(), c.url("postgres"))
	if err != nil {
		c.stop()
		return fmt.Errorf("connect to the scratch cluster: %w", err)
	}
	c.admin = conn
	return nil
}

// credential is the unprivileged user to run PostgreSQL as when this
// process is root, or nil.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := os.Getenv("AGENTRY_PG_USER")
	if name == "" {
		name = "nobody"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs an unprivileged user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %s: uid %q gid %q", name, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// env is the environment of initdb and postgres: this process's, without
// the variables libpq and the server would read.
func env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LC_ALL=C")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("choose a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail keeps the last lines the server logged, for error messages.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

// scan reads r to its end, closing ready once a line contains mark.
func (l *tail) scan(r io.Reader, mark string, ready chan struct{}) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), 1<<20)
	signalled := false
	for s.Scan() {
		line := s.Text()
		l.mu.Lock()
		l.lines = append(l.lines, line)
		if len(l.lines) > l.max {
			l.lines = l.lines[len(l.lines)-l.max:]
		}
		l.mu.Unlock()
		if !signalled && strings.Contains(line, mark) {
			signalled = true
			close(ready)
		}
	}
	io.Copy(io.Discard, r)
}

func (l *tail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
