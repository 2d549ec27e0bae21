package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// ociExecRequest and ociExecMessage mirror internal/native's OCI exec
// WebSocket protocol.
type ociExecRequest struct {
	Command []string `json:"command"`
	TTY     bool     `json:"tty"`
	Stdin   bool     `json:"stdin"`
	Cwd     string   `json:"cwd,omitempty"`
	User    string   `json:"user,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	Term    string   `json:"term,omitempty"`
}

type ociExecMessage struct {
	Type     string `json:"type"`
	Message  string `json:"message,omitempty"`
	ExitCode int    `json:"exitCode"`
	Cols     uint16 `json:"cols,omitempty"`
	Rows     uint16 `json:"rows,omitempty"`
}

func execCmd() *cobra.Command {
	var (
		cf              clientFlags
		tty, stdin      bool
		workdir, asUser string
	)
	cmd := &cobra.Command{
		Use:   "exec [-t] [-i] [-w DIR] [-u USER] ID -- CMD [ARGS...]",
		Short: "Run a command in a sandbox's namespaces (OCI exec), not through its agent",
		Long: `Run a command inside a running sandbox the way 'docker exec' does: nook serve enters the
sandbox's namespaces with the OCI runtime (runc exec), bypassing the in-sandbox agent, so it works
even when the agent is wedged. The command sees the image environment only (image ENV and template
--env), never the sandbox's create envs. -t gives it a terminal, -i forwards stdin; with -it
nook puts your terminal in raw mode and follows its window size. nook exits with the command's
exit code.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			command := args[1:]
			if command[0] == "--" {
				command = command[1:]
			}
			if len(command) == 0 {
				return fmt.Errorf("a command is required after the sandbox id")
			}
			req := ociExecRequest{Command: command, TTY: tty, Stdin: stdin, Cwd: workdir, User: asUser}
			code, err := ociExec(cmd.Context(), c.APIURL, c.APIKey, args[0], req)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.BoolVarP(&tty, "tty", "t", false, "allocate a terminal")
	f.BoolVarP(&stdin, "interactive", "i", false, "forward stdin")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory (default: the image's)")
	f.StringVarP(&asUser, "user", "u", "", "user name, uid or uid:gid (default: root)")
	f.SetInterspersed(false)
	return cmd
}

// ociExec runs req in sandbox id over the API's OCI exec WebSocket and
// returns the command's exit code.
func ociExec(ctx context.Context, apiURL, apiKey, id string, req ociExecRequest) (int, error) {
	u := strings.TrimRight(apiURL, "/") + "/v1/sandboxes/" + url.PathEscape(id) + "/oci-exec"
	u = "ws" + strings.TrimPrefix(u, "http")
	h := http.Header{}
	h.Set("X-API-Key", apiKey)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.Body != nil {
			var e struct {
				Message string `json:"message"`
			}
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			if json.Unmarshal(data, &e) == nil && e.Message != "" {
				return 0, fmt.Errorf("%s (HTTP %d)", e.Message, resp.StatusCode)
			}
		}
		return 0, fmt.Errorf("cannot reach nook at %s: %w", apiURL, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(8 << 20)

	inFd := int(os.Stdin.Fd())
	outFd := int(os.Stdout.Fd())
	localTTY := req.TTY && term.IsTerminal(outFd)
	if req.TTY {
		req.Term = os.Getenv("TERM")
		if localTTY {
			if w, hgt, err := term.GetSize(outFd); err == nil {
				req.Cols, req.Rows = uint16(w), uint16(hgt)
			}
		}
	}
	start, _ := json.Marshal(req)
	if err := conn.Write(ctx, websocket.MessageText, start); err != nil {
		return 0, err
	}
	// Wait for "started" (or an error) before touching the local terminal.
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("exec: %w", err)
		}
		if typ != websocket.MessageText {
			continue
		}
		var m ociExecMessage
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		if m.Type == "error" {
			return 0, fmt.Errorf("exec: %s", m.Message)
		}
		if m.Type == "started" {
			break
		}
	}
	if req.TTY && req.Stdin && term.IsTerminal(inFd) {
		old, err := term.MakeRaw(inFd)
		if err == nil {
			defer term.Restore(inFd, old)
		}
	}
	var wmu sync.Mutex
	write := func(typ websocket.MessageType, b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, typ, b)
	}
	if localTTY {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, hgt, err := term.GetSize(outFd); err == nil {
					msg, _ := json.Marshal(ociExecMessage{Type: "resize", Cols: uint16(w), Rows: uint16(hgt)})
					_ = write(websocket.MessageText, msg)
				}
			}
		}()
	}
	if req.Stdin {
		go func() {
			buf := make([]byte, 32*1024)
			for {
				n, err := os.Stdin.Read(buf)
				if n > 0 {
					if write(websocket.MessageBinary, append([]byte(nil), buf[:n]...)) != nil {
						return
					}
				}
				if err != nil {
					msg, _ := json.Marshal(ociExecMessage{Type: "eof"})
					_ = write(websocket.MessageText, msg)
					return
				}
			}
		}()
	}
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("exec: connection ended before the command's exit code: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				continue
			}
			switch data[0] {
			case 2:
				os.Stderr.Write(data[1:])
			default:
				os.Stdout.Write(data[1:])
			}
			continue
		}
		var m ociExecMessage
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		switch m.Type {
		case "exit":
			conn.Close(websocket.StatusNormalClosure, "")
			return m.ExitCode, nil
		case "error":
			return 0, errors.New("exec: " + m.Message)
		}
	}
}
