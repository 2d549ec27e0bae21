package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/bench"
	"github.com/nookhq/nook/internal/client"
)

func benchCmd() *cobra.Command {
	var (
		cf       clientFlags
		o        bench.Options
		dataDir  string
		outPath  string
		noRootFS bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a running nook: create latency, round trips, throughput, density",
		Long: `Measure a running nook serve and print a table (and JSON with --out):
create latency (API call until the sandbox answers a command) cold and from the
warm pool at each --concurrency, commands.run("true") round trips, upload and
download throughput, and with --density N the host memory per idle sandbox.
Run as root on the nook host to also time runc run and a bare unshare on the
same root filesystem, printed as ratios to nook.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := cf.client(cmd)
			if err != nil {
				return err
			}
			o.API = api
			o.Sandboxes = &client.Sandboxes{ProxyURL: cf.sandboxURL}
			o.Progress = os.Stderr
			if !noRootFS {
				o.RootFS = filepath.Join(dataDir, "templates", o.Template, "rootfs")
				if _, err := os.Stat(o.RootFS); err != nil {
					o.RootFS = ""
				}
			}
			rep, err := bench.Run(cmd.Context(), o)
			if rep != nil {
				printReport(rep)
				if outPath != "" {
					data, _ := json.MarshalIndent(rep, "", "  ")
					if werr := os.WriteFile(outPath, data, 0o644); werr != nil {
						return werr
					}
				}
			}
			return err
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.StringVarP(&o.Template, "template", "t", "base", "template to measure")
	f.IntVar(&o.Creates, "creates", 20, "creates per concurrency level")
	f.IntSliceVar(&o.Concurrency, "concurrency", []int{1, 10, 50}, "concurrency levels for creates")
	f.IntVar(&o.Runs, "runs", 200, `commands.run("true") round trips`)
	f.IntVar(&o.TransferMiB, "transfer-mib", 100, "size of the upload/download measurement in MiB (0 skips)")
	f.IntVar(&o.Density, "density", 0, "start this many idle sandboxes to measure memory per sandbox (0 skips)")
	f.StringVar(&dataDir, "data-dir", "/var/lib/nook", "nook serve's data dir (for the runc/unshare comparison on the same root filesystem)")
	f.BoolVar(&noRootFS, "no-compare", false, "skip the runc/unshare comparison")
	f.StringVar(&outPath, "out", "", "also write the report as JSON to this file")
	return cmd
}

func printReport(rep *bench.Report) {
	fmt.Printf("\nnook bench on %s (%d CPUs), template %s, %s\n\n", rep.Host, rep.CPUs, rep.Template, rep.Time.Format("2006-01-02 15:04 MST"))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEASURE\tN\tP50\tP90\tP99\tVALUE\tUNIT\tNOTE")
	var coldP50, runP50 float64
	for _, s := range rep.Stats {
		if s.N > 0 {
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\t%s\t%s\n", s.Name, s.N, s.P50, s.P90, s.P99, s.Unit, s.Note)
		} else {
			fmt.Fprintf(tw, "%s\t\t\t\t\t%.1f\t%s\t%s\n", s.Name, s.Value, s.Unit, s.Note)
		}
		if s.Name == "create cold, concurrency 1" {
			coldP50 = s.P50
		}
		if s.Name == "runc run (same rootfs)" {
			runP50 = s.P50
		}
	}
	tw.Flush()
	for _, s := range rep.Stats {
		if s.N > 0 && coldP50 > 0 && (s.Name == "runc run (same rootfs)" || s.Name == "unshare + exec (floor)") {
			fmt.Printf("%s p50 is %.2fx nook's cold create p50\n", s.Name, s.P50/coldP50)
		}
	}
	_ = runP50
}
