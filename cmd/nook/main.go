// Command nook runs the nook sandbox server (nook serve) and is the client
// of its API for every other verb.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	root := &cobra.Command{
		Use:           "nook",
		Short:         "Self-hosted sandboxes for running untrusted code (E2B-compatible)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), withNetworkVerb(withPauseVerbs(sandboxCmd())), benchCmd(), snapshotCmd())
	root.AddCommand(execCmd())
	root.AddCommand(tplCmd())
	root.AddCommand(runCodeCmd())
	if err := root.Execute(); err != nil {
		var exit exitCode
		if asExit(err, &exit) {
			os.Exit(int(exit))
		}
		fmt.Fprintln(os.Stderr, "nook:", err)
		os.Exit(1)
	}
}

// exitCode is an error that carries a process exit code (nook sandbox run
// passes the sandbox command's exit code through).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

func asExit(err error, out *exitCode) bool {
	e, ok := err.(exitCode)
	if ok {
		*out = e
	}
	return ok
}

// bindEnv lets NOOK_<FLAG_NAME> set every flag of fs not given on the
// command line (--api-key -> NOOK_API_KEY).
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		name := "NOOK_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && !f.Changed && err == nil {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s: %w", name, serr)
			}
		}
	})
	return err
}
