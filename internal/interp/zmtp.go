package interp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A minimal ZMTP 3.0 peer (https://rfc.zeromq.org/spec/23/) with the NULL
// security mechanism: enough to be a DEALER or SUB client of a Jupyter
// kernel (whose sockets are libzmq ROUTER and PUB) over loopback TCP. It
// needs no background goroutines, reconnection or queues: a kernel's
// sockets live as long as the kernel, and when the connection breaks the
// kernel is treated as dead and restarted.

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04

	// maxFrame bounds one frame we accept (a kernel's message parts).
	maxFrame = 1 << 30
)

// zsock is one ZMTP connection.
type zsock struct {
	conn net.Conn
	r    *bufio.Reader
	wmu  sync.Mutex
}

func newReader(c net.Conn) *bufio.Reader { return bufio.NewReaderSize(c, 64<<10) }

// greeting is the 64-byte ZMTP 3.0 greeting with the NULL mechanism, as client.
func greeting() []byte {
	g := make([]byte, 64)
	g[0] = 0xff
	g[9] = 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// dialZMTP connects to a ZMTP peer at addr as socket type socketType
// ("DEALER" or "SUB") and completes the handshake.
func dialZMTP(addr, socketType string, timeout time.Duration) (*zsock, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	z := &zsock{conn: conn, r: newReader(conn)}
	if err := z.handshake(socketType, timeout); err != nil {
		conn.Close()
		return nil, fmt.Errorf("zmtp handshake with %s: %w", addr, err)
	}
	return z, nil
}

func (z *zsock) handshake(socketType string, timeout time.Duration) error {
	_ = z.conn.SetDeadline(time.Now().Add(timeout))
	defer z.conn.SetDeadline(time.Time{})
	if _, err := z.conn.Write(greeting()); err != nil {
		return err
	}
	peer := make([]byte, 64)
	if _, err := io.ReadFull(z.r, peer); err != nil {
		return err
	}
	if peer[0] != 0xff || peer[9] != 0x7f {
		return errors.New("peer is not a ZMTP peer")
	}
	if peer[10] < 3 {
		return fmt.Errorf("peer speaks ZMTP %d.%d, want 3.x", peer[10], peer[11])
	}
	if mech := string(bytes.TrimRight(peer[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("peer wants security mechanism %q, only NULL is supported", mech)
	}
	// READY command with our socket type (and an empty identity).
	var body bytes.Buffer
	body.WriteByte(5)
	body.WriteString("READY")
	writeProp(&body, "Socket-Type", socketType)
	if socketType == "DEALER" {
		writeProp(&body, "Identity", "")
	}
	if err := z.writeFrame(flagCommand, body.Bytes()); err != nil {
		return err
	}
	flags, cmd, err := z.readFrame()
	if err != nil {
		return err
	}
	if flags&flagCommand == 0 || len(cmd) < 6 || cmd[0] != 5 || string(cmd[1:6]) != "READY" {
		if len(cmd) > 6 && cmd[0] == 5 && string(cmd[1:6]) == "ERROR" {
			return fmt.Errorf("peer refused: %s", cmd[7:])
		}
		return errors.New("peer did not answer READY")
	}
	return nil
}

func writeProp(b *bytes.Buffer, name, value string) {
	b.WriteByte(byte(len(name)))
	b.WriteString(name)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(value)))
	b.Write(n[:])
	b.WriteString(value)
}

// writeFrame writes one frame; callers hold wmu or are in the handshake.
func (z *zsock) writeFrame(flags byte, data []byte) error {
	_, err := z.conn.Write(appendFrame(nil, flags, data))
	return err
}

// appendFrame appends one frame (header and body) to b.
func appendFrame(b []byte, flags byte, data []byte) []byte {
	if len(data) > 255 {
		b = append(b, flags|flagLong)
		b = binary.BigEndian.AppendUint64(b, uint64(len(data)))
	} else {
		b = append(b, flags, byte(len(data)))
	}
	return append(b, data...)
}

func (z *zsock) readFrame() (byte, []byte, error) {
	flags, err := z.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(z.r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := z.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(b)
	}
	if size > maxFrame {
		return 0, nil, fmt.Errorf("zmtp frame of %d bytes is too large", size)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(z.r, data); err != nil {
		return 0, nil, err
	}
	return flags, data, nil
}

// Send writes a multipart message, in one write (one segment on loopback,
// so the peer's I/O thread wakes once per message, not twice per frame).
func (z *zsock) Send(parts [][]byte) error {
	n := 0
	for _, p := range parts {
		n += 9 + len(p)
	}
	b := make([]byte, 0, n)
	for i, p := range parts {
		var f byte
		if i < len(parts)-1 {
			f = flagMore
		}
		b = appendFrame(b, f, p)
	}
	z.wmu.Lock()
	defer z.wmu.Unlock()
	_, err := z.conn.Write(b)
	return err
}

// Recv reads the next multipart message, skipping commands (PING etc.).
// Only one goroutine may call Recv.
func (z *zsock) Recv() ([][]byte, error) {
	var parts [][]byte
	for {
		flags, data, err := z.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			continue
		}
		parts = append(parts, data)
		if flags&flagMore == 0 {
			return parts, nil
		}
	}
}

// Subscribe subscribes a SUB socket to topic (ZMTP 3.0: a message whose
// first byte is 1).
func (z *zsock) Subscribe(topic string) error {
	return z.Send([][]byte{append([]byte{1}, topic...)})
}

// Close closes the connection.
func (z *zsock) Close() error { return z.conn.Close() }
