package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/client"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/runtime/gvisor"
	"github.com/nookhq/nook/internal/runtime/runc"
	"github.com/nookhq/nook/internal/template"
)

// withPauseVerbs adds pause, resume, snapshot, rollback, clone and backup
// verbs to `nook sandbox`; they use its client flags.
func withPauseVerbs(sb *cobra.Command) *cobra.Command {
	var noMemory bool
	pause := &cobra.Command{
		Use: "pause ID...", Short: "Pause sandboxes: stop their processes, keep their files (and memory when the runtime can)", Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			for _, id := range args {
				start := time.Now()
				if _, err := cl.Do(cmd.Context(), http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", map[string]bool{"memory": !noMemory}, nil); err != nil {
					return fmt.Errorf("pause %s: %w", id, err)
				}
				var d struct {
					PauseMode string `json:"pauseMode"`
					PauseNote string `json:"pauseNote"`
				}
				cl.Do(cmd.Context(), http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &d)
				fmt.Printf("%s paused (%s) in %s\n", id, d.PauseMode, time.Since(start).Round(time.Millisecond))
				if d.PauseNote != "" {
					fmt.Fprintln(os.Stderr, "note:", d.PauseNote)
				}
			}
			return nil
		}),
	}
	pause.Flags().BoolVar(&noMemory, "no-memory", false, "keep the filesystem only (resume restarts the start command)")

	var resumeTimeout int64
	resume := &cobra.Command{
		Use: "resume ID...", Short: "Resume paused sandboxes", Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			for _, id := range args {
				start := time.Now()
				if _, err := cl.Do(cmd.Context(), http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/connect", map[string]int64{"timeout": resumeTimeout}, nil); err != nil {
					return fmt.Errorf("resume %s: %w", id, err)
				}
				fmt.Printf("%s running (took %s)\n", id, time.Since(start).Round(time.Millisecond))
			}
			return nil
		}),
	}
	resume.Flags().Int64Var(&resumeTimeout, "timeout", 300, "seconds until the resumed sandbox ends")

	var snapName string
	snapshot := &cobra.Command{
		Use: "snapshot ID", Short: "Snapshot a sandbox's filesystem into an image sandboxes can be created from (--template SNAPSHOT)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			var s map[string]any
			if _, err := cl.Do(cmd.Context(), http.MethodPost, "/v1/sandboxes/"+url.PathEscape(args[0])+"/snapshots", map[string]string{"name": snapName}, &s); err != nil {
				return err
			}
			fmt.Println(s["id"])
			return nil
		}),
	}
	snapshot.Flags().StringVar(&snapName, "name", "", "snapshot id (default: generated)")

	rollback := &cobra.Command{
		Use: "rollback ID SNAPSHOT", Short: "Roll a sandbox's filesystem back to a snapshot (the sandbox restarts)", Args: cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			_, err := cl.Do(cmd.Context(), http.MethodPost, "/v1/sandboxes/"+url.PathEscape(args[0])+"/rollback", map[string]string{"snapshotID": args[1]}, nil)
			return err
		}),
	}

	var cloneCount int
	var cloneTimeout int64
	clone := &cobra.Command{
		Use: "clone ID", Short: "Make new sandboxes with a copy of a sandbox's filesystem; prints their ids", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			var res []struct {
				Sandbox *struct {
					SandboxID string `json:"sandboxID"`
				} `json:"sandbox"`
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			body := map[string]int64{"count": int64(cloneCount), "timeout": cloneTimeout}
			if _, err := cl.Do(cmd.Context(), http.MethodPost, "/v1/sandboxes/"+url.PathEscape(args[0])+"/clone", body, &res); err != nil {
				return err
			}
			failed := 0
			for _, r := range res {
				if r.Sandbox != nil {
					fmt.Println(r.Sandbox.SandboxID)
				} else if r.Error != nil {
					failed++
					fmt.Fprintln(os.Stderr, "clone failed:", r.Error.Message)
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d clones failed", failed, len(res))
			}
			return nil
		}),
	}
	clone.Flags().IntVarP(&cloneCount, "count", "n", 1, "how many clones")
	clone.Flags().Int64Var(&cloneTimeout, "timeout", 300, "seconds until the clones end")

	var bDir, bName string
	var bTTL int64
	var bExcludes []string
	var bGitignore bool
	backup := &cobra.Command{
		Use: "backup ID", Short: "Archive a directory of a sandbox (prints the backup id)", Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			body := map[string]any{"dir": bDir, "name": bName, "excludes": bExcludes, "gitignore": bGitignore}
			if bTTL > 0 {
				body["ttl"] = bTTL
			}
			var b map[string]any
			if _, err := cl.Do(cmd.Context(), http.MethodPost, "/v1/sandboxes/"+url.PathEscape(args[0])+"/backups", body, &b); err != nil {
				return err
			}
			fmt.Println(b["id"])
			return nil
		}),
	}
	backup.Flags().StringVar(&bDir, "dir", "/home/user", "directory to archive")
	backup.Flags().StringVar(&bName, "name", "", "a name for the backup")
	backup.Flags().Int64Var(&bTTL, "ttl", 0, "seconds until the backup is deleted (0: kept)")
	backup.Flags().StringArrayVar(&bExcludes, "exclude", nil, "gitignore-style pattern to leave out (repeatable)")
	backup.Flags().BoolVar(&bGitignore, "gitignore", false, "also leave out what .gitignore files in the tree ignore")

	var rDir string
	restore := &cobra.Command{
		Use: "restore-backup ID BACKUP", Short: "Restore a backup into a sandbox (any sandbox, not only the one backed up)", Args: cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *client.Client, args []string) error {
			_, err := cl.Do(cmd.Context(), http.MethodPost, "/v1/sandboxes/"+url.PathEscape(args[0])+"/backups/"+url.PathEscape(args[1])+"/restore", map[string]string{"dir": rDir}, nil)
			return err
		}),
	}
	restore.Flags().StringVar(&rDir, "dir", "", "directory to restore into (default: the one backed up)")

	sb.AddCommand(pause, resume, snapshot, rollback, clone, backup, restore)
	return sb
}

