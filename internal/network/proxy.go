package network

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The transparent egress proxy. nftables redirects ports 80 and 443 of
// sandboxes with host rules here. Plain HTTP is decided per request by its
// Host; TLS by its SNI: spliced through untouched when no rule needs the
// request itself, else terminated with a certificate of nook's CA (which
// sandboxes trust) and handled as HTTP: header rules, handlers, refusals
// with a clear 403. The proxy resolves the host itself and connects only to
// addresses the policy allows for it, so a forged Host or SNI cannot reach
// a forbidden address.

type connInfo struct {
	src     netip.Addr
	port    uint16 // the port the sandbox addressed
	scheme  string
	origDst netip.AddrPort
}

type connInfoKey struct{}

// infoConn carries a connection's info through tls.Server.
type infoConn struct {
	net.Conn
	info   *connInfo
	prefix []byte
}

func (c *infoConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// origDst reads the pre-redirect destination of a redirected connection.
func origDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not TCP")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	raw.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, 80 /* SO_ORIGINAL_DST */)
		if err != nil {
			serr = err
			return
		}
		port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
		ip := netip.AddrFrom4([4]byte{m.Multiaddr[4], m.Multiaddr[5], m.Multiaddr[6], m.Multiaddr[7]})
		ap = netip.AddrPortFrom(ip, port)
	})
	return ap, serr
}

func (n *Network) connInfo(c net.Conn, scheme string, def uint16) *connInfo {
	ci := &connInfo{scheme: scheme, port: def}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		ci.src = ap.Addr().Unmap()
	}
	if od, err := origDst(c); err == nil {
		ci.origDst = od
		if p := od.Port(); p != n.opt.HTTPPort && p != n.opt.TLSPort {
			ci.port = p
		}
	}
	return ci
}

// chanListener feeds intercepted TLS connections to an http.Server.
type chanListener struct {
	ch     chan net.Conn
	done   chan struct{}
	once   sync.Once
	addr   net.Addr
	closed bool
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

func (n *Network) initUpstream() error {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if n.opt.UpstreamCAFile != "" {
		pem, err := os.ReadFile(n.opt.UpstreamCAFile)
		if err != nil {
			return fmt.Errorf("upstream CA file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("upstream CA file %s has no certificate", n.opt.UpstreamCAFile)
		}
	}
	n.upstream = &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	return nil
}

func (n *Network) serveProxy() error {
	gw := n.gw.String()
	httpLn, err := net.Listen("tcp4", net.JoinHostPort(gw, strconv.Itoa(int(n.opt.HTTPPort))))
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	tlsLn, err := net.Listen("tcp4", net.JoinHostPort(gw, strconv.Itoa(int(n.opt.TLSPort))))
	if err != nil {
		httpLn.Close()
		return fmt.Errorf("egress proxy: %w", err)
	}
	n.lns = append(n.lns, httpLn, tlsLn)
	plain := &http.Server{
		Handler:           http.HandlerFunc(n.handleHTTP),
		ReadHeaderTimeout: 30 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connInfoKey{}, n.connInfo(c, "http", 80))
		},
		ErrorLog: nil,
	}
	cl := &chanListener{ch: make(chan net.Conn), done: make(chan struct{}), addr: tlsLn.Addr()}
	intercepted := &http.Server{
		Handler:           http.HandlerFunc(n.handleHTTP),
		ReadHeaderTimeout: 30 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				if ic, ok := tc.NetConn().(*infoConn); ok {
					return context.WithValue(ctx, connInfoKey{}, ic.info)
				}
			}
			return ctx
		},
	}
	n.servers = append(n.servers, plain, intercepted)
	n.lns = append(n.lns, cl)
	go plain.Serve(httpLn)
	go intercepted.Serve(cl)
	go func() {
		for {
			c, err := tlsLn.Accept()
			if err != nil {
				return
			}
			go n.handleTLS(c, cl)
		}
	}()
	return nil
}

// hostLevel reports verdicts that no address can change.
func hostLevel(v Verdict) bool {
	return !v.Allow && (v.Rule == "denied host" || v.Rule == "not in allowed hosts")
}

