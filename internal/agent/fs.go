package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/nookhq/nook/internal/envdpb/filesystem"
)

// resolvePath makes p absolute: "~" and relative paths resolve against the
// user's home.
func (s *Server) resolvePath(p string, u *User) string {
	home := "/"
	if u != nil && u.Home != "" {
		home = u.Home
	}
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(home, p)
	}
	return filepath.Clean(p)
}

// permString renders a mode like "-rw-r--r--" / "drwxr-xr-x".
func permString(m fs.FileMode) string {
	const rwx = "rwxrwxrwx"
	b := make([]byte, 10)
	switch {
	case m&fs.ModeDir != 0:
		b[0] = 'd'
	case m&fs.ModeSymlink != 0:
		b[0] = 'l'
	case m&fs.ModeNamedPipe != 0:
		b[0] = 'p'
	case m&fs.ModeSocket != 0:
		b[0] = 's'
	case m&fs.ModeCharDevice != 0:
		b[0] = 'c'
	case m&fs.ModeDevice != 0:
		b[0] = 'b'
	default:
		b[0] = '-'
	}
	for i := 0; i < 9; i++ {
		if m&(1<<uint(8-i)) != 0 {
			b[i+1] = rwx[i]
		} else {
			b[i+1] = '-'
		}
	}
	if m&fs.ModeSetuid != 0 {
		b[3] = sticky(b[3], 's')
	}
	if m&fs.ModeSetgid != 0 {
		b[6] = sticky(b[6], 's')
	}
	if m&fs.ModeSticky != 0 {
		b[9] = sticky(b[9], 't')
	}
	return string(b)
}

func sticky(c byte, s byte) byte {
	if c == '-' {
		return s - 'a' + 'A'
	}
	return s
}

// entryInfo describes path (not following a final symlink; a symlink gets
// the type of its target and symlink_target set, FILE_TYPE_SYMLINK when the
// target cannot be resolved).
func (s *Server) entryInfo(path string) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return s.entryFromInfo(path, fi), nil
}

func (s *Server) entryFromInfo(path string, fi fs.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  permString(fi.Mode()),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = s.users.UserName(st.Uid)
		e.Group = s.users.GroupName(st.Gid)
		e.Mode = uint32(st.Mode & 0o7777)
	}
	e.Metadata = readMetadata(path)
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
		if target, err := filepath.EvalSymlinks(path); err == nil {
			e.SymlinkTarget = &target
			if tfi, err := os.Stat(target); err == nil {
				if tfi.IsDir() {
					e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
				} else {
					e.Type = fspb.FileType_FILE_TYPE_FILE
				}
			}
		} else if raw, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &raw
		}
	case fi.IsDir():
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	default:
		e.Type = fspb.FileType_FILE_TYPE_FILE
	}
	return e
}

func fsErr(err error, path string) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", path))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, syscall.ENOSPC):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL):
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// chownTo gives path to the user when the agent is root.
func chownTo(path string, u *User) {
	if u == nil || os.Getuid() != 0 {
		return
	}
	_ = os.Lchown(path, int(u.UID), int(u.GID))
}

