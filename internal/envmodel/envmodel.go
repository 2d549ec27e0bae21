// Package envmodel is nook's one model of where a process's environment
// comes from. Both seeds (CubeSandbox and Cloudflare Sandbox 1.0) answer the
// question "which variables does each way of running code see?"; this
// package names the layers once and derives every path's environment from
// them with pure functions. It has no dependencies, so that nook serve, the
// in-sandbox agent and the code interpreter can all import it.
//
// The layers:
//
//  1. Image env: the OCI image's Env plus the template's --env (template
//     build envs). It is the environment of the sandbox's PID 1.
//  2. Sandbox env: Sandbox.create(envs) (E2B face, held by the agent since
//     /init) or the names stored by setEnvVars (native face, held in nook
//     serve's memory only).
//  3. Launch env: one call's envs/env. On the native face a nil value
//     removes that name for this launch only.
//
// The paths (later layers win):
//
//	path                          image  sandbox  launch  fixed
//	envd commands.run / PTY       opt-in yes      yes     PATH, HOME/USER/LOGNAME
//	native exec                   yes    yes      yes     -
//	native createTerminal         yes    no       yes     TERM=xterm-256color
//	run_code                      yes    opt-in   yes     -
//	OCI exec (nook exec)          yes    no       n/a     -
//	main process / services       yes    no       n/a     -
package envmodel

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// DefaultPath is the PATH a process gets when its base layer has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// TerminalTerm is the TERM every native terminal starts with.
const TerminalTerm = "xterm-256color"

// Layer names, for documentation and error messages.
const (
	LayerImage   = "image"
	LayerSandbox = "sandbox"
	LayerLaunch  = "launch"
)

// Path names every way of running code in a sandbox.
type Path string

// The paths.
const (
	PathEnvd     Path = "envd"     // E2B commands.run and PTY, through the agent
	PathExec     Path = "exec"     // native exec (Cloudflare face)
	PathTerminal Path = "terminal" // native createTerminal
	PathRunCode  Path = "run_code" // code interpreter executions
	PathOCIExec  Path = "oci_exec" // nook exec (runc exec)
	PathMain     Path = "main"     // the template's start command and its services
)

// Env is a set of variables by name.
type Env map[string]string

// Launch is one call's env: a nil value removes the name for this launch.
type Launch map[string]*string

// User is the target user of an envd process (HOME/USER/LOGNAME).
type User struct {
	Name string
	Home string
}

// Options are the two opt-ins of the CubeSandbox table, both off by default.
type Options struct {
	// EnvdInheritImage lets envd commands and PTYs see the image env
	// (template option; off: the seed's "not available").
	EnvdInheritImage bool
	// RunCodeInheritSandbox lets run_code see the sandbox env
	// (the seed's run-code env inheritance option).
	RunCodeInheritSandbox bool
}

// ErrInvalidName is returned for a name that is empty or contains '=' or NUL.
var ErrInvalidName = errors.New("invalid environment variable name")

// ValidateName checks one variable name: non-empty, no '=' and no NUL.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: name is empty", ErrInvalidName)
	}
	if strings.ContainsAny(name, "=\x00") {
		return fmt.Errorf("%w %q: contains '=' or NUL", ErrInvalidName, name)
	}
	return nil
}

// ValidateValue checks one value: no NUL (it could not reach execve).
func ValidateValue(name, value string) error {
	if strings.ContainsRune(value, 0) {
		return fmt.Errorf("%w: value of %q contains NUL", ErrInvalidName, name)
	}
	return nil
}

// Validate checks every name and value of e.
func Validate(e Env) error {
	for _, k := range sortedKeys(e) {
		if err := ValidateName(k); err != nil {
			return err
		}
		if err := ValidateValue(k, e[k]); err != nil {
			return err
		}
	}
	return nil
}

// ValidateLaunch checks every name and (non-nil) value of l.
func ValidateLaunch(l Launch) error {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := ValidateName(k); err != nil {
			return err
		}
		if v := l[k]; v != nil {
			if err := ValidateValue(k, *v); err != nil {
				return err
			}
		}
	}
	return nil
}

// Parse turns a KEY=VALUE list (an OCI Env) into an Env; malformed entries
// are skipped and a later entry wins.
func Parse(list []string) Env {
	e := Env{}
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		e[k] = v
	}
	return e
}

