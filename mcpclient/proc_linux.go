package mcpclient

import (
	"os/exec"
	"syscall"
)

// setProcAttr asks Linux to SIGKILL a stdio server when the node dies
// without closing it (a crash, SIGKILL), so that no orphan outlives the
// node. Close stops it the polite way first.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
