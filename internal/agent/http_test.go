package agent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/nookhq/nook/internal/envdpb/filesystem"
	pb "github.com/nookhq/nook/internal/envdpb/process"
)

func (ta *testAgent) do(t *testing.T, method, path string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ta.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := ta.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestAuthInitEnvs(t *testing.T) {
	ta := newTestAgent(t)
	if r, _ := ta.do(t, "GET", "/health", nil, nil); r.StatusCode != 204 {
		t.Fatalf("health %d", r.StatusCode)
	}
	if r, _ := ta.do(t, "POST", "/init", strings.NewReader(`{"envVars":{"A":"1"},"accessToken":"tok","defaultUser":"nobody"}`), nil); r.StatusCode != 204 {
		t.Fatalf("init %d", r.StatusCode)
	}
	if r, b := ta.do(t, "GET", "/envs", nil, nil); r.StatusCode != 401 || !strings.Contains(string(b), `"code":401`) {
		t.Fatalf("envs without token: %d %s", r.StatusCode, b)
	}
	if r, _ := ta.do(t, "GET", "/envs", nil, map[string]string{"X-Access-Token": "bad"}); r.StatusCode != 401 {
		t.Fatalf("envs with a bad token: %d", r.StatusCode)
	}
	r, b := ta.do(t, "GET", "/envs", nil, map[string]string{"X-Access-Token": "tok"})
	if r.StatusCode != 200 || strings.TrimSpace(string(b)) != `{"A":"1"}` {
		t.Fatalf("envs: %d %s", r.StatusCode, b)
	}
	if r, _ := ta.do(t, "GET", "/health", nil, nil); r.StatusCode != 204 {
		t.Fatalf("health with token set: %d", r.StatusCode)
	}
	_, err := ta.proc.List(ctxT(t, 5*time.Second), connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("rpc without token: %v", err)
	}
	ta.header.Set("X-Access-Token", "tok")
	// defaultUser from /init applies.
	stream, err := ta.proc.Start(ctxT(t, 5*time.Second), startReq("/usr/bin/id", "-un"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := collect(t, stream)
	if err != nil || strings.TrimSpace(string(res.stdout)) != "nobody" {
		t.Fatalf("default user: %q %v", res.stdout, err)
	}
	// A second /init replaces the env.
	ta.do(t, "POST", "/init", strings.NewReader(`{"envVars":{"B":"2"}}`), nil)
	if _, b := ta.do(t, "GET", "/envs", nil, map[string]string{"X-Access-Token": "tok"}); strings.TrimSpace(string(b)) != `{"B":"2"}` {
		t.Fatalf("envs after 2nd init: %s", b)
	}
	if r, b := ta.do(t, "GET", "/metrics", nil, map[string]string{"X-Access-Token": "tok"}); r.StatusCode != 200 || !strings.Contains(string(b), "mem_total") {
		t.Fatalf("metrics: %d %s", r.StatusCode, b)
	}
}

func TestFilesUploadDownload(t *testing.T) {
	ta := newTestAgent(t)
	ta.do(t, "POST", "/init", strings.NewReader(`{"accessToken":"tok"}`), nil)
	auth := map[string]string{"X-Access-Token": "tok"}
	data := make([]byte, 3<<20+17)
	rand.Read(data)

	// multipart, as nobody, into a new nested dir in nobody's home (relative path)
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	fw, _ := mw.CreateFormFile("file", "sub/dir/a.bin")
	fw.Write(data)
	mw.Close()
	if r, _ := ta.do(t, "POST", "/files?username=nobody", bytes.NewReader(mp.Bytes()), map[string]string{"Content-Type": mw.FormDataContentType()}); r.StatusCode != 401 {
		t.Fatalf("upload without token: %d", r.StatusCode)
	}
	r, b := ta.do(t, "POST", "/files?username=nobody", bytes.NewReader(mp.Bytes()), map[string]string{"Content-Type": mw.FormDataContentType(), "X-Access-Token": "tok"})
	if r.StatusCode != 200 {
		t.Fatalf("multipart upload: %d %s", r.StatusCode, b)
	}
	var ents []map[string]string
	json.Unmarshal(b, &ents)
	want := filepath.Join(ta.home, "sub/dir/a.bin")
	if len(ents) != 1 || ents[0]["path"] != want || ents[0]["name"] != "a.bin" || ents[0]["type"] != "file" {
		t.Fatalf("upload answer %s", b)
	}
	for _, p := range []string{want, filepath.Dir(want)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Fatalf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
	r, got := ta.do(t, "GET", "/files?username=nobody&path=sub/dir/a.bin", nil, auth)
	if r.StatusCode != 200 || !bytes.Equal(got, data) {
		t.Fatalf("download: %d, %d bytes", r.StatusCode, len(got))
	}

	// octet-stream with path in the query, then gzip-encoded
	target := filepath.Join(ta.dir, "oct", "b.bin")
	r, b = ta.do(t, "POST", "/files?path="+url.QueryEscape(target), bytes.NewReader(data), map[string]string{"Content-Type": "application/octet-stream", "X-Access-Token": "tok"})
	if r.StatusCode != 200 || !strings.Contains(string(b), target) {
		t.Fatalf("octet upload: %d %s", r.StatusCode, b)
	}
	if on, _ := os.ReadFile(target); !bytes.Equal(on, data) {
		t.Fatal("octet-stream content differs")
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("compressed"))
	zw.Close()
	r, _ = ta.do(t, "POST", "/files?path="+url.QueryEscape(target), &gz, map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip", "X-Access-Token": "tok"})
	if on, _ := os.ReadFile(target); r.StatusCode != 200 || string(on) != "compressed" {
		t.Fatalf("gzip upload: %d %q", r.StatusCode, on)
	}

	// errors
	r, b = ta.do(t, "GET", "/files?path=/nope/missing", nil, auth)
	if r.StatusCode != 404 || !strings.Contains(string(b), `"message"`) {
		t.Fatalf("missing: %d %s", r.StatusCode, b)
	}
	if r, _ = ta.do(t, "GET", "/files?path="+url.QueryEscape(ta.dir), nil, auth); r.StatusCode != 400 {
		t.Fatalf("dir download: %d", r.StatusCode)
	}

	// signed URL instead of the token
	sum := sha256.Sum256([]byte(target + ":read::tok"))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	r, got = ta.do(t, "GET", "/files?path="+url.QueryEscape(target)+"&signature="+url.QueryEscape(sig), nil, nil)
	if r.StatusCode != 200 || string(got) != "compressed" {
		t.Fatalf("signed download: %d %q", r.StatusCode, got)
	}
	if r, _ = ta.do(t, "GET", "/files?path="+url.QueryEscape(target)+"&signature=v1_bad", nil, nil); r.StatusCode != 401 {
		t.Fatalf("bad signature: %d", r.StatusCode)
	}
}

func TestFilesystemRPC(t *testing.T) {
	ta := newTestAgent(t)
	ctx := ctxT(t, 10*time.Second)
	ta.header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nobody:")))
	mk, err := ta.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "proj/src"}))
	if err != nil {
		t.Fatal(err)
	}
	e := mk.Msg.Entry
	if e.Path != filepath.Join(ta.home, "proj/src") || e.Type != fspb.FileType_FILE_TYPE_DIRECTORY || e.Owner != "nobody" || e.Group != "nogroup" || e.Permissions != "drwxr-xr-x" {
		t.Fatalf("makedir entry %v", e)
	}
	if _, err := ta.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "proj/src"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("second makedir: %v", err)
	}
	file := filepath.Join(ta.home, "proj/src/main.go")
	writeFile(t, file, "package main\n")
	os.Symlink(file, filepath.Join(ta.home, "proj/link"))
	st, err := ta.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: file}))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.Entry; e.Name != "main.go" || e.Type != fspb.FileType_FILE_TYPE_FILE || e.Size != 13 || e.Mode != 0o644 || e.Permissions != "-rw-r--r--" || e.Owner != "root" || e.ModifiedTime == nil {
		t.Fatalf("stat %v", e)
	}
	st, err = ta.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "proj/link"}))
	if err != nil || st.Msg.Entry.GetSymlinkTarget() != file || st.Msg.Entry.Type != fspb.FileType_FILE_TYPE_FILE {
		t.Fatalf("symlink stat %v %v", st, err)
	}
	if _, err := ta.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/nope/x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	names := func(depth uint32) []string {
		ls, err := ta.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "proj", Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ls.Msg.Entries {
			out = append(out, strings.TrimPrefix(e.Path, ta.home+"/"))
		}
		return out
	}
	if got := strings.Join(names(0), ","); got != "proj/link,proj/src" {
		t.Fatalf("listdir depth 1: %s", got)
	}
	if got := strings.Join(names(2), ","); got != "proj/link,proj/src,proj/src/main.go" {
		t.Fatalf("listdir depth 2: %s", got)
	}
	mv, err := ta.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: file, Destination: "proj/moved.go"}))
	if err != nil || mv.Msg.Entry.Path != filepath.Join(ta.home, "proj/moved.go") {
		t.Fatalf("move %v %v", mv, err)
	}
	if _, err := ta.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "proj"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ta.home, "proj")); !os.IsNotExist(err) {
		t.Fatalf("remove left %v", err)
	}
	if _, err := ta.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "proj"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("remove missing: %v", err)
	}
}

