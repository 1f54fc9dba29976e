//go:build !linux

package mcpclient

import "os/exec"

// setProcAttr does nothing off Linux: a stdio server is stopped by Close,
// and a node that crashes leaves it to exit when its stdin closes.
func setProcAttr(*exec.Cmd) {}