// inheritedClient builds an API client from the persistent client flags
// of a parent command (nook sandbox's).
// withClient wraps a verb that needs the API client made from the
// `nook sandbox` flags.
func withClient(run func(cmd *cobra.Command, cl *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cl, err := inheritedClient(cmd)
		if err != nil {
			return err
		}
		return run(cmd, cl, args)
	}
}

func inheritedClient(cmd *cobra.Command) (*client.Client, error) {
	var cf clientFlags
	cf.apiURL, _ = cmd.Flags().GetString("api-url")
	cf.apiKey, _ = cmd.Flags().GetString("api-key")
	cf.sandboxURL, _ = cmd.Flags().GetString("sandbox-url")
	return cf.client(cmd)
}

func snapshotCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "snapshot", Aliases: []string{"snap"}, Short: "List, inspect and delete sandbox snapshots"}
	cf.add(cmd)
	var lsSandbox string
	var lsJSON bool
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List snapshots", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			var list []struct {
				ID         string    `json:"id"`
				SandboxID  string    `json:"sandboxID"`
				TemplateID string    `json:"templateID"`
				SizeBytes  int64     `json:"sizeBytes"`
				CreatedAt  time.Time `json:"createdAt"`
			}
			q := url.Values{}
			if lsSandbox != "" {
				q.Set("sandboxID", lsSandbox)
			}
			if _, err := c.Do(cmd.Context(), http.MethodGet, "/v1/snapshots?"+q.Encode(), nil, &list); err != nil {
				return err
			}
			if lsJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSANDBOX\tTEMPLATE\tSIZE\tCREATED")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.SandboxID, s.TemplateID, humanBytes(s.SizeBytes), s.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&lsSandbox, "sandbox", "", "only snapshots of this sandbox")
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")
	var verify bool
	info := &cobra.Command{
		Use: "info ID", Short: "Show a snapshot as JSON", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			var s map[string]any
			if _, err := c.Do(cmd.Context(), http.MethodGet, "/v1/snapshots/"+url.PathEscape(args[0])+"?verify="+strconv.FormatBool(verify), nil, &s); err != nil {
				return err
			}
			return printJSON(s)
		},
	}
	info.Flags().BoolVar(&verify, "verify", false, "recompute the snapshot's digest and fail when it does not match")
	rm := &cobra.Command{
		Use: "rm ID...", Aliases: []string{"delete"}, Short: "Delete snapshots no sandbox uses", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			for _, id := range args {
				if _, err := c.Do(cmd.Context(), http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil); err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
			}
			return nil
		},
	}
	cmd.AddCommand(ls, info, rm)
	return cmd
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// GvisorTemplate is the template nook serve adds when runsc is installed:
// base, run by gVisor, so that its sandboxes pause with their memory.
const GvisorTemplate = "base-gvisor"

// withGvisor returns the runtime sandboxes run with: runc, plus gVisor
// for templates whose runtime is "gvisor" when runsc is installed (then
// it also makes sure the base-gvisor template exists).
func withGvisor(rt *runc.Driver, dataDir string, templates *template.Registry, log *slog.Logger) runtime.Runtime {
	g, err := gvisor.New(dataDir)
	if err != nil {
		log.Info("gVisor runtime off: sandboxes pause without memory", "reason", err)
		return &runtime.Router{Default: rt}
	}
	g.Log = log.Warn
	if base, err := templates.Get(template.BaseID); err == nil && base.State == template.StateReady {
		cur, gerr := templates.Get(GvisorTemplate)
		if gerr != nil || cur.Runtime != gvisor.Name || !slices.Equal(cur.Layers, base.Layers) {
			t := base
			t.ID, t.Aliases, t.Runtime = GvisorTemplate, nil, gvisor.Name
			none := 0
			t.PoolSize = &none
			if err := templates.Put(t); err != nil {
				log.Warn("cannot add the base-gvisor template", "err", err)
			}
		}
	}
	return &runtime.Router{Default: rt, Others: map[string]runtime.Runtime{gvisor.Name: g}}
}