// handleTLS decides one TLS connection by its SNI.
func (n *Network) handleTLS(c net.Conn, intercept *chanListener) {
	ci := n.connInfo(c, "https", 443)
	id, pol, ok := n.policyByIP(ci.src)
	if !ok {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Now().Add(15 * time.Second))
	hello, peeked, err := peekClientHello(c)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		n.log.Debug("egress: no TLS client hello", "sandbox", id, "err", err)
		c.Close()
		return
	}
	sni := NormalizeHost(hello.ServerName)
	if sni == "" {
		// No name to decide by: the original destination decides.
		dst := ci.origDst.Addr()
		if v := pol.Evaluate("", dst, n.blocked); !v.Allow {
			n.log.Warn("egress refused", "sandbox", id, "host", dst.String(), "rule", v.Rule, "via", "tls")
			c.Close()
			return
		}
		n.splice(c, peeked, ci.origDst)
		return
	}
	// Terminating TLS: rules and handlers need the request; refusals get
	// a readable 403 (the HTTP handler decides again and logs).
	terminate := func() {
		tc := tls.Server(&infoConn{Conn: c, info: ci, prefix: peeked}, &tls.Config{
			GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return n.ca.leaf(sni) },
			NextProtos:     []string{"http/1.1"},
		})
		select {
		case intercept.ch <- tc:
		case <-intercept.done:
			c.Close()
		}
	}
	v := pol.Evaluate(sni, netip.Addr{}, nil)
	if hostLevel(v) || v.Handler != "" || len(pol.RuleFor(sni)) > 0 {
		terminate()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, v, err := n.pick(ctx, pol, sni)
	if err != nil {
		n.log.Warn("egress failed", "sandbox", id, "host", sni, "err", err, "via", "tls")
		c.Close()
		return
	}
	if !v.Allow {
		terminate()
		return
	}
	n.splice(c, peeked, netip.AddrPortFrom(addr, ci.port))
}

// pick resolves host and returns the first address the policy allows.
func (n *Network) pick(ctx context.Context, pol Policy, host string) (netip.Addr, Verdict, error) {
	addrs, err := n.resolver.lookup(ctx, host)
	if err != nil {
		return netip.Addr{}, Verdict{}, err
	}
	var first Verdict
	for i, a := range addrs {
		v := pol.Evaluate(host, a, n.blocked)
		if v.Allow {
			return a, v, nil
		}
		if i == 0 {
			first = v
		}
	}
	return netip.Addr{}, first, nil
}

func (n *Network) splice(c net.Conn, peeked []byte, dst netip.AddrPort) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", dst.String(), 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if _, err := up.Write(peeked); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

var errPeeked = errors.New("peeked")

type readOnlyConn struct {
	r io.Reader
	net.Conn
}

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)        { return 0, io.ErrClosedPipe }
func (readOnlyConn) Close() error                       { return nil }
func (readOnlyConn) SetDeadline(t time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(t time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(t time.Time) error { return nil }

// peekClientHello reads a TLS ClientHello and returns it with the bytes
// read, to be replayed.
func peekClientHello(c net.Conn) (*tls.ClientHelloInfo, []byte, error) {
	var buf bytes.Buffer
	var hello *tls.ClientHelloInfo
	err := tls.Server(readOnlyConn{r: io.TeeReader(c, &buf), Conn: c}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			cp := *h
			hello = &cp
			return nil, errPeeked
		},
	}).Handshake()
	if hello == nil {
		return nil, nil, err
	}
	return hello, buf.Bytes(), nil
}

type refusal struct{ rule string }

func (r *refusal) Error() string { return "refused: " + r.rule }

func (n *Network) refuse(w http.ResponseWriter, id, host, rule string) {
	n.log.Warn("egress refused", "sandbox", id, "host", host, "rule", rule, "via", "http")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Nook-Egress-Refused", rule)
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "nook: request to %s refused by the sandbox's network policy (%s)\n", host, rule)
}

// transport returns sandbox id's upstream transport (per sandbox, so a
// pooled connection is never shared across policies).
func (n *Network) transport(id string) *http.Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if tr, ok := n.tr[id]; ok {
		return tr
	}
	tr := n.upstream.Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		_, pol, ok := n.policyOf(id)
		if !ok {
			return nil, &refusal{"sandbox gone"}
		}
		a, v, err := n.pick(ctx, pol, host)
		if err != nil {
			return nil, err
		}
		if !v.Allow {
			return nil, &refusal{v.Rule}
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), port))
	}
	n.tr[id] = tr
	return tr
}

func (n *Network) policyOf(id string) (string, Policy, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.sbs[id]
	if !ok {
		return "", Policy{}, false
	}
	return id, st.Policy, true
}

