package interp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The Jupyter messaging protocol, version 5.3
// (https://jupyter-client.readthedocs.io/en/stable/messaging.html): each
// message is [identities..., "<IDS|MSG>", HMAC, header, parent_header,
// metadata, content, buffers...], signed with HMAC-SHA256 over the four
// JSON parts.

const delimiter = "<IDS|MSG>"

// ConnInfo is a kernel's connection file.
type ConnInfo struct {
	IP              string `json:"ip"`
	Transport       string `json:"transport"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name,omitempty"`
}

// Header is a message header.
type Header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// Message is one decoded Jupyter message.
type Message struct {
	Header       Header
	ParentHeader Header
	Metadata     map[string]any
	Content      json.RawMessage
}

// signer signs and verifies messages with a connection key.
type signer struct{ key []byte }

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	out := make([]byte, hex.EncodedLen(m.Size()))
	hex.Encode(out, m.Sum(nil))
	return out
}

func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// encode builds the wire parts of a new message of msgType.
func (s signer) encode(session, msgType string, content any) (id string, parts [][]byte, err error) {
	id = newID()
	h := Header{MsgID: id, Session: session, Username: "nook", Date: time.Now().UTC().Format(time.RFC3339Nano), MsgType: msgType, Version: "5.3"}
	hb, _ := json.Marshal(h)
	cb, err := json.Marshal(content)
	if err != nil {
		return "", nil, err
	}
	pb, md := []byte("{}"), []byte("{}")
	sig := s.sign(hb, pb, md, cb)
	return id, [][]byte{[]byte(delimiter), sig, hb, pb, md, cb}, nil
}

// decode parses and verifies wire parts (identities or a topic may lead).
func (s signer) decode(parts [][]byte) (*Message, error) {
	i := 0
	for ; i < len(parts); i++ {
		if string(parts[i]) == delimiter {
			break
		}
	}
	if len(parts)-i < 6 {
		return nil, errors.New("jupyter message without delimiter or with too few parts")
	}
	sig, hb, pb, md, cb := parts[i+1], parts[i+2], parts[i+3], parts[i+4], parts[i+5]
	if len(s.key) > 0 && !hmac.Equal(sig, s.sign(hb, pb, md, cb)) {
		return nil, errors.New("jupyter message with a bad signature")
	}
	m := &Message{Content: json.RawMessage(cb)}
	if err := json.Unmarshal(hb, &m.Header); err != nil {
		return nil, fmt.Errorf("jupyter header: %w", err)
	}
	_ = json.Unmarshal(pb, &m.ParentHeader)
	_ = json.Unmarshal(md, &m.Metadata)
	return m, nil
}
