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
	Density     int   // idle sandboxes for the density run; 0 skips
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
}

// Report is a whole bench run.
type Report struct {
	Time     time.Time `json:"time"`
	Host     string    `json:"host"`
	CPUs     int       `json:"cpus"`
	Template string    `json:"template"`
	Stats    []Stat    `json:"stats"`
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

// Run measures everything the options ask for.
func Run(ctx context.Context, o Options) (*Report, error) {
	host, _ := os.Hostname()
	rep := &Report{Time: time.Now().UTC(), Host: host, CPUs: numCPU(), Template: o.Template}
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
				add(Stat{Name: st.Name + " rate", Unit: "creates/s", Value: rate})
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
	if st, err := o.runs(ctx, sb); err != nil {
		return rep, err
	} else {
		add(st)
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
	return rep, nil
}

// Short renders a stat in one line.
func (s Stat) Short() string {
	if s.N == 0 {
		if s.Note != "" && s.Value == 0 {
			return s.Note
		}
		return fmt.Sprintf("%.1f %s %s", s.Value, s.Unit, s.Note)
	}
	return fmt.Sprintf("p50 %.2f  p90 %.2f  p99 %.2f %s (n=%d)", s.P50, s.P90, s.P99, s.Unit, s.N)
}

// runTrue runs `true` the way commands.run does and waits for its end.
func (o *Options) runTrue(ctx context.Context, sb client.Sandbox) error {
	pc := o.Sandboxes.Process(sb, "")
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "true"}},
	}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				return fmt.Errorf("true exited %d", end.GetExitCode())
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
	kind := "cold"
	if pooled {
		kind = "pooled"
	}
	n := o.Creates
	if c > n {
		n = c
	}
	name := fmt.Sprintf("create %s, concurrency %d", kind, c)
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
					o.waitPool(ctx)
				}
				t := time.Now()
				sb, err := o.API.Create(ctx, client.CreateRequest{TemplateID: o.Template, Timeout: 120, NoPool: !pooled})
				if err == nil {
					err = o.runTrue(ctx, sb)
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
func (o *Options) waitPool(ctx context.Context) {
	for i := 0; i < 200; i++ {
		sizes, err := o.API.PoolSizes(ctx)
		if err != nil || sizes[o.Template] > 0 {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func createReq(tpl string) client.CreateRequest {
	return client.CreateRequest{TemplateID: tpl, Timeout: 600}
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

// runs measures the commands.run("true") round trip through the proxy.
func (o *Options) runs(ctx context.Context, sb client.Sandbox) (Stat, error) {
	o.logf("commands.run(\"true\"): %d round trips", o.Runs)
	var samples []time.Duration
	for i := 0; i < o.Runs; i++ {
		t := time.Now()
		if err := o.runTrue(ctx, sb); err != nil {
			return Stat{}, err
		}
		samples = append(samples, time.Since(t))
	}
	return summarize(`commands.run("true") round trip`, samples), nil
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
	return Stat{Name: "upload throughput", Unit: "MiB/s", Value: up},
		Stat{Name: "download throughput", Unit: "MiB/s", Value: down}, nil
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
