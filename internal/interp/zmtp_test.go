package interp

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// fakePeer is a ZMTP 3.0 server end (as libzmq's ROUTER would be) that
// echoes every message it receives.
func fakePeer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		z := &zsock{conn: c, r: newReader(c)}
		g := greeting()
		g[32] = 1 // as-server
		c.Write(g)
		peer := make([]byte, 64)
		if _, err := io.ReadFull(z.r, peer); err != nil {
			return
		}
		if _, _, err := z.readFrame(); err != nil { // READY
			return
		}
		var body bytes.Buffer
		body.WriteByte(5)
		body.WriteString("READY")
		writeProp(&body, "Socket-Type", "ROUTER")
		z.writeFrame(flagCommand, body.Bytes())
		for {
			parts, err := z.Recv()
			if err != nil {
				return
			}
			z.Send(parts)
		}
	}()
	return ln.Addr().String()
}

func TestZMTPRoundTrip(t *testing.T) {
	z, err := dialZMTP(fakePeer(t), "DEALER", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	s := signer{key: []byte("secret")}
	big := strings.Repeat("x", 100000) // a long frame
	_, parts, err := s.encode("sess", "execute_request", map[string]any{"code": big})
	if err != nil {
		t.Fatal(err)
	}
	if err := z.Send(parts); err != nil {
		t.Fatal(err)
	}
	got, err := z.Recv()
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.decode(got)
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Code string }
	if json.Unmarshal(m.Content, &c); c.Code != big || m.Header.MsgType != "execute_request" || m.Header.Version != "5.3" {
		t.Fatalf("round trip: %+v", m.Header)
	}
	// A tampered message fails verification.
	got[len(got)-1] = []byte(`{"code":"evil"}`)
	if _, err := s.decode(got); err == nil {
		t.Fatal("tampered message verified")
	}
	// Identities before the delimiter are skipped.
	if _, err := s.decode(append([][]byte{[]byte("id1")}, parts...)); err != nil {
		t.Fatal(err)
	}
}

func TestResultEventMIME(t *testing.T) {
	ev := resultEvent(map[string]json.RawMessage{
		"text/plain": json.RawMessage(`"1"`), "image/png": json.RawMessage(`"aGk=\n"`),
		"application/json": json.RawMessage(`{"a":1}`), "application/vnd.custom": json.RawMessage(`"c"`),
	}, true)
	if ev["text"] != "1" || ev["png"] != "aGk=" || ev["application/vnd.custom"] != "c" || ev["is_main_result"] != true {
		t.Fatalf("%v", ev)
	}
	if m, ok := ev["json"].(map[string]any); !ok || m["a"] != float64(1) {
		t.Fatalf("json %v", ev["json"])
	}
}
