package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/client"
	"github.com/nookhq/nook/internal/envdpb/process"
	"github.com/nookhq/nook/internal/envdpb/process/processconnect"
)

func runCmd(cf *clientFlags) *cobra.Command {
	var (
		user, cwd string
		envs      []string
	)
	cmd := &cobra.Command{
		Use:   "run ID -- CMD [ARGS...]",
		Short: "Run a command in a sandbox through its agent, streaming its output; exits with its exit code",
		Long: `Run a command in a sandbox the way the e2b SDK's commands.run does: through the
sandbox's agent, as /bin/bash -l -c "CMD ARGS..." (so it sees the sandbox env,
not the image env). Output streams as it comes; nook exits with the command's
exit code.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			env, err := keyValues("env", envs)
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			pc := (&client.Sandboxes{ProxyURL: cf.sandboxURL}).Process(sb, user)
			cfg := &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", strings.Join(args[1:], " ")}, Envs: env}
			if cwd != "" {
				cfg.Cwd = &cwd
			}
			code, err := streamProcess(cmd.Context(), pc, cfg)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user to run as (default: the sandbox's default user)")
	cmd.Flags().StringVarP(&cwd, "cwd", "w", "", "working directory (default: the user's home)")
	cmd.Flags().StringArrayVarP(&envs, "env", "e", nil, "environment variable KEY=VALUE for this command (repeatable)")
	return cmd
}

// streamProcess starts cfg and copies its output to stdout and stderr until
// it ends, returning its exit code.
func streamProcess(ctx context.Context, pc processconnect.ProcessClient, cfg *process.ProcessConfig) (int, error) {
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: cfg}))
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			os.Stdout.Write(d.GetStdout())
			os.Stderr.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			if end.Error != nil && *end.Error != "" {
				return int(end.GetExitCode()), fmt.Errorf("command failed: %s", *end.Error)
			}
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("the sandbox ended the stream without an exit code")
}
