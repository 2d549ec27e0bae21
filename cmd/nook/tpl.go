package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/client"
)

// tplBody is the API's view of a template (see internal/api/templates.go).
type tplBody struct {
	TemplateID   string   `json:"templateID"`
	BuildID      string   `json:"buildID"`
	Aliases      []string `json:"aliases"`
	State        string   `json:"state"`
	Reason       string   `json:"reason,omitempty"`
	Source       string   `json:"source,omitempty"`
	CPUMillis    int64    `json:"cpuMillis"`
	MemoryMB     int64    `json:"memoryMB"`
	DiskSizeMB   int64    `json:"diskSizeMB"`
	Layers       int      `json:"layers"`
	Env          []string `json:"env"`
	Cmd          []string `json:"cmd,omitempty"`
	WorkingDir   string   `json:"workingDir,omitempty"`
	User         string   `json:"user,omitempty"`
	ExposedPorts []int    `json:"exposedPorts,omitempty"`
	ProbePort    int      `json:"probePort,omitempty"`
	ProbePath    string   `json:"probePath,omitempty"`
	// Default egress policy and env opt-ins.
	AllowInternetAccess      bool        `json:"allowInternetAccess"`
	AllowOut                 []string    `json:"allowOut,omitempty"`
	DenyOut                  []string    `json:"denyOut,omitempty"`
	EnvdInheritImageEnv      bool        `json:"envdInheritImageEnv"`
	RunCodeInheritSandboxEnv bool        `json:"runCodeInheritSandboxEnv"`
	CodeInterpreter          bool        `json:"codeInterpreter"`
	CreatedAt                time.Time   `json:"createdAt"`
	UpdatedAt                time.Time   `json:"updatedAt"`
	Builds                   []buildBody `json:"builds,omitempty"`
}

type buildBody struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	State      string     `json:"state"`
	Reason     string     `json:"reason,omitempty"`
	Step       string     `json:"step,omitempty"`
	Layers     int        `json:"layers"`
	LayersDone int        `json:"layersDone"`
	Bytes      int64      `json:"bytes"`
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	Logs       []string   `json:"logs,omitempty"`
}

type createAnswer struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Aliases    []string `json:"aliases"`
	State      string   `json:"state"`
}

// buildFlags are the template settings create-from-image and build share.
type buildFlags struct {
	alias, writableLayerSize, probePath string
	cpu, memory                         int64
	probe, probeTimeout                 int
	exposePorts                         []int
	envs, dns                           []string
	detach, asJSON                      bool
	// The template's default egress policy and env opt-ins.
	allowInternet                          bool
	allowOutCIDRs, denyOutCIDRs            []string
	envdInheritImageEnv, runCodeInheritEnv bool
}

func (b *buildFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&b.alias, "alias", "", "alias to name the template by (a-z, 0-9, '-', '_'); an existing alias rebuilds that template")
	f.StringVar(&b.writableLayerSize, "writable-layer-size", "", "size of each sandbox's writable layer, e.g. 1G (default 1G)")
	f.IntSliceVar(&b.exposePorts, "expose-port", nil, "port the template serves (repeatable)")
	f.IntVar(&b.probe, "probe", 0, "port whose HTTP GET must answer 2xx before the template is READY and before each sandbox create answers")
	f.StringVar(&b.probePath, "probe-path", "/health", "path of the probe's HTTP GET")
	f.IntVar(&b.probeTimeout, "probe-timeout", 0, "seconds the probe may take (default 30)")
	f.Int64Var(&b.cpu, "cpu", 0, "CPU limit in millicores (default 2000)")
	f.Int64Var(&b.memory, "memory", 0, "memory limit in MB (default 2000)")
	f.StringArrayVar(&b.envs, "env", nil, "environment variable KEY=VALUE merged over the image's (repeatable)")
	f.StringArrayVar(&b.dns, "dns", nil, "DNS server for the template's sandboxes (repeatable)")
	f.BoolVar(&b.detach, "detach", false, "return once the build has started instead of following it")
	f.BoolVar(&b.asJSON, "json", false, "print JSON")
	f.BoolVar(&b.allowInternet, "allow-internet-access", true, "the template's sandboxes have internet access unless their create says otherwise")
	f.StringArrayVar(&b.allowOutCIDRs, "allow-out-cidr", nil, "CIDR or IP the template's sandboxes may always reach, even without internet access (repeatable)")
	f.StringArrayVar(&b.denyOutCIDRs, "deny-out-cidr", nil, "CIDR or IP the template's sandboxes may not reach (repeatable; --allow-out-cidr wins)")
	f.BoolVar(&b.envdInheritImageEnv, "envd-inherit-image-env", false, "commands.run and PTYs also see the image env (off: the CubeSandbox table as written)")
	f.BoolVar(&b.runCodeInheritEnv, "run-code-inherit-env", false, "run_code also sees the sandbox env from create (templates with a code interpreter)")
}