// mkdirAllAs creates dir and missing parents, owning new ones to u.
func mkdirAllAs(dir string, u *User) error {
	if fi, err := os.Stat(dir); err == nil {
		if fi.IsDir() {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAllAs(parent, u); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return err
	}
	chownTo(dir, u)
	return nil
}

type fsService struct{ s *Server }

func (f *fsService) user(h http.Header) (*User, error) {
	u, err := f.s.userFromRequest(h, "")
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return u, nil
}

func (f *fsService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	u, err := f.user(req.Header())
	if err != nil {
		return nil, err
	}
	p := f.s.resolvePath(req.Msg.Path, u)
	e, err := f.s.entryInfo(p)
	if err != nil {
		return nil, fsErr(err, p)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

func (f *fsService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u, err := f.user(req.Header())
	if err != nil {
		return nil, err
	}
	p := f.s.resolvePath(req.Msg.Path, u)
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", p))
	}
	if err := mkdirAllAs(p, u); err != nil {
		return nil, fsErr(err, p)
	}
	e, err := f.s.entryInfo(p)
	if err != nil {
		return nil, fsErr(err, p)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (f *fsService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u, err := f.user(req.Header())
	if err != nil {
		return nil, err
	}
	src := f.s.resolvePath(req.Msg.Source, u)
	dst := f.s.resolvePath(req.Msg.Destination, u)
	if _, err := os.Lstat(src); err != nil {
		return nil, fsErr(err, src)
	}
	if err := mkdirAllAs(filepath.Dir(dst), u); err != nil {
		return nil, fsErr(err, dst)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsErr(err, src)
	}
	e, err := f.s.entryInfo(dst)
	if err != nil {
		return nil, fsErr(err, dst)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func (f *fsService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	u, err := f.user(req.Header())
	if err != nil {
		return nil, err
	}
	root := f.s.resolvePath(req.Msg.Path, u)
	depth := int(req.Msg.Depth)
	if depth <= 0 {
		depth = 1
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsErr(err, root)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
	}
	out := &fspb.ListDirResponse{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, de := range ents {
			p := filepath.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				continue
			}
			out.Entries = append(out.Entries, f.s.entryFromInfo(p, info))
			if de.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil && !errors.Is(err, fs.ErrPermission) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, fsErr(err, root)
	}
	return connect.NewResponse(out), nil
}

func (f *fsService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	u, err := f.user(req.Header())
	if err != nil {
		return nil, err
	}
	p := f.s.resolvePath(req.Msg.Path, u)
	if _, err := os.Lstat(p); err != nil {
		return nil, fsErr(err, p)
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsErr(err, p)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// ---- watching ----

type dirWatcher struct {
	w         *fsnotify.Watcher
	root      string
	recursive bool
	withEntry bool
	s         *Server
}

func (s *Server) newDirWatcher(root string, recursive, withEntry bool) (*dirWatcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsErr(err, root)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	dw := &dirWatcher{w: w, root: root, recursive: recursive, withEntry: withEntry, s: s}
	if err := dw.add(root); err != nil {
		w.Close()
		return nil, fsErr(err, root)
	}
	return dw, nil
}

func (dw *dirWatcher) add(dir string) error {
	if err := dw.w.Add(dir); err != nil {
		return err
	}
	if !dw.recursive {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() {
			_ = dw.add(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// convert turns one fsnotify event into protocol events (one per op bit).
func (dw *dirWatcher) convert(ev fsnotify.Event) []*fspb.FilesystemEvent {
	name, err := filepath.Rel(dw.root, ev.Name)
	if err != nil {
		name = ev.Name
	}
	if dw.recursive && ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			_ = dw.add(ev.Name)
		}
	}
	var entry *fspb.EntryInfo
	if dw.withEntry {
		entry, _ = dw.s.entryInfo(ev.Name)
	}
	var out []*fspb.FilesystemEvent
	add := func(t fspb.EventType) {
		out = append(out, &fspb.FilesystemEvent{Name: name, Type: t, Entry: entry})
	}
	if ev.Has(fsnotify.Create) {
		add(fspb.EventType_EVENT_TYPE_CREATE)
	}
	if ev.Has(fsnotify.Write) {
		add(fspb.EventType_EVENT_TYPE_WRITE)
	}
	if ev.Has(fsnotify.Remove) {
		add(fspb.EventType_EVENT_TYPE_REMOVE)
	}
	if ev.Has(fsnotify.Rename) {
		add(fspb.EventType_EVENT_TYPE_RENAME)
	}
	if ev.Has(fsnotify.Chmod) {
		add(fspb.EventType_EVENT_TYPE_CHMOD)
	}
	return out
}

func (f *fsService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	u, err := f.user(req.Header())
	if err != nil {
		return err
	}
	root := f.s.resolvePath(req.Msg.Path, u)
	dw, err := f.s.newDirWatcher(root, req.Msg.Recursive, req.Msg.IncludeEntry)
	if err != nil {
		return err
	}
	defer dw.w.Close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if ka := keepaliveInterval(req.Header()); ka > 0 {
		t := time.NewTicker(ka)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case err, ok := <-dw.w.Errors:
			if !ok {
				return nil
			}
			return connect.NewError(connect.CodeInternal, err)
		case ev, ok := <-dw.w.Events:
			if !ok {
				return nil
			}
			for _, fe := range dw.convert(ev) {
				if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
		}
	}
}

// watcherTable holds the polling watchers of CreateWatcher.
type watcherTable struct {
	mu       sync.Mutex
	watchers map[string]*pollWatcher
}

type pollWatcher struct {
	dw     *dirWatcher
	mu     sync.Mutex
	events []*fspb.FilesystemEvent
	err    error
	done   chan struct{}
}

const maxPolledEvents = 10000

func newWatcherTable() *watcherTable { return &watcherTable{watchers: map[string]*pollWatcher{}} }

func (f *fsService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	u, err := f.user(req.Header())
	if err != nil {
		return nil, err
	}
	root := f.s.resolvePath(req.Msg.Path, u)
	dw, err := f.s.newDirWatcher(root, req.Msg.Recursive, req.Msg.IncludeEntry)
	if err != nil {
		return nil, err
	}
	var idb [12]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	pw := &pollWatcher{dw: dw, done: make(chan struct{})}
	go func() {
		defer close(pw.done)
		for {
			select {
			case ev, ok := <-dw.w.Events:
				if !ok {
					return
				}
				evs := dw.convert(ev)
				pw.mu.Lock()
				pw.events = append(pw.events, evs...)
				if over := len(pw.events) - maxPolledEvents; over > 0 {
					pw.events = append([]*fspb.FilesystemEvent(nil), pw.events[over:]...)
				}
				pw.mu.Unlock()
			case err, ok := <-dw.w.Errors:
				if !ok {
					return
				}
				pw.mu.Lock()
				pw.err = err
				pw.mu.Unlock()
			}
		}
	}()
	t := f.s.watch
	t.mu.Lock()
	t.watchers[id] = pw
	t.mu.Unlock()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	t := f.s.watch
	t.mu.Lock()
	pw, ok := t.watchers[req.Msg.WatcherId]
	t.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.WatcherId))
	}
	pw.mu.Lock()
	evs, err := pw.events, pw.err
	pw.events, pw.err = nil, nil
	pw.mu.Unlock()
	if err != nil && len(evs) == 0 {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	t := f.s.watch
	t.mu.Lock()
	pw, ok := t.watchers[req.Msg.WatcherId]
	delete(t.watchers, req.Msg.WatcherId)
	t.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.WatcherId))
	}
	pw.dw.w.Close()
	<-pw.done
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