func TestWatchDir(t *testing.T) {
	ta := newTestAgent(t)
	ctx := ctxT(t, 10*time.Second)
	wd := filepath.Join(ta.dir, "watched")
	os.MkdirAll(filepath.Join(wd, "sub"), 0o755)
	stream, err := ta.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: wd, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	writeFile(t, filepath.Join(wd, "sub", "f.txt"), "x")
	os.Remove(filepath.Join(wd, "sub", "f.txt"))
	var seen []string
	for len(seen) < 2 || seen[len(seen)-1] != "sub/f.txt:EVENT_TYPE_REMOVE" {
		if !stream.Receive() {
			t.Fatalf("stream ended: %v (seen %v)", stream.Err(), seen)
		}
		if fe := stream.Msg().GetFilesystem(); fe != nil {
			seen = append(seen, fe.Name+":"+fe.Type.String())
		}
	}
	if seen[0] != "sub/f.txt:EVENT_TYPE_CREATE" {
		t.Fatalf("events %v", seen)
	}
	if _, err := ta.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/nope"})); err == nil {
		s2, _ := ta.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/nope"}))
		s2.Receive()
		if connect.CodeOf(s2.Err()) != connect.CodeNotFound {
			t.Fatalf("watch missing dir: %v", s2.Err())
		}
	}

	// polling watchers
	cw, err := ta.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: wd}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	writeFile(t, filepath.Join(wd, "g.txt"), "y")
	var evs []string
	for i := 0; i < 50 && len(evs) == 0; i++ {
		time.Sleep(20 * time.Millisecond)
		ge, err := ta.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ge.Msg.Events {
			evs = append(evs, e.Name+":"+e.Type.String())
		}
	}
	if len(evs) == 0 || evs[0] != "g.txt:EVENT_TYPE_CREATE" {
		t.Fatalf("polled events %v", evs)
	}
	if _, err := ta.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
}