// List turns an Env into a KEY=VALUE list sorted by name.
func (e Env) List() []string {
	out := make([]string, 0, len(e))
	for _, k := range sortedKeys(e) {
		out = append(out, k+"="+e[k])
	}
	return out
}

func sortedKeys(e Env) []string {
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// overlay copies every non-empty name of src over dst.
func overlay(dst, src Env) {
	for k, v := range src {
		if k != "" {
			dst[k] = v
		}
	}
}

// apply copies a launch env over dst: set values win, nil values remove.
func apply(dst Env, l Launch) {
	for k, v := range l {
		if k == "" {
			continue
		}
		if v == nil {
			delete(dst, k)
		} else {
			dst[k] = *v
		}
	}
}

// Image is the image env as the container runtime hands it to PID 1: the
// template's Env, with PATH defaulted when the image sets none and HOME set
// to home when given and the image sets none (as runc does for the user).
func Image(templateEnv []string, home string) Env {
	e := Parse(templateEnv)
	if _, ok := e["PATH"]; !ok {
		e["PATH"] = DefaultPath
	}
	if _, ok := e["HOME"]; !ok && home != "" {
		e["HOME"] = home
	}
	return e
}

// Envd is the environment of an envd commands.run or PTY process: PATH from
// the image env (the image env whole when opts.EnvdInheritImage), then
// HOME/USER/LOGNAME of the user, then the sandbox env, then the call's envs
// (the call wins). The image env is otherwise not visible: envd does not
// inherit the OCI process environment.
func Envd(image Env, u *User, sandbox, call Env, opts Options) Env {
	e := Env{}
	if opts.EnvdInheritImage {
		overlay(e, image)
	} else if p, ok := image["PATH"]; ok {
		e["PATH"] = p
	}
	if _, ok := e["PATH"]; !ok {
		e["PATH"] = DefaultPath
	}
	if u != nil {
		e["HOME"] = u.Home
		e["USER"] = u.Name
		e["LOGNAME"] = u.Name
	}
	overlay(e, sandbox)
	overlay(e, call)
	return e
}

// Exec is the environment of a native exec(): the image env, then the
// names stored by setEnvVars, then the launch env (nil removes the name for
// this launch only). The inputs are not modified.
func Exec(image, stored Env, launch Launch) Env {
	e := Env{}
	overlay(e, image)
	overlay(e, stored)
	apply(e, launch)
	return e
}

// Terminal is the environment of a native createTerminal(): the image env,
// TERM=xterm-256color, then the launch env. Stored setEnvVars names are not
// merged.
func Terminal(image Env, launch Launch) Env {
	e := Env{}
	overlay(e, image)
	e["TERM"] = TerminalTerm
	apply(e, launch)
	return e
}

// RunCode is the environment one run_code execution sees: the image env
// (the kernel's own environment), the sandbox env only when
// opts.RunCodeInheritSandbox, then that execution's envs (this execution
// only).
func RunCode(image, sandbox, execution Env, opts Options) Env {
	e := Env{}
	overlay(e, image)
	if opts.RunCodeInheritSandbox {
		overlay(e, sandbox)
	}
	overlay(e, execution)
	return e
}

// OCIExec is the environment of nook exec (runc exec into the sandbox's
// namespaces): the image env only. Sandbox env and stored names never reach it.
func OCIExec(image Env) Env {
	e := Env{}
	overlay(e, image)
	return e
}

// Main is the environment of the sandbox's main process (the template's
// start command) and the services it starts: the image env only.
func Main(image Env) Env {
	e := Env{}
	overlay(e, image)
	return e
}

// Sources says, for one path, which layers it sees (the visibility tables).
type Sources struct {
	Image, Sandbox, Launch bool
}

// Visibility answers the visibility tables: which layers path sees under opts.
func Visibility(p Path, opts Options) Sources {
	switch p {
	case PathEnvd:
		return Sources{Image: opts.EnvdInheritImage, Sandbox: true, Launch: true}
	case PathExec:
		return Sources{Image: true, Sandbox: true, Launch: true}
	case PathTerminal:
		return Sources{Image: true, Launch: true}
	case PathRunCode:
		return Sources{Image: true, Sandbox: opts.RunCodeInheritSandbox, Launch: true}
	case PathOCIExec, PathMain:
		return Sources{Image: true}
	}
	return Sources{}
}
