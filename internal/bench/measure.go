package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/client"
)

// interpPort is the code interpreter's port in a sandbox (run_code).
const interpPort = 49999

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// nativeTrue runs `true` through the native exec API (POST
// /v1/sandboxes/{id}/processes, then GET .../wait) and checks its exit.
func (o *Options) nativeTrue(ctx context.Context, sb client.Sandbox) error {
	var info struct {
		ID       string `json:"id"`
		State    string `json:"state"`
		ExitCode *int   `json:"exitCode"`
	}
	base := "/v1/sandboxes/" + url.PathEscape(sb.SandboxID) + "/processes"
	if _, err := o.API.Do(ctx, http.MethodPost, base, map[string]any{"command": []string{"true"}}, &info); err != nil {
		return err
	}
	if _, err := o.API.Do(ctx, http.MethodGet, base+"/"+url.PathEscape(info.ID)+"/wait?timeout=10000", nil, &info); err != nil {
		return err
	}
	if info.ExitCode == nil || *info.ExitCode != 0 {
		return fmt.Errorf("true ended %s (exit %v)", info.State, info.ExitCode)
	}
	return nil
}

// runCode1 runs "1+1" through the code interpreter (POST :49999/execute
// through the proxy, as the code-interpreter SDK does) and checks that the
// result is 2.
func (o *Options) runCode1(ctx context.Context, sb client.Sandbox) error {
	hc := o.Sandboxes.PortClient(sb, interpPort, "")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(o.Sandboxes.ProxyURL, "/")+"/execute",
		strings.NewReader(`{"code":"1+1"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("execute: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	got := false
	for sc.Scan() {
		var ev map[string]any
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch ev["type"] {
		case "result":
			got = fmt.Sprint(ev["text"]) == "2"
		case "error":
			return fmt.Errorf("run_code: %v: %v", ev["name"], ev["value"])
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !got {
		return fmt.Errorf("run_code of 1+1 gave no result 2")
	}
	return nil
}

// runCode measures warm run_code of 1+1 on a running code-interpreter
// sandbox, and create + first run_code, cold and from the pool.
func (o *Options) runCode(ctx context.Context) ([]Stat, error) {
	var out []Stat
	sb, err := o.API.Create(ctx, client.CreateRequest{TemplateID: o.InterpTemplate, Timeout: 600})
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", o.InterpTemplate, err)
	}
	defer o.API.Kill(context.WithoutCancel(ctx), sb.SandboxID)
	// The first cell may wait for the kernel to start: not part of "warm".
	if err := o.retryRunCode(ctx, sb); err != nil {
		return nil, err
	}
	st, err := o.repeat(ctx, NameRunCodeWarm, o.Runs, func() error { return o.runCode1(ctx, sb) })
	if err != nil {
		return nil, err
	}
	out = append(out, st)
	n := min(max(o.Creates, 1), 10)
	for _, pooled := range []bool{false, true} {
		name := NameRunCodeCold
		if pooled {
			name = NameRunCodePool
		}
		o.logf("%s: %d creates", name, n)
		var samples []time.Duration
		for i := 0; i < n; i++ {
			if pooled {
				o.waitPool(ctx, o.InterpTemplate)
			}
			t := time.Now()
			sb, err := o.API.Create(ctx, client.CreateRequest{TemplateID: o.InterpTemplate, Timeout: 120, NoPool: !pooled})
			if err == nil {
				err = o.retryRunCode(ctx, sb)
			}
			d := time.Since(t)
			if sb.SandboxID != "" {
				o.API.Kill(ctx, sb.SandboxID)
			}
			if err != nil {
				return out, fmt.Errorf("%s: %w", name, err)
			}
			samples = append(samples, d)
		}
		out = append(out, summarize(name, samples))
	}
	return out, nil
}

// retryRunCode runs 1+1 until the interpreter answers (it starts with the
// sandbox; until it listens the proxy answers 502).
func (o *Options) retryRunCode(ctx context.Context, sb client.Sandbox) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := o.runCode1(ctx, sb)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}