func (b *buildFlags) request() (map[string]any, error) {
	for _, kv := range b.envs {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
	}
	req := map[string]any{"alias": b.alias, "writableLayerSize": b.writableLayerSize, "exposePorts": b.exposePorts,
		"cpuMillis": b.cpu, "memoryMB": b.memory, "env": b.envs, "dns": b.dns, "probeTimeoutSeconds": b.probeTimeout}
	if b.probe > 0 {
		req["probePort"], req["probePath"] = b.probe, b.probePath
	}
	if !b.allowInternet {
		req["allowInternetAccess"] = false
	}
	req["allowOut"], req["denyOut"] = b.allowOutCIDRs, b.denyOutCIDRs
	req["envdInheritImageEnv"], req["runCodeInheritSandboxEnv"] = b.envdInheritImageEnv, b.runCodeInheritEnv
	return req, nil
}

func tplCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "tpl", Aliases: []string{"template"}, Short: "Create, build, list, inspect and delete templates"}
	cf.add(cmd)
	cmd.AddCommand(tplCreateCmd(&cf), tplBuildCmd(&cf), tplListCmd(&cf), tplInfoCmd(&cf), tplDeleteCmd(&cf),
		tplStatusCmd(&cf), tplWatchCmd(&cf))
	return cmd
}

func tplCreateCmd(cf *clientFlags) *cobra.Command {
	var (
		bf                  buildFlags
		img, user, password string
		cmdFlag             string
		args                []string
	)
	cmd := &cobra.Command{
		Use:   "create-from-image --image REF [flags]",
		Short: "Make a template from an OCI image",
		Long: `Make a template from an OCI image. REF is a registry reference (docker.io/library/alpine:3.20;
credentials from --registry-username/--registry-password, else ~/.docker/config.json, else
anonymous), oci-layout:DIR, oci-archive:FILE or docker-archive:FILE (paths on the server).
A multi-arch image resolves to linux/amd64. The build goes PULLING -> BUILDING -> READY or FAILED;
without --detach nook follows it and exits non-zero when it fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if img == "" {
				return fmt.Errorf("--image is required")
			}
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			req, err := bf.request()
			if err != nil {
				return err
			}
			if ref := img; strings.HasPrefix(ref, "oci-layout:") || strings.HasPrefix(ref, "oci-archive:") || strings.HasPrefix(ref, "docker-archive:") {
				prefix, p, _ := strings.Cut(ref, ":")
				if abs, err := filepath.Abs(p); err == nil {
					img = prefix + ":" + abs
				}
			}
			req["image"], req["registryUsername"], req["registryPassword"] = img, user, password
			if cmdFlag != "" {
				req["cmd"] = strings.Fields(cmdFlag)
			}
			req["args"] = args
			var ans createAnswer
			if _, err := c.Do(cmd.Context(), http.MethodPost, "/templates", req, &ans); err != nil {
				return err
			}
			return followBuild(cmd.Context(), c, ans, bf)
		},
	}
	bf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&img, "image", "", "image source (see above)")
	f.StringVar(&user, "registry-username", "", "registry user name")
	f.StringVar(&password, "registry-password", "", "registry password or token")
	f.StringVar(&cmdFlag, "cmd", "", "start command replacing the image's entrypoint and command (split on spaces)")
	f.StringArrayVar(&args, "arg", nil, "argument replacing the image's command (repeatable)")
	return cmd
}

func tplBuildCmd(cf *clientFlags) *cobra.Command {
	var (
		bf        buildFlags
		file      string
		buildArgs []string
		noCache   bool
	)
	cmd := &cobra.Command{
		Use:   "build [-f Dockerfile] [--alias NAME] [CONTEXT]",
		Short: "Build a template from a Dockerfile (no Docker daemon needed)",
		Long: `Build a template from a Dockerfile. CONTEXT (default ".") is uploaded to nook serve; RUN steps
run in nook's own runtime (with the host's network). Supported: FROM (an image source or a
template), RUN, ENV, ARG, COPY, WORKDIR, USER, CMD, ENTRYPOINT, EXPOSE, LABEL. Each step is cached
by its content; --no-cache rebuilds every step.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			if file == "" {
				file = filepath.Join(dir, "Dockerfile")
			}
			text, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return fmt.Errorf("build context %s is not a directory", dir)
			}
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			req, err := bf.request()
			if err != nil {
				return err
			}
			ba, err := keyValues("build-arg", buildArgs)
			if err != nil {
				return err
			}
			req["dockerfile"], req["buildArgs"], req["noCache"] = string(text), ba, noCache
			ans, err := uploadBuild(cmd.Context(), c, req, dir)
			if err != nil {
				return err
			}
			return followBuild(cmd.Context(), c, ans, bf)
		},
	}
	bf.add(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "Dockerfile (default CONTEXT/Dockerfile)")
	cmd.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "ARG value KEY=VALUE (repeatable)")
	cmd.Flags().BoolVar(&noCache, "no-cache", false, "do not use cached steps")
	return cmd
}

