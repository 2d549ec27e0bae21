package agent

import (
	"net/http"
	"strings"

	"golang.org/x/sys/unix"
)

// File metadata (envd 0.6.2): upload headers "X-Metadata-<key>: <value>" are
// kept as user xattrs "user.nook.<key>" (key lowercased: HTTP/1 does not
// preserve header case) and reported in EntryInfo.metadata. Best effort: on
// filesystems without user xattrs metadata is silently absent.
const xattrPrefix = "user.nook."

func metadataFromHeader(h http.Header) map[string]string {
	var m map[string]string
	for k, vs := range h {
		if len(k) > len("X-Metadata-") && strings.EqualFold(k[:len("X-Metadata-")], "X-Metadata-") && len(vs) > 0 {
			if m == nil {
				m = map[string]string{}
			}
			m[strings.ToLower(k[len("X-Metadata-"):])] = vs[0]
		}
	}
	return m
}

func setMetadata(path string, m map[string]string) {
	for k, v := range m {
		_ = unix.Lsetxattr(path, xattrPrefix+k, []byte(v), 0)
	}
}

func readMetadata(path string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil || n <= 0 {
		return nil
	}
	var m map[string]string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(name, xattrPrefix) {
			continue
		}
		val := make([]byte, 4096)
		vn, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[name[len(xattrPrefix):]] = string(val[:vn])
	}
	return m
}
