package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/seccomp"
)

// seccompExec runs `nook-agent seccomp-exec FILTER -- ARGV...` (args are
// what follows seccomp-exec): it installs the filter, then execs ARGV, or
// returns ARGV when ARGV is the agent itself, to go on as the agent in
// this process. It never returns without the filter in place: any
// failure ends the process.
func seccompExec(args []string) []string {
	if len(args) < 3 || args[1] != "--" {
		fail("usage: nook-agent %s FILTER -- COMMAND [ARGS...]", agentwire.SeccompExecCmd)
	}
	filter, argv := args[0], args[2:]
	if err := seccomp.InstallFile(filter); err != nil {
		fail("%v", err)
	}
	if argv[0] == agentwire.AgentPath {
		return argv
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "nook-agent: %v\n", err)
		os.Exit(127) // as a shell does for a command it cannot find
	}
	err = syscall.Exec(path, argv, os.Environ())
	fail("exec %s: %v", argv[0], err)
	return nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nook-agent: "+format+"\n", args...)
	os.Exit(126)
}