// uploadBuild posts a Dockerfile build with its context as a tar.
func uploadBuild(ctx context.Context, c *client.Client, req map[string]any, dir string) (createAnswer, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := func() error {
			part, err := mw.CreateFormField("request")
			if err != nil {
				return err
			}
			if err := json.NewEncoder(part).Encode(req); err != nil {
				return err
			}
			part, err = mw.CreateFormFile("context", "context.tar")
			if err != nil {
				return err
			}
			if err := tarContext(dir, part); err != nil {
				return err
			}
			return mw.Close()
		}()
		pw.CloseWithError(err)
	}()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.APIURL, "/")+"/templates", pr)
	if err != nil {
		return createAnswer{}, err
	}
	hreq.Header.Set("X-API-Key", c.APIKey)
	hreq.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return createAnswer{}, fmt.Errorf("cannot reach nook at %s: %w", c.APIURL, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		var e struct{ Message string }
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(data))
		}
		return createAnswer{}, &client.Error{Status: resp.StatusCode, Message: e.Message}
	}
	var ans createAnswer
	return ans, json.Unmarshal(data, &ans)
}

// tarContext writes dir as a tar (regular files, directories, symlinks).
func tarContext(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = filepath.ToSlash(rel), 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// followBuild prints a build's progress until it ends (unless detached).
func followBuild(ctx context.Context, c *client.Client, ans createAnswer, bf buildFlags) error {
	if bf.detach {
		if bf.asJSON {
			return printJSON(ans)
		}
		fmt.Printf("template %s build %s started (nook tpl watch %s)\n", ans.TemplateID, ans.BuildID, ans.TemplateID)
		return nil
	}
	if !bf.asJSON {
		fmt.Fprintf(os.Stderr, "template %s build %s\n", ans.TemplateID, ans.BuildID)
	}
	bd, err := watchBuild(ctx, c, ans.TemplateID, ans.BuildID, !bf.asJSON)
	if err != nil {
		return err
	}
	if bf.asJSON {
		var t tplBody
		if _, err := c.Do(ctx, http.MethodGet, "/templates/"+url.PathEscape(ans.TemplateID), nil, &t); err != nil {
			return err
		}
		if err := printJSON(t); err != nil {
			return err
		}
	} else if bd.State == "READY" {
		fmt.Println(ans.TemplateID)
	}
	if bd.State != "READY" {
		return fmt.Errorf("build %s FAILED: %s", bd.BuildID, bd.Reason)
	}
	return nil
}

// watchBuild polls a build, printing its log lines and progress to stderr
// when verbose, until it is READY or FAILED.
func watchBuild(ctx context.Context, c *client.Client, templateID, buildID string, verbose bool) (buildBody, error) {
	off := 0
	lastStep := ""
	for {
		var bd buildBody
		path := fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", url.PathEscape(templateID), url.PathEscape(buildID), off)
		if _, err := c.Do(ctx, http.MethodGet, path, nil, &bd); err != nil {
			return bd, err
		}
		off += len(bd.Logs)
		if verbose {
			for _, l := range bd.Logs {
				fmt.Fprintln(os.Stderr, l)
			}
			step := fmt.Sprintf("%s %s", bd.State, bd.Step)
			if bd.Layers > 0 {
				step += fmt.Sprintf(" [layers %d/%d, %s]", bd.LayersDone, bd.Layers, human(bd.Bytes))
			}
			if step != lastStep && bd.State != "READY" && bd.State != "FAILED" {
				fmt.Fprintf(os.Stderr, "  %s\n", step)
				lastStep = step
			}
		}
		if bd.State == "READY" || bd.State == "FAILED" {
			return bd, nil
		}
		select {
		case <-ctx.Done():
			return bd, ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func human(n int64) string {
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

func tplListCmd(cf *clientFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List templates", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			var list []tplBody
			if _, err := c.Do(cmd.Context(), http.MethodGet, "/templates", nil, &list); err != nil {
				return err
			}
			sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.Before(list[j].CreatedAt) })
			if asJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tALIASES\tSTATE\tCPU\tMEMORY\tDISK\tSOURCE\tCREATED")
			for _, t := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dm\t%dMB\t%dMB\t%s\t%s\n", t.TemplateID, strings.Join(t.Aliases, ","), t.State,
					t.CPUMillis, t.MemoryMB, t.DiskSizeMB, t.Source, t.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func tplInfoCmd(cf *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use: "info ID|ALIAS", Short: "Show a template's details and builds as JSON", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			var t json.RawMessage
			if _, err := c.Do(cmd.Context(), http.MethodGet, "/templates/"+url.PathEscape(args[0]), nil, &t); err != nil {
				return err
			}
			return printJSON(t)
		},
	}
}

func tplDeleteCmd(cf *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use: "delete ID|ALIAS...", Aliases: []string{"rm"}, Short: "Delete templates no running sandbox uses", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			for _, id := range args {
				if _, err := c.Do(cmd.Context(), http.MethodDelete, "/templates/"+url.PathEscape(id), nil, nil); err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
			}
			return nil
		},
	}
}

