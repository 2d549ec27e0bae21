package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/bench"
)

// TestBenchRunsEndToEnd runs the built `nook bench` on a small N against the
// suite's nook serve, so that it cannot rot: every measure must be present
// in the JSON with samples. It asserts no time (benchmarks measure).
func TestBenchRunsEndToEnd(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bench.json")
	cmd := exec.Command(nookBin, "bench", "--api-url", apiURL, "--sandbox-url", proxyURL, "--api-key", apiKey,
		"--data-dir", dataDir, "--creates", "2", "--concurrency", "1,2", "--runs", "5",
		"--transfer-mib", "1", "--density", "2", "--out", out)
	done := make(chan struct{})
	var b []byte
	var err error
	go func() { b, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("nook bench did not finish in 5 minutes:\n%s", clip(string(b)))
	}
	if err != nil {
		t.Fatalf("nook bench: %v\n%s", err, b)
	}
	data, rerr := os.ReadFile(out)
	if rerr != nil {
		t.Fatalf("read JSON report: %v\n%s", rerr, b)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s", err, data)
	}
	want := []string{
		bench.CreateName(false, 1), bench.CreateName(false, 2), bench.CreateName(false, 2) + " rate",
		bench.CreateName(true, 1),
		bench.NameCommandsRun, bench.NameEnvdTrue, bench.NameNativeExec,
		bench.NameRunCodeWarm, bench.NameRunCodeCold, bench.NameRunCodePool,
		bench.NameUpload, bench.NameDownload,
		bench.NameRunc, bench.NameUnshare,
		bench.NameDensity, bench.NameAgentRSS, bench.NameAgentPSS,
	}
	for _, name := range want {
		s, ok := rep.Stat(name)
		if !ok {
			t.Errorf("report has no %q", name)
			continue
		}
		if s.N <= 0 {
			t.Errorf("%q has no samples: %+v", name, s)
		}
	}
	if s, ok := rep.Stat(bench.NamePodman); !ok || (s.N == 0 && !s.Skipped) {
		t.Errorf("podman run is neither measured nor marked skipped: %+v", s)
	}
	for _, s := range rep.Stats {
		if s.N == 0 && !s.Skipped {
			t.Errorf("%q: not measured and not skipped: %+v", s.Name, s)
		}
	}
	if len(rep.Ratios) == 0 {
		t.Errorf("report has no ratios to runc/unshare")
	}
	if rep.CPUs <= 0 || rep.Kernel == "" {
		t.Errorf("report does not name the machine: cpus %d kernel %q", rep.CPUs, rep.Kernel)
	}
	if t.Failed() {
		t.Logf("nook bench output:\n%s", b)
	}
}