// handleHTTP handles one request of a sandbox (plain or intercepted).
func (n *Network) handleHTTP(w http.ResponseWriter, r *http.Request) {
	ci, _ := r.Context().Value(connInfoKey{}).(*connInfo)
	if ci == nil {
		http.Error(w, "nook: no connection info", http.StatusInternalServerError)
		return
	}
	id, pol, ok := n.policyByIP(ci.src)
	if !ok {
		http.Error(w, "nook: unknown sandbox", http.StatusForbidden)
		return
	}
	host := NormalizeHost(r.Host)
	if host == "" {
		http.Error(w, "nook: request without Host", http.StatusBadRequest)
		return
	}
	if r.Method == http.MethodConnect {
		n.refuse(w, id, host, "CONNECT tunnels are not allowed")
		return
	}
	v := pol.Evaluate(host, netip.Addr{}, nil)
	if hostLevel(v) {
		n.refuse(w, id, host, v.Rule)
		return
	}
	secrets := pol.Secrets()
	rules := pol.RuleFor(host)
	rp := &httputil.ReverseProxy{
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var rf *refusal
			if errors.As(err, &rf) {
				n.refuse(w, id, host, rf.rule)
				return
			}
			n.log.Debug("egress upstream failed", "sandbox", id, "host", host, "err", err)
			http.Error(w, "nook: upstream "+host+" failed: "+err.Error(), http.StatusBadGateway)
		},
		ModifyResponse: func(resp *http.Response) error {
			if len(secrets) > 0 {
				redactHeaders(resp.Header, secrets)
				resp.Body = &redactor{r: resp.Body, secrets: secrets}
			}
			return nil
		},
	}
	if v.Handler != "" {
		hu, err := url.Parse(v.Handler)
		if err != nil {
			http.Error(w, "nook: bad handler URL", http.StatusBadGateway)
			return
		}
		rp.Transport = n.upstream
		rp.Rewrite = func(pr *httputil.ProxyRequest) {
			pr.SetURL(hu)
			pr.Out.Header.Set("X-Forwarded-Host", r.Host)
			pr.Out.Header.Set("X-Forwarded-Proto", ci.scheme)
			pr.Out.Header.Set("X-Nook-Sandbox-Id", id)
		}
	} else {
		rp.Transport = n.transport(id)
		port := ci.port
		rp.Rewrite = func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = ci.scheme
			pr.Out.URL.Host = net.JoinHostPort(host, strconv.Itoa(int(port)))
			pr.Out.Host = r.Host
			for _, rule := range rules {
				for k, val := range rule.Transform.Headers {
					pr.Out.Header.Set(k, val)
				}
			}
			if len(secrets) > 0 {
				pr.Out.Header.Set("Accept-Encoding", "identity")
			}
		}
	}
	rp.ServeHTTP(w, r)
}

// redactHeaders masks secret values in response headers.
func redactHeaders(h http.Header, secrets []string) {
	for k, vs := range h {
		for i, v := range vs {
			for _, s := range secrets {
				if strings.Contains(v, s) {
					v = strings.ReplaceAll(v, s, strings.Repeat("*", len(s)))
				}
			}
			h[k][i] = v
		}
	}
}

// redactor masks secrets in a streamed body with same-length runs of '*'
// (so Content-Length stays right), holding back enough bytes to catch a
// secret split across reads.
type redactor struct {
	r       io.ReadCloser
	secrets []string
	buf     []byte
	out     []byte
	eof     bool
}

func (d *redactor) Read(p []byte) (int, error) {
	hold := 0
	for _, s := range d.secrets {
		hold = max(hold, len(s)-1)
	}
	for len(d.out) == 0 {
		if d.eof {
			if len(d.buf) == 0 {
				return 0, io.EOF
			}
			d.mask()
			d.out, d.buf = d.buf, nil
			break
		}
		tmp := make([]byte, 32*1024)
		k, err := d.r.Read(tmp)
		d.buf = append(d.buf, tmp[:k]...)
		if err == io.EOF {
			d.eof = true
		} else if err != nil {
			return 0, err
		}
		d.mask()
		if len(d.buf) > hold {
			cut := len(d.buf) - hold
			d.out = append(d.out, d.buf[:cut]...)
			d.buf = append([]byte(nil), d.buf[cut:]...)
		}
	}
	k := copy(p, d.out)
	d.out = d.out[k:]
	return k, nil
}

func (d *redactor) mask() {
	for _, s := range d.secrets {
		sb := []byte(s)
		for {
			i := bytes.Index(d.buf, sb)
			if i < 0 {
				break
			}
			for j := range sb {
				d.buf[i+j] = '*'
			}
		}
	}
}

func (d *redactor) Close() error { return d.r.Close() }