func tunnel(t *testing.T, sock, target string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return c, br, strings.TrimSpace(line)
}

func TestTunnel(t *testing.T) {
	ta := newTestAgent(t)
	// token set: the tunnel does not need it (only nook serve reaches the socket)
	ta.do(t, "POST", "/init", strings.NewReader(`{"accessToken":"tok"}`), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, host := range []string{"127.0.0.1", "localhost"} {
		c, br, status := tunnel(t, ta.sock, net.JoinHostPort(host, itoa(port)))
		if status != "HTTP/1.1 200 Connection established" {
			t.Fatalf("%s: status %q", host, status)
		}
		if l, _ := br.ReadString('\n'); l != "\r\n" {
			t.Fatalf("bad head end %q", l)
		}
		io.WriteString(c, "ping through tunnel")
		buf := make([]byte, len("ping through tunnel"))
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping through tunnel" {
			t.Fatalf("echo %q %v", buf, err)
		}
	}
	if _, _, status := tunnel(t, ta.sock, "10.1.2.3:80"); !strings.Contains(status, " 403 ") {
		t.Fatalf("non-loopback: %q", status)
	}
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln2.Addr().(*net.TCPAddr).Port
	ln2.Close()
	if _, _, status := tunnel(t, ta.sock, "127.0.0.1:"+itoa(closed)); !strings.Contains(status, " 502 ") {
		t.Fatalf("closed port: %q", status)
	}
}

func TestFileMetadata(t *testing.T) {
	ta := newTestAgent(t)
	probe := filepath.Join(ta.dir, "probe")
	writeFile(t, probe, "")
	if err := syscall.Setxattr(probe, "user.nook.probe", []byte("1"), 0); err != nil {
		t.Fatalf("no user xattrs here: %v", err)
	}
	target := filepath.Join(ta.dir, "m.txt")
	r, b := ta.do(t, "POST", "/files?path="+url.QueryEscape(target), strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream", "X-Metadata-Team": "infra"})
	if r.StatusCode != 200 || !strings.Contains(string(b), `"metadata":{"team":"infra"}`) {
		t.Fatalf("upload with metadata: %d %s", r.StatusCode, b)
	}
	st, err := ta.fs.Stat(ctxT(t, 5*time.Second), connect.NewRequest(&fspb.StatRequest{Path: target}))
	if err != nil || st.Msg.Entry.Metadata["team"] != "infra" {
		t.Fatalf("stat metadata: %v %v", st, err)
	}
}
