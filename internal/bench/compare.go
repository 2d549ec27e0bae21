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

	"github.com/nookhq/nook/internal/client"
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
	if d != nil {
		// Plain runc: it compiles the seccomp profile itself at every
		// start, as `runc run` of nook's config would without nook.
		d.SeccompFilter = ""
	}
	if err != nil {
		out = append(out, Stat{Name: NameRunc, Note: err.Error()})
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
				out = append(out, Stat{Name: NameRunc, Note: err.Error()})
				break
			}
		}
		if len(samples) > 0 {
			out = append(out, summarize(NameRunc, samples))
		}
	}
	if p, err := exec.LookPath("podman"); err == nil {
		out = append(out, Stat{Name: NamePodman, Skipped: true, Note: "installed at " + p + " but not measured (needs an image store)"})
	} else {
		out = append(out, Stat{Name: NamePodman, Skipped: true, Note: "not installed on this host"})
	}
	o.logf("unshare (same namespaces) + exec: %d runs", n)
	var samples []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		cmd := exec.CommandContext(ctx, "unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork",
			"--uts", "--ipc", "--net", "--cgroup", "--root", o.RootFS, "/bin/true")
		if b, err := cmd.CombinedOutput(); err != nil {
			out = append(out, Stat{Name: NameUnshare, Note: fmt.Sprintf("%v: %s", err, bytes.TrimSpace(b))})
			return out
		}
		samples = append(samples, time.Since(t))
	}
	return append(out, summarize(NameUnshare, samples))
}

// density starts up to o.Density idle sandboxes and reports the host memory
// each costs (change in used memory / N, the anchor's method) and the
// agents' RSS and PSS. It stops early, saying why, when a create fails,
// when the host's available memory falls under 10% or 512 MiB, or after 15
// minutes.
func (o *Options) density(ctx context.Context) []Stat {
	o.logf("density: up to %d idle sandboxes", o.Density)
	before := usedMemory()
	var ids []string
	defer func() { killAll(context.WithoutCancel(ctx), o.API, ids) }()
	stop := fmt.Sprintf("reached N=%d", o.Density)
	deadline := time.Now().Add(15 * time.Minute)
	for i := 0; i < o.Density; i++ {
		if avail, total := availableMemory(); avail < total/10 || avail < 512<<20 {
			stop = fmt.Sprintf("stopped at %d: host available memory %d MiB of %d MiB", len(ids), avail>>20, total>>20)
			break
		}
		if time.Now().After(deadline) {
			stop = fmt.Sprintf("stopped at %d: 15 minute limit", len(ids))
			break
		}
		sb, err := o.API.Create(ctx, client.CreateRequest{TemplateID: o.Template, Timeout: 3600, NoPool: true})
		if err != nil {
			stop = fmt.Sprintf("stopped at %d: create failed: %v", len(ids), err)
			break
		}
		ids = append(ids, sb.SandboxID)
		if len(ids)%50 == 0 {
			o.logf("  %d sandboxes", len(ids))
		}
	}
	if len(ids) == 0 {
		return []Stat{{Name: NameDensity, Unit: "MiB", Note: stop}}
	}
	time.Sleep(2 * time.Second) // let page cache and allocators settle
	after := usedMemory()
	rss, pss, agents := agentMemory(ids)
	n := float64(len(ids))
	out := []Stat{{Name: NameDensity, Unit: "MiB", N: len(ids), Value: float64(after-before) / n / (1 << 20), Note: stop}}
	if agents > 0 {
		out = append(out,
			Stat{Name: NameAgentRSS, Unit: "MiB", N: agents, Value: float64(rss) / float64(agents) / (1 << 20)},
			Stat{Name: NameAgentPSS, Unit: "MiB", N: agents, Value: float64(pss) / float64(agents) / (1 << 20)})
	}
	return out
}

// availableMemory returns MemAvailable and MemTotal in bytes.
func availableMemory() (avail, total int64) {
	m := meminfo()
	return m["MemAvailable"], m["MemTotal"]
}

// usedMemory is MemTotal - MemAvailable in bytes.
func usedMemory() int64 {
	vals := meminfo()
	return vals["MemTotal"] - vals["MemAvailable"]
}

// meminfo returns /proc/meminfo's fields in bytes.
func meminfo() map[string]int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil
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
	return vals
}

// agentMemory sums RSS and PSS of the nook-agent processes of sandboxes
// ids (told apart from other instances' by their cgroup, .../nook/ID).
func agentMemory(ids []string) (rss, pss int64, n int) {
	mine := map[string]bool{}
	for _, id := range ids {
		mine[id] = true
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range procs {
		comm, err := os.ReadFile(c)
		if err != nil || strings.TrimSpace(string(comm)) != "nook-agent" {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join(filepath.Dir(c), "cgroup"))
		_, id, _ := strings.Cut(strings.SplitN(string(cg), "\n", 2)[0], "/nook/")
		if !mine[strings.TrimSpace(id)] {
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
