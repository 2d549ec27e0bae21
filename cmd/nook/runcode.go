package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func runCodeCmd() *cobra.Command {
	var (
		cf                          clientFlags
		language, contextID, outDir string
		envs                        []string
		timeout                     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run-code ID [FILE]",
		Short: "Run a code cell in a sandbox's code interpreter (run_code), streaming its output",
		Long: `Run a code cell in a sandbox's code interpreter (templates with one, such as
code-interpreter-v1), the way the code-interpreter SDK's runCode does. The code
comes from FILE, or from stdin without one (or with "-"). stdout and stderr
stream as they come; results print as text, and images (PNG, JPEG, SVG, PDF)
are saved to files in --out-dir whose paths are printed. An error in the cell
prints its traceback and makes nook exit with 1.

Languages: python (the default, a Jupyter kernel), javascript (Node) and bash.
Without --context the cell runs in the language's default context, whose
state persists between runs.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			if language != "" && contextID != "" {
				return fmt.Errorf("give --language or --context, not both")
			}
			env, err := keyValues("env", envs)
			if err != nil {
				return err
			}
			var code []byte
			if len(args) == 2 && args[1] != "-" {
				code, err = os.ReadFile(args[1])
			} else {
				code, err = io.ReadAll(os.Stdin)
			}
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			body, _ := json.Marshal(map[string]any{"code": string(code), "context_id": contextID, "language": language, "env_vars": env})
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel func()
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cf.sandboxURL, "/")+"/execute", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", "49999")
			if sb.EnvdAccessToken != "" {
				req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("run-code: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
				var e struct{ Message string }
				if json.Unmarshal(b, &e) == nil && e.Message != "" {
					return fmt.Errorf("run-code: %s (HTTP %d)", e.Message, resp.StatusCode)
				}
				if resp.StatusCode == http.StatusBadGateway {
					return fmt.Errorf("run-code: sandbox %s has no code interpreter on port 49999 (HTTP 502): %s", sb.SandboxID, strings.TrimSpace(string(b)))
				}
				return fmt.Errorf("run-code: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
			}
			failed, err := printExecution(resp.Body, outDir, sb.SandboxID)
			if err != nil && ctx.Err() != nil && timeout > 0 {
				return fmt.Errorf("run-code: the cell ran longer than %s and was interrupted (its context keeps its state)", timeout)
			}
			if err != nil {
				return err
			}
			if failed {
				return exitCode(1)
			}
			return nil
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.StringVarP(&language, "language", "l", "", "language of the cell: python (default), javascript or bash")
	f.StringVarP(&contextID, "context", "c", "", "context id to run in (see the code-interpreter SDK's createCodeContext)")
	f.StringArrayVarP(&envs, "env", "e", nil, "KEY=VALUE set for this cell only (repeatable)")
	f.StringVar(&outDir, "out-dir", ".", "directory images are saved in")
	f.DurationVar(&timeout, "timeout", 0, "interrupt the cell after this long (0: no limit)")
	return cmd
}

// printExecution prints an /execute NDJSON stream; it reports whether the
// cell raised an error.
func printExecution(r io.Reader, outDir, id string) (bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 512<<20)
	failed, ended, images := false, false, 0
	stamp := time.Now().Format("20060102-150405")
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		str := func(k string) string { s, _ := ev[k].(string); return s }
		switch ev["type"] {
		case "stdout":
			fmt.Fprint(os.Stdout, str("text"))
		case "stderr":
			fmt.Fprint(os.Stderr, str("text"))
		case "result":
			saved := 0
			for _, f := range []struct{ field, ext string }{{"png", "png"}, {"jpeg", "jpg"}, {"svg", "svg"}, {"pdf", "pdf"}} {
				v := str(f.field)
				if v == "" {
					continue
				}
				data := []byte(v)
				if f.field != "svg" {
					var err error
					if data, err = base64.StdEncoding.DecodeString(v); err != nil {
						return failed, fmt.Errorf("decoding a %s result: %w", f.field, err)
					}
				}
				images++
				saved++
				path := filepath.Join(outDir, fmt.Sprintf("nook-%s-%s-%d.%s", id, stamp, images, f.ext))
				if err := os.WriteFile(path, data, 0o644); err != nil {
					return failed, err
				}
				fmt.Fprintf(os.Stdout, "[%s saved to %s]\n", f.field, path)
			}
			if t := str("text"); t != "" && (ev["is_main_result"] == true || saved == 0) {
				fmt.Fprintln(os.Stdout, t)
			}
		case "error":
			failed = true
			if tb := str("traceback"); tb != "" {
				fmt.Fprintln(os.Stderr, tb)
			} else {
				fmt.Fprintf(os.Stderr, "%s: %s\n", str("name"), str("value"))
			}
		case "end_of_execution":
			ended = true
		}
	}
	if err := sc.Err(); err != nil {
		return failed, fmt.Errorf("reading the execution: %w", err)
	}
	if !ended {
		return failed, fmt.Errorf("the execution ended before its end (timed out or the sandbox went away)")
	}
	return failed, nil
}
