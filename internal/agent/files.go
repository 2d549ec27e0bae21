package agent

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// validSignature checks the /files URL signature the SDK can generate:
// "v1_" + base64(sha256("path:operation:user:token[:expiration]")) unpadded.
func (s *Server) validSignature(r *http.Request, token string) bool {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return sig == want
}

func httpFsError(w http.ResponseWriter, err error, path string) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", path))
	case errors.Is(err, fs.ErrPermission):
		writeError(w, http.StatusUnauthorized, err.Error())
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		writeError(w, http.StatusInsufficientStorage, "not enough disk space available")
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func (s *Server) handleFileGet(w http.ResponseWriter, r *http.Request) {
	u, err := s.userFromRequest(r.Header, r.URL.Query().Get("username"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	qp := r.URL.Query().Get("path")
	if qp == "" {
		writeError(w, http.StatusBadRequest, "path is required")
		return
	}
	path := s.resolvePath(qp, u)
	f, err := os.Open(path)
	if err != nil {
		httpFsError(w, err, path)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		httpFsError(w, err, path)
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", path))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(path)}))
	if fi.Mode().IsRegular() {
		http.ServeContent(w, r, "", fi.ModTime(), f)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, f)
}

type uploadedEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (s *Server) handleFilePost(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	u, err := s.userFromRequest(r.Header, q.Get("username"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploadedEntry
	switch {
	case ct == "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := q.Get("path")
			if target == "" {
				_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = params["filename"]
			}
			if target == "" {
				part.Close()
				writeError(w, http.StatusBadRequest, "no path given for the uploaded file")
				return
			}
			e, code, err := s.writeFile(s.resolvePath(target, u), part, u, metadataFromHeader(r.Header))
			part.Close()
			if err != nil {
				writeErrorCode(w, code, err, e.Path)
				return
			}
			out = append(out, e)
		}
	default: // application/octet-stream or anything else: the raw body
		target := q.Get("path")
		if target == "" {
			writeError(w, http.StatusBadRequest, "path is required")
			return
		}
		var body io.Reader = r.Body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				writeError(w, http.StatusBadRequest, "bad gzip body: "+err.Error())
				return
			}
			defer gz.Close()
			body = gz
		}
		e, code, err := s.writeFile(s.resolvePath(target, u), body, u, metadataFromHeader(r.Header))
		if err != nil {
			writeErrorCode(w, code, err, e.Path)
			return
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "no file in the request")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func writeErrorCode(w http.ResponseWriter, code int, err error, path string) {
	if code != 0 {
		writeError(w, code, err.Error())
		return
	}
	httpFsError(w, err, path)
}

// writeFile streams body to path (creating parents, owned by u).
func (s *Server) writeFile(path string, body io.Reader, u *User, meta map[string]string) (uploadedEntry, int, error) {
	e := uploadedEntry{Path: path, Name: filepath.Base(path), Type: "file"}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return e, http.StatusBadRequest, fmt.Errorf("path '%s' is a directory", path)
	}
	if err := mkdirAllAs(filepath.Dir(path), u); err != nil {
		return e, 0, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return e, 0, err
	}
	bw := bufio.NewWriterSize(f, 256*1024)
	if _, err := io.Copy(bw, body); err != nil {
		f.Close()
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return e, 0, err
		}
		return e, http.StatusBadRequest, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return e, 0, err
	}
	if err := f.Close(); err != nil {
		return e, 0, err
	}
	chownTo(path, u)
	if len(meta) > 0 {
		setMetadata(path, meta)
		e.Metadata = readMetadata(path)
	}
	return e, 0, nil
}

// ---- metrics ----

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m := map[string]any{"ts": time.Now().Unix(), "cpu_count": runtime.NumCPU()}
	if total, avail, ok := memInfo(); ok {
		m["mem_total"] = total
		m["mem_used"] = total - avail
		m["mem_total_mib"] = total >> 20
		m["mem_used_mib"] = (total - avail) >> 20
	}
	if pct, ok := cpuPercent(); ok {
		m["cpu_used_pct"] = pct
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/", &st) == nil {
		total := st.Blocks * uint64(st.Bsize)
		free := st.Bfree * uint64(st.Bsize)
		m["disk_total"] = total
		m["disk_used"] = total - free
	}
	writeJSON(w, http.StatusOK, m)
}

func memInfo() (total, avail uint64, ok bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = n * 1024
		case "MemAvailable:":
			avail = n * 1024
		}
	}
	return total, avail, total > 0
}

func cpuSample() (idle, total uint64, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return idle, total, true
}

func cpuPercent() (float64, bool) {
	i1, t1, ok := cpuSample()
	if !ok {
		return 0, false
	}
	time.Sleep(100 * time.Millisecond)
	i2, t2, ok := cpuSample()
	if !ok || t2 <= t1 {
		return 0, false
	}
	return 100 * (1 - float64(i2-i1)/float64(t2-t1)), true
}
