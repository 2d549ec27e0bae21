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
create latency (API call until the sandbox answers a command: /bin/true through
envd) cold and from the warm pool at each --concurrency, creates per second,
round trips of commands.run("true") (bash -l -c true, as the SDK runs it),
/bin/true through envd and true through the native exec API, warm run_code of
1+1 and create + first run_code on --interp-template, upload and download
throughput, and with --density N the host memory per idle sandbox (up to N,
with the reason it stopped) and the agents' RSS/PSS. Run as root on the nook
host to also time runc run and a bare unshare on the same root filesystem
(podman run when installed), printed as ratios to nook.`,
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
	f.IntVar(&o.Density, "density", 0, "start up to this many idle sandboxes to measure memory per sandbox (0 skips)")
	f.StringVar(&o.InterpTemplate, "interp-template", "code-interpreter-v1", `code-interpreter template for the run_code measures ("" skips)`)
	f.StringVar(&dataDir, "data-dir", "/var/lib/nook", "nook serve's data dir (for the runc/unshare comparison on the same root filesystem)")
	f.BoolVar(&noRootFS, "no-compare", false, "skip the runc/unshare comparison")
	f.StringVar(&outPath, "out", "", "also write the report as JSON to this file")
	return cmd
}

func printReport(rep *bench.Report) {
	fmt.Printf("\nnook bench on %s (%d CPUs, kernel %s), template %s, %s\n\n", rep.Host, rep.CPUs, rep.Kernel, rep.Template, rep.Time.Format("2006-01-02 15:04 MST"))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEASURE\tN\tP50\tP90\tP99\tVALUE\tUNIT\tNOTE")
	for _, s := range rep.Stats {
		if s.N > 0 && s.Unit == "ms" {
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\t%s\t%s\n", s.Name, s.N, s.P50, s.P90, s.P99, s.Unit, s.Note)
		} else if s.N > 0 {
			fmt.Fprintf(tw, "%s\t%d\t\t\t\t%.2f\t%s\t%s\n", s.Name, s.N, s.Value, s.Unit, s.Note)
		} else {
			fmt.Fprintf(tw, "%s\t\t\t\t\t\t%s\t%s\n", s.Name, s.Unit, s.Note)
		}
	}
	tw.Flush()
	if len(rep.Ratios) > 0 {
		fmt.Println()
	}
	for _, r := range rep.Ratios {
		fmt.Printf("%-70s %6.2fx  (%.2f ms / %.2f ms)\n", r.Name, r.Ratio, r.Other, r.Nook)
	}
}
