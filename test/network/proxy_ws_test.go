package network

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsServer is a WebSocket echo server with Python's standard library only
// (the base template has no websockets package): it answers the handshake
// and echoes each text frame as "echo: <text>" and each binary frame as is.
const wsServer = `import socketserver, hashlib, base64, struct
G = b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
class H(socketserver.StreamRequestHandler):
    def frame(self, op, data):
        n = len(data)
        hd = bytes([0x80 | op]) + (bytes([n]) if n < 126 else b'\x7e' + struct.pack('>H', n) if n < 65536 else b'\x7f' + struct.pack('>Q', n))
        self.wfile.write(hd + data); self.wfile.flush()
    def handle(self):
        self.rfile.readline()
        hdr = {}
        while True:
            l = self.rfile.readline().decode().strip()
            if not l: break
            k, _, v = l.partition(':'); hdr[k.strip().lower()] = v.strip()
        if hdr.get('upgrade', '').lower() != 'websocket':
            self.wfile.write(b'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n'); return
        acc = base64.b64encode(hashlib.sha1(hdr['sec-websocket-key'].encode() + G).digest()).decode()
        self.wfile.write(('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n' % acc).encode()); self.wfile.flush()
        while True:
            h = self.rfile.read(2)
            if len(h) < 2: return
            op, n = h[0] & 15, h[1] & 127
            if n == 126: n = struct.unpack('>H', self.rfile.read(2))[0]
            elif n == 127: n = struct.unpack('>Q', self.rfile.read(8))[0]
            mask = self.rfile.read(4) if h[1] & 128 else b'\0\0\0\0'
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8: self.frame(8, data[:2]); return
            if op == 9: self.frame(10, data); continue
            self.frame(op, b'echo: ' + data if op == 1 else data)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(('127.0.0.1', 8765), H).serve_forever()
`

// streamServer answers /sse with five server-sent events 300 ms apart (no
// length: the body ends with the connection) and /chunked with five chunks
// 300 ms apart (HTTP/1.1 chunked encoding).
const streamServer = `import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == '/sse':
            self.send_response(200); self.send_header('Content-Type', 'text/event-stream'); self.send_header('Cache-Control', 'no-cache'); self.end_headers()
            for i in range(5):
                self.wfile.write(('data: event %d\n\n' % i).encode()); self.wfile.flush(); time.sleep(0.3)
        else:
            self.protocol_version = 'HTTP/1.1'
            self.send_response(200); self.send_header('Content-Type', 'text/plain'); self.send_header('Transfer-Encoding', 'chunked'); self.end_headers()
            for i in range(5):
                b = ('chunk %d\n' % i).encode()
                self.wfile.write(b'%x\r\n%s\r\n' % (len(b), b)); self.wfile.flush(); time.sleep(0.3)
            self.wfile.write(b'0\r\n\r\n'); self.wfile.flush()
http.server.ThreadingHTTPServer(('127.0.0.1', 8766), H).serve_forever()
`

// startInSandbox writes a Python server into the sandbox, starts it in the
// background and waits until its port accepts connections.
func startInSandbox(t *testing.T, id, name, src string, port int) {
	t.Helper()
	script := fmt.Sprintf(`cat > /tmp/%[1]s.py <<'PYEOF'
%[2]sPYEOF
(nohup python3 /tmp/%[1]s.py >/tmp/%[1]s.log 2>&1 &)
for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/%[3]d) 2>/dev/null && exit 0; sleep 0.1; done
cat /tmp/%[1]s.log; exit 1`, name, src, port)
	if out, code := run(t, id, script); code != 0 {
		t.Fatalf("start %s in the sandbox: exit %d:\n%s", name, code, out)
	}
}

// TestWebSocketThroughProxy: a WebSocket server in a sandbox is reachable
// through nook's sandbox-traffic proxy, addressed by the E2B headers and by
// Host {port}-{id}.{domain}; text and binary frames go both ways.
func TestWebSocketThroughProxy(t *testing.T) {
	id := create(t, nil)
	startInSandbox(t, id, "ws", wsServer, 8765)
	for _, how := range []string{"headers", "host"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			opts := &websocket.DialOptions{}
			if how == "headers" {
				opts.HTTPHeader = http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"8765"}}
			} else {
				opts.Host = "8765-" + id + ".sandbox.test"
			}
			c, resp, err := websocket.Dial(ctx, "ws://"+proxyAddr+"/chat", opts)
			if err != nil {
				t.Fatalf("dial through the proxy: %v (response %v)", err, resp)
			}
			defer c.CloseNow()
			c.SetReadLimit(1 << 20)
			for i := 0; i < 3; i++ {
				msg := fmt.Sprintf("hello %d via %s", i, how)
				if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					t.Fatal(err)
				}
				typ, data, err := c.Read(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if typ != websocket.MessageText || string(data) != "echo: "+msg {
					t.Fatalf("got %v %q", typ, data)
				}
			}
			big := []byte(strings.Repeat("0123456789", 7000)) // 70 kB: 64-bit length frame
			if err := c.Write(ctx, websocket.MessageBinary, big); err != nil {
				t.Fatal(err)
			}
			typ, data, err := c.Read(ctx)
			if err != nil || typ != websocket.MessageBinary || string(data) != string(big) {
				t.Fatalf("binary echo: %v %v len %d", err, typ, len(data))
			}
			if err := c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	// A WebSocket to a port nothing listens on fails quickly with 502.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, resp, err := websocket.Dial(ctx, "ws://"+proxyAddr+"/", &websocket.DialOptions{
		HTTPHeader: http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"8799"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway || time.Since(start) > 2*time.Second {
		t.Fatalf("closed port: err %v, response %v after %s", err, resp, time.Since(start))
	}
}

// TestStreamingThroughProxy: server-sent events and a chunked response
// from a sandbox arrive through the proxy as they are written, not when
// the response ends.
func TestStreamingThroughProxy(t *testing.T) {
	id := create(t, nil)
	startInSandbox(t, id, "stream", streamServer, 8766)
	for _, c := range []struct{ path, prefix, ctype string }{
		{"/sse", "data: event ", "text/event-stream"},
		{"/chunked", "chunk ", "text/plain"},
	} {
		t.Run(strings.TrimPrefix(c.path, "/"), func(t *testing.T) {
			req, _ := http.NewRequest("GET", "http://"+proxyAddr+c.path, nil)
			req.Host = "8766-" + id + ".sandbox.test"
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), c.ctype) {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			sc := bufio.NewScanner(resp.Body)
			var arrivals []time.Duration
			for sc.Scan() {
				line := sc.Text()
				if !strings.HasPrefix(line, c.prefix) {
					continue
				}
				if want := fmt.Sprintf("%s%d", c.prefix, len(arrivals)); line != want {
					t.Fatalf("got %q, want %q", line, want)
				}
				arrivals = append(arrivals, time.Since(start))
			}
			if err := sc.Err(); err != nil {
				t.Fatalf("stream cut: %v", err)
			}
			if len(arrivals) != 5 {
				t.Fatalf("got %d of 5 parts (arrivals %v)", len(arrivals), arrivals)
			}
			// Written 300 ms apart: the first arrives long before the last
			// (a buffering proxy would deliver them all at once at the end).
			if spread := arrivals[4] - arrivals[0]; spread < 900*time.Millisecond {
				t.Fatalf("parts arrived together, not streamed: %v", arrivals)
			}
			t.Logf("%s arrivals: %v", c.path, arrivals)
		})
	}
}
