// Package bench measures a running nook: create latency (cold and pooled,
// at several concurrencies), command round trips, file throughput and
// density, next to runc and unshare doing the same work on the same root
// filesystem. It measures; it never asserts a time.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/internal/client"
	"github.com/nookhq/nook/internal/envdpb/process"
)

// Options say what to measure.
type Options struct {
	API         *client.Client
	Sandboxes   *client.Sandboxes
	Template    string
	Creates     int   // creates per concurrency level
	Concurrency []int // e.g. 1, 10, 50
	Runs        int   // commands.run round trips
	TransferMiB int   // upload/download size; 0 skips
	Density     int   // idle sandboxes for the density run (up to); 0 skips
	// InterpTemplate is the code-interpreter template for the run_code
	// measures ("" skips them).
	InterpTemplate string
	// RootFS, when set (and running as root), is the template's root
	// filesystem for the runc and unshare comparisons.
	RootFS   string
	Progress io.Writer
}

// Stat is one measured series.
type Stat struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit"`
	N     int     `json:"n"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Mean  float64 `json:"mean"`
	Value float64 `json:"value,omitempty"` // for single-number results (rates, sizes)
	Note  string  `json:"note,omitempty"`
	// Skipped: not measured on this host (e.g. podman not installed).
	Skipped bool `json:"skipped,omitempty"`
}

// Ratio compares a floor implementation doing the same work to nook.
type Ratio struct {
	Name  string  `json:"name"`  // e.g. "runc run / nook cold create p50"
	Nook  float64 `json:"nook"`  // nook's value (ms)
	Other float64 `json:"other"` // the other's value (ms)
	// Ratio is Other / Nook: above 1, nook is faster.
	Ratio float64 `json:"ratio"`
}

// Report is a whole bench run.
type Report struct {
	Time     time.Time `json:"time"`
	Host     string    `json:"host"`
	CPUs     int       `json:"cpus"`
	Kernel   string    `json:"kernel"`
	Template string    `json:"template"`
	Stats    []Stat    `json:"stats"`
	Ratios   []Ratio   `json:"ratios,omitempty"`
}

// Stat returns the stat named name, if measured.
func (r *Report) Stat(name string) (Stat, bool) {
	for _, s := range r.Stats {
		if s.Name == name {
			return s, true
		}
	}
	return Stat{}, false
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// summarize turns samples into a Stat in milliseconds.
func summarize(name string, samples []time.Duration) Stat {
	if len(samples) == 0 {
		return Stat{Name: name, Unit: "ms", Note: "no samples"}
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	pick := func(q float64) float64 { return ms(s[min(len(s)-1, int(q*float64(len(s))))]) }
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Stat{Name: name, Unit: "ms", N: len(s), P50: pick(0.5), P90: pick(0.9), P99: pick(0.99), Mean: ms(sum / time.Duration(len(s)))}
}

func (o *Options) logf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// Names of the measures (the JSON's stat names).
const (
	NameCommandsRun = `commands.run("true") round trip (bash -l -c true)`
	NameEnvdTrue    = `envd process /bin/true round trip`
	NameNativeExec  = `native exec of true round trip`
	NameRunCodeWarm = `run_code "1+1" warm`
	NameRunCodeCold = `create + first run_code "1+1", cold`
	NameRunCodePool = `create + first run_code "1+1", pooled`
	NameUpload      = "upload throughput"
	NameDownload    = "download throughput"
	NameRunc        = "runc run (same rootfs)"
	NameUnshare     = "unshare + exec (floor)"
	NamePodman      = "podman run"
	NameDensity     = "host memory per idle sandbox"
	NameAgentRSS    = "agent RSS (mean)"
	NameAgentPSS    = "agent PSS (mean)"
)

// CreateName is the name of the create latency measure.
func CreateName(pooled bool, c int) string {
	kind := "cold"
	if pooled {
		kind = "pooled"
	}
	return fmt.Sprintf("create %s, concurrency %d", kind, c)
}

// Run measures everything the options ask for.
func Run(ctx context.Context, o Options) (*Report, error) {
	host, _ := os.Hostname()
	rep := &Report{Time: time.Now().UTC(), Host: host, CPUs: numCPU(), Kernel: kernelRelease(), Template: o.Template}
	add := func(s Stat) {
		rep.Stats = append(rep.Stats, s)
		o.logf("  %-40s %s", s.Name, s.Short())
	}
	for _, pooled := range []bool{false, true} {
		for _, c := range o.Concurrency {
			st, rate, err := o.creates(ctx, c, pooled)
			if err != nil {
				return rep, err
			}
			add(st)
			if rate > 0 {
				add(Stat{Name: st.Name + " rate", Unit: "creates/s", N: st.N, Value: rate})
			}
			if pooled {
				break // the pool holds a few sandboxes: only concurrency 1 measures it
			}
		}
	}
	sb, err := o.API.Create(ctx, client.CreateRequest{TemplateID: o.Template, Timeout: 600})
	if err != nil {
		return rep, err
	}
	defer o.API.Kill(context.WithoutCancel(ctx), sb.SandboxID)
	for _, m := range []struct {
		name string
		fn   func(context.Context, client.Sandbox) error
	}{
		{NameCommandsRun, o.runTrue},
		{NameEnvdTrue, o.envdTrue},
		{NameNativeExec, o.nativeTrue},
	} {
		st, err := o.repeat(ctx, m.name, o.Runs, func() error { return m.fn(ctx, sb) })
		if err != nil {
			return rep, err
		}
		add(st)
	}
	if o.InterpTemplate != "" {
		sts, err := o.runCode(ctx)
		if err != nil {
			return rep, err
		}
		for _, s := range sts {
			add(s)
		}
	}
	if o.TransferMiB > 0 {
		up, down, err := o.transfer(ctx, sb)
		if err != nil {
			return rep, err
		}
		add(up)
		add(down)
	}
	if o.RootFS != "" && os.Geteuid() == 0 {
		for _, s := range compare(ctx, o) {
			add(s)
		}
	}
	if o.Density > 0 {
		for _, s := range o.density(ctx) {
			add(s)
		}
	}
	rep.Ratios = ratios(rep)
	return rep, nil
}

// ratios compares the floors (runc run, unshare, podman) with nook's cold
// and pooled create at concurrency 1: each is the other's p50 over nook's.
func ratios(rep *Report) []Ratio {
	var out []Ratio
	for _, other := range []string{NameRunc, NameUnshare, NamePodman} {
		st, ok := rep.Stat(other)
		if !ok || st.N == 0 {
			continue
		}
		for _, pooled := range []bool{false, true} {
			ns, ok := rep.Stat(CreateName(pooled, 1))
			if !ok || ns.N == 0 || ns.P50 == 0 {
				continue
			}
			out = append(out, Ratio{Name: other + " p50 / nook " + ns.Name + " p50", Nook: ns.P50, Other: st.P50, Ratio: st.P50 / ns.P50})
		}
	}
	return out
}

// repeat times n calls of fn.
func (o *Options) repeat(ctx context.Context, name string, n int, fn func() error) (Stat, error) {
	o.logf("%s: %d round trips", name, n)
	var samples []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		if err := fn(); err != nil {
			return Stat{}, fmt.Errorf("%s: %w", name, err)
		}
		samples = append(samples, time.Since(t))
	}
	return summarize(name, samples), nil
}

// Short renders a stat in one line.
func (s Stat) Short() string {
	if s.N == 0 || s.Unit != "ms" {
		if s.Note != "" && s.Value == 0 {
			return s.Note
		}
		return fmt.Sprintf("%.1f %s %s", s.Value, s.Unit, s.Note)
	}
	return fmt.Sprintf("p50 %.2f  p90 %.2f  p99 %.2f %s (n=%d)", s.P50, s.P90, s.P99, s.Unit, s.N)
}

// runTrue runs `true` the way commands.run does (bash -l -c true) and
// waits for its end.
func (o *Options) runTrue(ctx context.Context, sb client.Sandbox) error {
	return o.runProc(ctx, sb, "/bin/bash", "-l", "-c", "true")
}

// envdTrue runs /bin/true through envd's process service.
func (o *Options) envdTrue(ctx context.Context, sb client.Sandbox) error {
	return o.runProc(ctx, sb, "/bin/true")
}

func (o *Options) runProc(ctx context.Context, sb client.Sandbox, cmd string, args ...string) error {
	pc := o.Sandboxes.Process(sb, "")
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: cmd, Args: args},
	}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				return fmt.Errorf("%s exited %d", cmd, end.GetExitCode())
			}
			return nil
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	return fmt.Errorf("stream ended without an end event")
}

// creates measures create-until-a-command-answers at concurrency c.
func (o *Options) creates(ctx context.Context, c int, pooled bool) (Stat, float64, error) {
	n := o.Creates
	if c > n {
		n = c
	}
	name := CreateName(pooled, c)
	o.logf("%s: %d creates", name, n)
	var (
		mu      sync.Mutex
		samples []time.Duration
		ids     []string
		firstEr error
	)
	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	begin := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if pooled {
					o.waitPool(ctx, o.Template)
				}
				t := time.Now()
				sb, err := o.API.Create(ctx, client.CreateRequest{TemplateID: o.Template, Timeout: 120, NoPool: !pooled})
				if err == nil {
					// "Answers a command": /bin/true through envd (the
					// bash -l of commands.run is timed on its own).
					err = o.envdTrue(ctx, sb)
				}
				d := time.Since(t)
				mu.Lock()
				if err != nil && firstEr == nil {
					firstEr = err
				}
				if err == nil {
					samples = append(samples, d)
				}
				if sb.SandboxID != "" {
					ids = append(ids, sb.SandboxID)
				}
				mu.Unlock()
				if c == 1 && sb.SandboxID != "" {
					o.API.Kill(ctx, sb.SandboxID)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	if c > 1 {
		killAll(ctx, o.API, ids)
	}
	if firstEr != nil {
		return Stat{}, 0, fmt.Errorf("%s: %w", name, firstEr)
	}
	var rate float64
	if c > 1 {
		rate = float64(len(samples)) / elapsed.Seconds()
	}
	return summarize(name, samples), rate, nil
}

// waitPool waits (untimed) until the template's pool has a sandbox.
func (o *Options) waitPool(ctx context.Context, tpl string) {
	for i := 0; i < 400; i++ {
		sizes, err := o.API.PoolSizes(ctx)
		if err != nil || sizes[tpl] > 0 {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func killAll(ctx context.Context, api *client.Client, ids []string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			api.Kill(ctx, id)
			<-sem
		}()
	}
	wg.Wait()
}

// transfer measures upload and download throughput of TransferMiB.
func (o *Options) transfer(ctx context.Context, sb client.Sandbox) (Stat, Stat, error) {
	size := int64(o.TransferMiB) << 20
	o.logf("upload and download of %d MiB", o.TransferMiB)
	t := time.Now()
	if err := o.Sandboxes.Upload(ctx, sb, "/tmp/bench.bin", io.LimitReader(zeroReader{}, size)); err != nil {
		return Stat{}, Stat{}, err
	}
	up := float64(size) / (1 << 20) / time.Since(t).Seconds()
	t = time.Now()
	cw := &countWriter{}
	if err := o.Sandboxes.Download(ctx, sb, "/tmp/bench.bin", cw); err != nil {
		return Stat{}, Stat{}, err
	}
	down := float64(cw.n) / (1 << 20) / time.Since(t).Seconds()
	if cw.n != size {
		return Stat{}, Stat{}, fmt.Errorf("downloaded %d bytes, want %d", cw.n, size)
	}
	return Stat{Name: NameUpload, Unit: "MiB/s", N: 1, Value: up, Note: fmt.Sprintf("%d MiB", o.TransferMiB)},
		Stat{Name: NameDownload, Unit: "MiB/s", N: 1, Value: down, Note: fmt.Sprintf("%d MiB", o.TransferMiB)}, nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}