// latestBuild resolves a template's build (its latest unless given).
func latestBuild(ctx context.Context, c *client.Client, id, build string) (string, string, error) {
	var t tplBody
	if _, err := c.Do(ctx, http.MethodGet, "/templates/"+url.PathEscape(id), nil, &t); err != nil {
		return "", "", err
	}
	if build == "" {
		build = t.BuildID
	}
	if build == "" {
		return "", "", fmt.Errorf("template %s has no builds (a built-in template)", t.TemplateID)
	}
	return t.TemplateID, build, nil
}

func tplStatusCmd(cf *clientFlags) *cobra.Command {
	var build string
	var asJSON bool
	cmd := &cobra.Command{
		Use: "status ID|ALIAS", Short: "Show the state of a template's build", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			id, bid, err := latestBuild(cmd.Context(), c, args[0], build)
			if err != nil {
				return err
			}
			var bd buildBody
			path := fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=1000000000", url.PathEscape(id), url.PathEscape(bid))
			if _, err := c.Do(cmd.Context(), http.MethodGet, path, nil, &bd); err != nil {
				return err
			}
			bd.Logs = nil
			if asJSON {
				return printJSON(bd)
			}
			fmt.Printf("template %s build %s: %s", id, bid, bd.State)
			if bd.Step != "" {
				fmt.Printf(" (%s)", bd.Step)
			}
			if bd.Layers > 0 {
				fmt.Printf(" layers %d/%d, %s", bd.LayersDone, bd.Layers, human(bd.Bytes))
			}
			if bd.FinishedAt != nil {
				fmt.Printf(" in %s", bd.FinishedAt.Sub(bd.StartedAt).Round(time.Millisecond))
			}
			fmt.Println()
			if bd.Reason != "" {
				fmt.Println("reason:", bd.Reason)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&build, "build", "", "build id (default: the latest)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func tplWatchCmd(cf *clientFlags) *cobra.Command {
	var build string
	cmd := &cobra.Command{
		Use: "watch ID|ALIAS", Short: "Follow a template's build (logs, layers, bytes, phase) until it ends", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			id, bid, err := latestBuild(cmd.Context(), c, args[0], build)
			if err != nil {
				return err
			}
			bd, err := watchBuild(cmd.Context(), c, id, bid, true)
			if err != nil {
				return err
			}
			if bd.State != "READY" {
				return fmt.Errorf("build %s FAILED: %s", bid, bd.Reason)
			}
			fmt.Fprintf(os.Stderr, "template %s READY\n", id)
			return nil
		},
	}
	cmd.Flags().StringVar(&build, "build", "", "build id (default: the latest)")
	return cmd
}
