package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/api"
	"github.com/nookhq/nook/internal/native"
	"github.com/nookhq/nook/internal/proxy"
	"github.com/nookhq/nook/internal/runtime/runc"
	"github.com/nookhq/nook/internal/sandbox"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
)

type serveOptions struct {
	dataDir, listen, proxyListen, domain, logLevel, agentPath, mirror string
	apiKeys                                                           []string
	net                                                               netFlags
	poolSize                                                          int
	rootfsCache                                                       string
	backup                                                            backupFlags // backups.go
}

func serveCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the nook server (REST API and sandbox-traffic proxy)",
		Long: `Run the nook server. On first start it builds the default template "base"
(Debian bookworm, with mmdebstrap) and generates an API key when none is given.
Every flag can also be set as NOOK_<FLAG> (e.g. NOOK_API_KEY, NOOK_DATA_DIR).
Needs root: it mounts file systems and runs runc.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return err
			}
			return serve(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "/var/lib/nook", "directory for all of nook's state")
	f.StringVar(&o.listen, "listen", ":3000", "address of the REST API")
	f.StringVar(&o.proxyListen, "proxy-listen", ":3002", "address of the sandbox-traffic proxy")
	f.StringVar(&o.domain, "domain", "", "domain SDKs address sandboxes under ({port}-{id}.DOMAIN); empty: SDKs must be given the proxy URL")
	f.StringSliceVar(&o.apiKeys, "api-key", nil, "API key(s) clients must send (repeatable or comma list); when none, one is generated and stored in the data dir")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&o.agentPath, "agent-path", "", "path of the nook-agent binary (default: nook-agent beside this binary, then PATH)")
	f.StringVar(&o.rootfsCache, "rootfs-cache", "", "directory shared between data dirs that keeps built-in template root filesystems (hard-linked; must be on the same file system)")
	f.IntVar(&o.poolSize, "pool-size", 2, "warm sandboxes kept started per template (a template's own pool size wins); 0 disables the pool")
	o.net.register(f)
	o.backup.register(f)
	f.StringVar(&o.mirror, "debian-mirror", "http://deb.debian.org/debian", "Debian mirror used to build the base template")
	return cmd
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// findAgent locates the nook-agent binary.
func findAgent(flag string) (string, error) {
	if flag != "" {
		return filepath.Abs(flag)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "nook-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("nook-agent")
	if err != nil {
		return "", errors.New("nook-agent binary not found beside nook or in PATH; build it (make build) or pass --agent-path")
	}
	return filepath.Abs(p)
}

// findInterp locates the nook-interp binary (run_code) beside nook-agent.
func findInterp(agentPath string) (string, error) {
	p := filepath.Join(filepath.Dir(agentPath), "nook-interp")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("nook-interp binary not found beside %s; build it (make build): %w", agentPath, err)
	}
	return p, nil
}

// apiKeys returns the configured keys, or the stored generated one.
func apiKeys(o serveOptions) ([]string, error) {
	var keys []string
	for _, k := range o.apiKeys {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		return keys, nil
	}
	path := filepath.Join(o.dataDir, "api-key")
	if data, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(data))) > 0 {
		key := strings.TrimSpace(string(data))
		fmt.Fprintf(os.Stderr, "API key (from %s): %s\n", path, key)
		return []string{key}, nil
	}
	b := make([]byte, 20)
	rand.Read(b)
	key := "nook_" + hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "generated API key (stored in %s): %s\n", path, key)
	return []string{key}, nil
}

func serve(ctx context.Context, o serveOptions) error {
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("nook serve needs root (it mounts file systems and runs runc)")
	}
	agentPath, err := findAgent(o.agentPath)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.dataDir, 0o711); err != nil {
		return err
	}
	keys, err := apiKeys(o)
	if err != nil {
		return err
	}
	st, err := store.Open(filepath.Join(o.dataDir, "nook.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	rt, err := runc.New(o.dataDir)
	if err != nil {
		return err
	}
	templates, err := template.NewRegistry(st, o.dataDir)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	templates.RootfsCache = o.rootfsCache
	if err := templates.EnsureBase(ctx, o.mirror, os.Stderr); err != nil {
		return err
	}
	if err := templates.EnsureCodeInterpreter(ctx, o.mirror, os.Stderr); err != nil {
		return err
	}
	interpPath, err := findInterp(agentPath)
	if err != nil {
		return err
	}
	sandboxRuntime := withGvisor(rt, o.dataDir, templates, log) // pause.go
	netw, err := o.net.start(ctx, o.dataDir, log)
	if err != nil {
		return err
	}
	if netw != nil {
		defer netw.Close()
	}
	backupRemote, err := o.backup.open(ctx, log)
	if err != nil {
		return err
	}
	mgr, err := sandbox.NewManager(sandbox.Config{
		DataDir: o.dataDir, AgentPath: agentPath, InterpPath: interpPath, Runtime: sandboxRuntime, Store: st, Templates: templates, Log: log,
		PoolSize: o.poolSize, Network: sandboxNetwork(netw), BackupRemote: backupRemote,
	})
	if err != nil {
		return err
	}
	if err := mgr.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	if err := pruneNetwork(netw, mgr); err != nil {
		log.Warn("cleaning leftover sandbox networks", "err", err)
	}
	if err := mgr.WarmPools(); err != nil {
		return err
	}
	nat := native.New(&native.Service{Sandboxes: mgr, Templates: templates, Execer: rt, Log: log})
	mgr.OnKill(nat.Drop)
	apiSrv := &http.Server{
		Handler:           (&api.Server{Sandboxes: mgr, Templates: templates, APIKeys: keys, Domain: o.domain, Log: log, Native: nat}).Handler(),
		ReadHeaderTimeout: 10 * time.Second,
	}
	proxySrv := &http.Server{
		Handler:           &proxy.Proxy{Agents: mgr, Log: log},
		ReadHeaderTimeout: 10 * time.Second,
	}
	apiLn, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	proxyLn, err := net.Listen("tcp", o.proxyListen)
	if err != nil {
		apiLn.Close()
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- apiSrv.Serve(apiLn) }()
	go func() { errc <- proxySrv.Serve(proxyLn) }()
	log.Info("nook serving", "api", apiLn.Addr().String(), "proxy", proxyLn.Addr().String(), "data", o.dataDir)
	select {
	case <-ctx.Done():
		log.Info("shutting down; sandboxes keep running and are re-adopted on the next start")
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Warm sandboxes belong to this run only: a next start refills anyway.
	mgr.StopPool(context.Background())
	apiSrv.Shutdown(sctx)
	proxySrv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
