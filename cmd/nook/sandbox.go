package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/client"
)

// clientFlags are the flags of every client verb.
type clientFlags struct {
	apiURL, apiKey, sandboxURL string
}

func (c *clientFlags) add(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&c.apiURL, "api-url", "http://localhost:3000", "nook REST API URL (NOOK_API_URL)")
	f.StringVar(&c.apiKey, "api-key", "", "API key (NOOK_API_KEY; default: the key stored in /var/lib/nook/api-key)")
	f.StringVar(&c.sandboxURL, "sandbox-url", "http://localhost:3002", "nook sandbox-traffic proxy URL (NOOK_SANDBOX_URL)")
}

func (c *clientFlags) client(cmd *cobra.Command) (*client.Client, error) {
	if err := bindEnv(cmd.Flags()); err != nil {
		return nil, err
	}
	key := c.apiKey
	if key == "" {
		if data, err := os.ReadFile("/var/lib/nook/api-key"); err == nil {
			key = strings.TrimSpace(string(data))
		}
	}
	if key == "" {
		return nil, fmt.Errorf("no API key: pass --api-key or set NOOK_API_KEY")
	}
	return &client.Client{APIURL: c.apiURL, APIKey: key}, nil
}

// keyValues parses repeated K=V flags.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}

func sandboxCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sb"}, Short: "Create, list, inspect, run commands in and kill sandboxes"}
	cf.add(cmd)

	var (
		tpl            string
		timeout        int64
		envs, metadata []string
		asJSON         bool
	)
	create := &cobra.Command{
		Use: "create", Short: "Create a sandbox and print its id", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			env, err := keyValues("env", envs)
			if err != nil {
				return err
			}
			md, err := keyValues("metadata", metadata)
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), client.CreateRequest{TemplateID: tpl, Timeout: timeout, EnvVars: env, Metadata: md})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(sb)
			}
			fmt.Println(sb.SandboxID)
			return nil
		},
	}
	create.Flags().StringVarP(&tpl, "template", "t", "base", "template id or alias")
	create.Flags().Int64Var(&timeout, "timeout", 300, "seconds until the sandbox is killed")
	create.Flags().StringArrayVarP(&envs, "env", "e", nil, "sandbox environment variable KEY=VALUE (repeatable)")
	create.Flags().StringArrayVar(&metadata, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	create.Flags().BoolVar(&asJSON, "json", false, "print the API's answer as JSON")

	var lsMeta []string
	var lsJSON bool
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List running sandboxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			md, err := keyValues("metadata", lsMeta)
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context(), md)
			if err != nil {
				return err
			}
			if lsJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tSTARTED\tENDS IN")
			for _, sb := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.SandboxID, sb.TemplateID, sb.State,
					sb.StartedAt.Local().Format(time.DateTime), time.Until(*sb.EndAt).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringArrayVar(&lsMeta, "metadata", nil, "only sandboxes with metadata KEY=VALUE (repeatable)")
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")

	info := &cobra.Command{
		Use: "info ID", Short: "Show a sandbox's details as JSON", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(sb)
		},
	}
	kill := &cobra.Command{
		Use: "kill ID...", Short: "Kill sandboxes", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					return fmt.Errorf("kill %s: %w", id, err)
				}
			}
			return nil
		},
	}
	setTimeout := &cobra.Command{
		Use: "set-timeout ID SECONDS", Short: "Set a sandbox to be killed SECONDS from now", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client(cmd)
			if err != nil {
				return err
			}
			secs, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil || secs <= 0 {
				return fmt.Errorf("SECONDS must be a positive integer, got %q", args[1])
			}
			return c.SetTimeout(cmd.Context(), args[0], secs)
		},
	}
	cmd.AddCommand(create, ls, info, kill, setTimeout, runCmd(&cf))
	return cmd
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
