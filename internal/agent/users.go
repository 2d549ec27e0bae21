package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// User is an account of the sandbox, read from its /etc/passwd.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Shell  string
	Groups []uint32 // supplementary groups, the primary group included
}

type passwdEntry struct {
	name  string
	uid   uint32
	gid   uint32
	home  string
	shell string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// userDB parses passwd and group files (no cgo, no NSS) and caches them
// until their size or mtime changes.
type userDB struct {
	passwdPath, groupPath string

	mu      sync.Mutex
	pwStamp fileStamp
	grStamp fileStamp
	users   []passwdEntry
	groups  []groupEntry
}

type fileStamp struct {
	size  int64
	mtime time.Time
	ok    bool
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{size: fi.Size(), mtime: fi.ModTime(), ok: true}
}

func newUserDB(passwdPath, groupPath string) *userDB {
	if passwdPath == "" {
		passwdPath = "/etc/passwd"
	}
	if groupPath == "" {
		groupPath = "/etc/group"
	}
	return &userDB{passwdPath: passwdPath, groupPath: groupPath}
}

func (db *userDB) refresh() {
	if st := stampOf(db.passwdPath); st != db.pwStamp || !st.ok {
		db.pwStamp = st
		db.users = nil
		if data, err := os.ReadFile(db.passwdPath); err == nil {
			db.users = parsePasswd(data)
		}
	}
	if st := stampOf(db.groupPath); st != db.grStamp || !st.ok {
		db.grStamp = st
		db.groups = nil
		if data, err := os.ReadFile(db.groupPath); err == nil {
			db.groups = parseGroup(data)
		}
	}
}

func lines(data []byte, fn func(fields []string)) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		fn(strings.Split(l, ":"))
	}
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

func parsePasswd(data []byte) []passwdEntry {
	var out []passwdEntry
	lines(data, func(f []string) {
		if len(f) < 7 {
			return
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5], shell: f[6]})
	})
	return out
}

func parseGroup(data []byte) []groupEntry {
	var out []groupEntry
	lines(data, func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, ok := parseID(f[2])
		if !ok {
			return
		}
		var members []string
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		out = append(out, groupEntry{name: f[0], gid: gid, members: members})
	})
	return out
}

func (db *userDB) toUser(p passwdEntry) *User {
	u := &User{Name: p.name, UID: p.uid, GID: p.gid, Home: p.home, Shell: p.shell}
	u.Groups = append(u.Groups, p.gid)
	for _, g := range db.groups {
		if g.gid == p.gid {
			continue
		}
		for _, m := range g.members {
			if m == p.name {
				u.Groups = append(u.Groups, g.gid)
				break
			}
		}
	}
	return u
}

// Lookup finds a user by name, or by numeric uid ("1000") or "uid:gid".
func (db *userDB) Lookup(spec string) (*User, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.refresh()
	for _, p := range db.users {
		if p.name == spec {
			return db.toUser(p), nil
		}
	}
	uidStr, gidStr, hasGID := strings.Cut(spec, ":")
	uid, ok := parseID(uidStr)
	if !ok {
		return nil, fmt.Errorf("user %q not found", spec)
	}
	var u *User
	for _, p := range db.users {
		if p.uid == uid {
			u = db.toUser(p)
			break
		}
	}
	if u == nil {
		u = &User{Name: uidStr, UID: uid, GID: uid, Home: "/", Groups: []uint32{uid}}
	}
	if hasGID {
		gid, ok := parseID(gidStr)
		if !ok {
			return nil, fmt.Errorf("bad group in %q", spec)
		}
		u.GID = gid
		u.Groups = []uint32{gid}
	}
	return u, nil
}

// Has reports whether a user of that name exists.
func (db *userDB) Has(name string) bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.refresh()
	for _, p := range db.users {
		if p.name == name {
			return true
		}
	}
	return false
}

// UserName returns the name of uid, or the number as a string.
func (db *userDB) UserName(uid uint32) string {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.refresh()
	for _, p := range db.users {
		if p.uid == uid {
			return p.name
		}
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// GroupName returns the name of gid, or the number as a string.
func (db *userDB) GroupName(gid uint32) string {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.refresh()
	for _, g := range db.groups {
		if g.gid == gid {
			return g.name
		}
	}
	return strconv.FormatUint(uint64(gid), 10)
}
