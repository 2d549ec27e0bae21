package agent

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/internal/envdpb/filesystem/filesystemconnect"
	"github.com/nookhq/nook/internal/envdpb/process/processconnect"
)

type testAgent struct {
	srv    *Server
	sock   string
	dir    string
	home   string // nobody's home
	http   *http.Client
	base   string
	proc   processconnect.ProcessClient
	fs     filesystemconnect.FilesystemClient
	header http.Header // added to every RPC
}

type headerInterceptor struct{ h *http.Header }

func (i headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range *i.h {
			req.Header()[k] = v
		}
		return next(ctx, req)
	}
}

func (i headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		c := next(ctx, spec)
		for k, v := range *i.h {
			c.RequestHeader()[k] = v
		}
		return c
	}
}

func (i headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func newTestAgent(t *testing.T) *testAgent {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("tests need root (setuid to nobody)")
	}
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, "home-nobody")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	writeFile(t, passwd, "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:"+home+":/bin/sh\n")
	writeFile(t, group, "root:x:0:\nnogroup:x:65534:\nextra:x:4242:nobody\n")
	srv := New(Config{
		AgentEnv:   []string{"PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_ONLY=secret"},
		PasswdPath: passwd,
		GroupPath:  group,
	})
	sock := filepath.Join(dir, "agent.sock")
	ln, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableCompression: true,
	}}
	ta := &testAgent{srv: srv, sock: sock, dir: dir, home: home, http: hc, base: "http://agent", header: http.Header{}}
	opts := []connect.ClientOption{connect.WithProtoJSON(), connect.WithInterceptors(headerInterceptor{&ta.header})}
	ta.proc = processconnect.NewProcessClient(hc, ta.base, opts...)
	ta.fs = filesystemconnect.NewFilesystemClient(hc, ta.base, opts...)
	return ta
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
