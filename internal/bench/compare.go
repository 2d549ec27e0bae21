package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	nookrt "github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/runtime/runc"
)

func numCPU() int { return runtime.NumCPU() }

// compare times the floor implementations on the same root filesystem:
// runc run (overlay + tmpfs layer + container start of /bin/true, as nook's
// runtime driver does it) and a bare unshare of the same namespaces + exec.
func compare(ctx context.Context, o Options) []Stat {
	n := o.Creates
	var out []Stat
	dir, err := os.MkdirTemp("", "nook-bench-runc-")
	if err != nil {
		return []Stat{{Name: "runc run", Note: err.Error()}}
	}
	defer os.RemoveAll(dir)
	d, err := runc.New(dir)
	if err != nil {
		out = append(out, Stat{Name: "runc run (same rootfs)", Note: err.Error()})
	} else {
		o.logf("runc run of the same root filesystem: %d runs", n)
		var samples []time.Duration
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("bench%d", i)
			t := time.Now()
			err := d.Start(ctx, nookrt.Spec{
				ID: id, Hostname: id, Layers: []string{o.RootFS}, Args: []string{"/bin/true"},
				Env:    []string{"PATH=/usr/bin:/bin"},
				Limits: nookrt.Limits{WritableBytes: 64 << 20, MemoryBytes: 512 << 20, PidsMax: 64},
			})
			if err == nil {
				samples = append(samples, time.Since(t))
			}
			d.Stop(ctx, id)
			if err != nil {
				out = append(out, Stat{Name: "runc run (same rootfs)", Note: err.Error()})
				break
			}
		}
		if len(samples) > 0 {
			out = append(out, summarize("runc run (same rootfs)", samples))
		}
	}
	if p, err := exec.LookPath("podman"); err == nil {
		out = append(out, Stat{Name: "podman run", Note: "installed at " + p + " but not measured (needs an image store)"})
	} else {
		out = append(out, Stat{Name: "podman run", Note: "not installed"})
	}
	o.logf("unshare (same namespaces) + exec: %d runs", n)
	var samples []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		cmd := exec.CommandContext(ctx, "unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork",
			"--uts", "--ipc", "--net", "--cgroup", "--root", o.RootFS, "/bin/true")
		if b, err := cmd.CombinedOutput(); err != nil {
			out = append(out, Stat{Name: "unshare + exec", Note: fmt.Sprintf("%v: %s", err, bytes.TrimSpace(b))})
			return out
		}
		samples = append(samples, time.Since(t))
	}
	return append(out, summarize("unshare + exec (floor)", samples))
}

// density starts o.Density idle sandboxes and reports the host memory each
// costs (change in used memory / N, the anchor's method) and the agents'
// RSS and PSS.
func (o *Options) density(ctx context.Context) []Stat {
	o.logf("density: %d idle sandboxes", o.Density)
	before := usedMemory()
	var ids []string
	defer func() { killAll(context.WithoutCancel(ctx), o.API, ids) }()
	for i := 0; i < o.Density; i++ {
		sb, err := o.API.Create(ctx, createReq(o.Template))
		if err != nil {
			return []Stat{{Name: "density", Note: fmt.Sprintf("stopped after %d sandboxes: %v", len(ids), err)}}
		}
		ids = append(ids, sb.SandboxID)
	}
	time.Sleep(2 * time.Second) // let page cache and allocators settle
	after := usedMemory()
	rss, pss, agents := agentMemory()
	n := float64(len(ids))
	out := []Stat{{Name: fmt.Sprintf("host memory per idle sandbox (N=%d)", len(ids)), Unit: "MiB", Value: float64(after-before) / n / (1 << 20)}}
	if agents > 0 {
		out = append(out,
			Stat{Name: "agent RSS (mean)", Unit: "MiB", Value: float64(rss) / float64(agents) / (1 << 20)},
			Stat{Name: "agent PSS (mean)", Unit: "MiB", Value: float64(pss) / float64(agents) / (1 << 20)})
	}
	return out
}

// usedMemory is MemTotal - MemAvailable in bytes.
func usedMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	vals := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 {
			v, _ := strconv.ParseInt(fields[1], 10, 64)
			vals[strings.TrimSuffix(fields[0], ":")] = v * 1024
		}
	}
	return vals["MemTotal"] - vals["MemAvailable"]
}

// agentMemory sums RSS and PSS of every nook-agent process on the host.
func agentMemory() (rss, pss int64, n int) {
	procs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range procs {
		comm, err := os.ReadFile(c)
		if err != nil || strings.TrimSpace(string(comm)) != "nook-agent" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(filepath.Dir(c), "smaps_rollup"))
		if err != nil {
			continue
		}
		n++
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Rss:":
				rss += v * 1024
			case "Pss:":
				pss += v * 1024
			}
		}
	}
	return rss, pss, n
}
