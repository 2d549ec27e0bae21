package dockerfile

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/runtime"
)

// Base is what FROM resolves to.
type Base struct {
	Layers []string // topmost first
	Config image.Config
	// Key identifies the base's content for the step cache (an image
	// digest, a template's layers).
	Key string
}

// RunSpec is one RUN step for Options.Run.
type RunSpec struct {
	Layers  []string // read-only layers, topmost first
	Scratch string   // an existing empty dir; the runner leaves the writable layer in Scratch/upper
	Args    []string
	Env     []string
	Cwd     string
	User    string
}

// Options are what a build needs from its surroundings.
type Options struct {
	Store *image.Store
	// From resolves FROM's argument: an image source or a template.
	From func(ctx context.Context, ref string) (Base, error)
	// Run executes a RUN step and returns the command's exit code.
	Run       func(ctx context.Context, spec RunSpec, out io.Writer) (int, error)
	BuildArgs map[string]string
	NoCache   bool
	Log       io.Writer
}

// Result is a built image: its layers and run configuration.
type Result struct {
	Layers []string // topmost first
	Config image.Config
	Steps  int
	Cached int
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// Build runs the instructions of a parsed Dockerfile with contextDir as the
// build context.
func Build(ctx context.Context, instrs []Instruction, contextDir string, o Options) (Result, error) {
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	args := map[string]string{}
	nonce := fmt.Sprint(time.Now().UnixNano())
	var res Result
	var key string
	var layers []string
	var cfg image.Config
	for n, in := range instrs {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		logf("Step %d/%d : %s", n+1, len(instrs), in)
		fail := func(err error) (Result, error) {
			return Result{}, fmt.Errorf("Dockerfile line %d (%s): %w", in.Line, in.Cmd, err)
		}
		vars := envMap(cfg.Env)
		for k, v := range args {
			if _, ok := vars[k]; !ok {
				vars[k] = v
			}
		}
		switch in.Cmd {
		case "ARG":
			pairs, err := argPairs(in.Raw)
			if err != nil {
				return fail(err)
			}
			for _, kv := range pairs {
				v := expand(kv[1], vars)
				if bv, ok := o.BuildArgs[kv[0]]; ok {
					v = bv
				}
				args[kv[0]] = v
				key = hashOf(key, "ARG", kv[0], v)
			}
			continue
		case "FROM":
			ref := expand(in.Args[0], vars)
			if len(in.Args) == 3 && strings.EqualFold(in.Args[1], "AS") {
				// A stage name is fine while there is one stage.
			} else if len(in.Args) != 1 {
				return fail(fmt.Errorf("want FROM IMAGE [AS NAME]: %w", errdefs.ErrInvalid))
			}
			if ref == "scratch" {
				cfg, layers, key = image.Config{}, nil, hashOf("scratch")
			} else {
				base, err := o.From(ctx, ref)
				if err != nil {
					return fail(err)
				}
				cfg, layers, key = base.Config, append([]string(nil), base.Layers...), hashOf("from", base.Key)
				cfg.Env = append([]string(nil), cfg.Env...)
			}
			// ARGs before FROM are only for FROM.
			args = map[string]string{}
			continue
		case "LABEL", "MAINTAINER":
			continue
		case "ENV":
			pairs, err := keyValues(in.Raw)
			if err != nil {
				return fail(err)
			}
			for _, kv := range pairs {
				v := expand(kv[1], vars)
				cfg.Env = setEnv(cfg.Env, kv[0], v)
				vars[kv[0]] = v
				key = hashOf(key, "ENV", kv[0], v)
			}
			continue
		case "USER":
			cfg.User = expand(in.Raw, vars)
			key = hashOf(key, "USER", cfg.User)
			continue
		case "CMD", "ENTRYPOINT":
			argv := in.Args
			if !in.JSONForm {
				argv = nil
				if in.Raw != "" {
					argv = []string{"/bin/sh", "-c", in.Raw}
				}
			}
			if in.Cmd == "CMD" {
				cfg.Cmd = argv
			} else {
				cfg.Entrypoint, cfg.Cmd = argv, nil
			}
			key = hashOf(append([]string{key, in.Cmd}, argv...)...)
			continue
		case "EXPOSE":
			for _, a := range in.Args {
				num, _, _ := strings.Cut(expand(a, vars), "/")
				p, err := strconv.Atoi(num)
				if err != nil || p < 1 || p > 65535 {
					return fail(fmt.Errorf("port %q: %w", a, errdefs.ErrInvalid))
				}
				cfg.ExposedPorts = append(cfg.ExposedPorts, p)
			}
			continue
		}

		// Steps that make a layer.
		res.Steps++
		var produce func(tmp string) error
		switch in.Cmd {
		case "WORKDIR":
			wd := expand(in.Raw, vars)
			if !path.IsAbs(wd) {
				wd = path.Join(orRoot(cfg.WorkingDir), wd)
			}
			cfg.WorkingDir = path.Clean(wd)
			key = hashOf(key, "WORKDIR", cfg.WorkingDir)
			if present(layers, cfg.WorkingDir) {
				logf(" ---> %s exists", cfg.WorkingDir)
				continue
			}
			produce = func(tmp string) error { return mkdirLayer(tmp, cfg.WorkingDir) }
		case "RUN":
			argv := in.Args
			if !in.JSONForm {
				argv = []string{"/bin/sh", "-c", in.Raw}
			}
			env := append([]string(nil), cfg.Env...)
			names := make([]string, 0, len(args))
			for k := range args {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				if _, ok := envMap(cfg.Env)[k]; !ok {
					env = append(env, k+"="+args[k])
				}
			}
			if !hasPath(env) {
				env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
			}
			key = hashOf(append(append([]string{key, "RUN", cfg.User, cfg.WorkingDir}, env...), argv...)...)
			spec := RunSpec{Layers: layers, Args: argv, Env: env, Cwd: orRoot(cfg.WorkingDir), User: cfg.User}
			produce = func(tmp string) error {
				if err := os.Mkdir(tmp, 0o700); err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				spec.Scratch = tmp
				code, err := o.Run(ctx, spec, o.Log)
				if err != nil {
					return err
				}
				if code != 0 {
					return fmt.Errorf("the command %q exited with code %d", strings.Join(argv, " "), code)
				}
				return os.Rename(filepath.Join(tmp, "upper"), tmp+".layer")
			}
		case "COPY":
			if len(in.Args) < 2 {
				return fail(fmt.Errorf("want COPY SRC... DEST: %w", errdefs.ErrInvalid))
			}
			c, err := planCopy(contextDir, in, vars, cfg.WorkingDir, layers)
			if err != nil {
				return fail(err)
			}
			key = hashOf(key, "COPY", c.digest)
			produce = c.run
		}
		layerKey := key
		if o.NoCache {
			// A fresh layer: the cached one may be in use by templates.
			layerKey = hashOf(key, "no-cache", nonce)
		}
		final := o.Store.BuildPath(layerKey)
		if _, err := os.Stat(final); err == nil {
			res.Cached++
			logf(" ---> CACHED %s", layerKey[:12])
		} else {
			tmp := o.Store.NewTmp("step-")
			if err := produce(tmp); err != nil {
				os.RemoveAll(tmp)
				os.RemoveAll(tmp + ".layer")
				return fail(err)
			}
			made := tmp
			if _, err := os.Stat(tmp + ".layer"); err == nil {
				made = tmp + ".layer"
			}
			if err := image.Commit(made, final); err != nil {
				return fail(err)
			}
			logf(" ---> %s", layerKey[:12])
		}
		if empty, _ := emptyDir(final); !empty {
			layers = append([]string{final}, layers...)
		}
	}
	res.Layers, res.Config = layers, cfg
	return res, nil
}

func orRoot(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

func hasPath(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			return true
		}
	}
	return false
}

func argPairs(raw string) ([][2]string, error) {
	var out [][2]string
	words, err := splitQuoted(raw)
	if err != nil {
		return nil, err
	}
	for _, w := range words {
		k, v, _ := strings.Cut(w, "=")
		if k == "" {
			return nil, fmt.Errorf("ARG %q: want NAME[=DEFAULT]", w)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

func emptyDir(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return len(names) == 0, nil
	}
	return false, err
}

// present reports whether the absolute path p exists in the stack of
// layers (topmost first) as a directory or through a symlink (so that a new
// layer must not shadow it).
func present(layers []string, p string) bool {
	for _, l := range layers {
		// A symlinked parent (e.g. /lib -> usr/lib): leave it to the stack.
		var parents []string
		for dir := path.Dir(p); dir != "/" && dir != "."; dir = path.Dir(dir) {
			parents = append([]string{dir}, parents...)
		}
		for _, dir := range parents {
			if fi, err := os.Lstat(filepath.Join(l, dir)); err == nil && fi.Mode()&os.ModeSymlink != 0 {
				return true
			}
		}
		fi, err := os.Lstat(filepath.Join(l, p))
		if err == nil {
			st, ok := fi.Sys().(*unix.Stat_t)
			return !(ok && fi.Mode()&os.ModeCharDevice != 0 && st.Rdev == 0)
		}
	}
	return false
}

// mkdirLayer makes a layer holding the directory p and its parents, owned
// by the sandbox's root.
func mkdirLayer(tmp, p string) error {
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Chown(tmp, runtime.HostUIDBase, runtime.HostUIDBase); err != nil {
		return err
	}
	_, err := mkParents(tmp, strings.TrimPrefix(path.Clean(p), "/")+"/x", runtime.HostUIDBase, runtime.HostUIDBase)
	return err
}

// mkParents creates the parent dirs of rel inside root (owned by uid:gid,
// 0755) and returns rel's host path.
func mkParents(root, rel string, uid, gid int) (string, error) {
	dir := root
	parts := strings.Split(rel, "/")
	for _, c := range parts[:len(parts)-1] {
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			return "", fmt.Errorf("path %q escapes the root: %w", rel, errdefs.ErrInvalid)
		}
		dir = filepath.Join(dir, c)
		fi, err := os.Lstat(dir)
		if errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return "", err
			}
			if err := os.Lchown(dir, uid, gid); err != nil {
				return "", err
			}
			continue
		}
		if err != nil {
			return "", err
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory", dir)
		}
	}
	return filepath.Join(root, filepath.FromSlash(rel)), nil
}

// copyPlan is a resolved COPY.
type copyPlan struct {
	digest string
	run    func(tmp string) error
}

func planCopy(contextDir string, in Instruction, vars map[string]string, workdir string, layers []string) (copyPlan, error) {
	words := make([]string, len(in.Args))
	for i, a := range in.Args {
		words[i] = expand(a, vars)
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	uid, gid := 0, 0
	var chmod os.FileMode
	for _, f := range in.Flags {
		name, val, _ := strings.Cut(f, "=")
		switch name {
		case "--chown":
			var err error
			if uid, gid, err = resolveOwner(layers, expand(val, vars)); err != nil {
				return copyPlan{}, err
			}
		case "--chmod":
			m, err := strconv.ParseUint(val, 8, 32)
			if err != nil {
				return copyPlan{}, fmt.Errorf("--chmod %q: want octal: %w", val, errdefs.ErrInvalid)
			}
			chmod = os.FileMode(m)
		}
	}
	if !path.IsAbs(dest) {
		dest = path.Join(orRoot(workdir), dest)
	}
	destDir := strings.HasSuffix(words[len(words)-1], "/")
	root, err := filepath.Abs(contextDir)
	if err != nil {
		return copyPlan{}, err
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return copyPlan{}, err
	}
	var matches []string
	for _, s := range srcs {
		if c := path.Clean(s); c == ".." || strings.HasPrefix(c, "../") {
			return copyPlan{}, fmt.Errorf("COPY source %q is outside the build context: %w", s, errdefs.ErrInvalid)
		}
		rel := path.Clean("/" + s) // context-relative
		m, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			return copyPlan{}, fmt.Errorf("COPY source %q: %v: %w", s, err, errdefs.ErrInvalid)
		}
		if len(m) == 0 {
			return copyPlan{}, fmt.Errorf("COPY source %q: no such file in the build context: %w", s, errdefs.ErrInvalid)
		}
		for _, p := range m {
			// A symlinked directory in the context must not lead out of it.
			dir, err := filepath.EvalSymlinks(filepath.Dir(p))
			if err != nil {
				return copyPlan{}, err
			}
			if dir != realRoot && !strings.HasPrefix(dir, realRoot+string(filepath.Separator)) {
				return copyPlan{}, fmt.Errorf("COPY source %q leads out of the build context through a symlink: %w", s, errdefs.ErrInvalid)
			}
		}
		matches = append(matches, m...)
	}
	if len(matches) > 1 {
		destDir = true
	}
	type item struct {
		src, rel string // host source, destination path relative to the layer root
	}
	var items []item
	h := sha256.New()
	fmt.Fprintf(h, "%s %d %d %o\n", dest, uid, gid, chmod)
	for _, m := range matches {
		fi, err := os.Lstat(m)
		if err != nil {
			return copyPlan{}, err
		}
		target := strings.TrimPrefix(path.Clean(dest), "/")
		if fi.IsDir() {
			err := filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(m, p)
				items = append(items, item{p, path.Join(target, filepath.ToSlash(rel))})
				return nil
			})
			if err != nil {
				return copyPlan{}, err
			}
			continue
		}
		if destDir {
			target = path.Join(target, filepath.Base(m))
		}
		items = append(items, item{m, target})
	}
	for _, it := range items {
		fi, err := os.Lstat(it.src)
		if err != nil {
			return copyPlan{}, err
		}
		fmt.Fprintf(h, "%s %o ", it.rel, fi.Mode())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(it.src)
			fmt.Fprintf(h, "-> %s", l)
		case fi.Mode().IsRegular():
			f, err := os.Open(it.src)
			if err != nil {
				return copyPlan{}, err
			}
			io.Copy(h, f)
			f.Close()
		}
		fmt.Fprintln(h)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	run := func(tmp string) error {
		base := runtime.HostUIDBase
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		if err := os.Chown(tmp, base, base); err != nil {
			return err
		}
		for _, it := range items {
			fi, err := os.Lstat(it.src)
			if err != nil {
				return err
			}
			if it.rel == "" || it.rel == "." {
				continue // the destination root itself
			}
			dst, err := mkParents(tmp, it.rel, base, base)
			if err != nil {
				return err
			}
			mode := fi.Mode()
			switch {
			case mode.IsDir():
				if err := os.Mkdir(dst, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
					return err
				}
			case mode&os.ModeSymlink != 0:
				l, _ := os.Readlink(it.src)
				if err := os.Symlink(l, dst); err != nil {
					return err
				}
			case mode.IsRegular():
				if err := copyFile(it.src, dst); err != nil {
					return err
				}
			default:
				continue // sockets, devices: not copied
			}
			if err := os.Lchown(dst, uid+base, gid+base); err != nil {
				return err
			}
			if mode&os.ModeSymlink == 0 {
				perm := mode.Perm()
				if chmod != 0 {
					perm = chmod.Perm()
				}
				if err := os.Chmod(dst, perm); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return copyPlan{digest: digest, run: run}, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// resolveOwner turns "user[:group]" (names or numbers) into ids, looking
// names up in the topmost /etc/passwd and /etc/group of layers.
func resolveOwner(layers []string, s string) (int, int, error) {
	u, g, hasGroup := strings.Cut(s, ":")
	uid, ugid, err := lookupID(layers, "/etc/passwd", u)
	if err != nil {
		return 0, 0, err
	}
	gid := ugid
	if hasGroup {
		if gid, _, err = lookupID(layers, "/etc/group", g); err != nil {
			return 0, 0, err
		}
	}
	if uid < 0 || uid >= runtime.IDMapSize || gid < 0 || gid >= runtime.IDMapSize {
		return 0, 0, fmt.Errorf("owner %q is outside 0-%d: %w", s, runtime.IDMapSize-1, errdefs.ErrInvalid)
	}
	return uid, gid, nil
}

// lookupID resolves a name or number in an /etc/passwd-style file; for
// passwd it also returns the primary group.
func lookupID(layers []string, file, name string) (int, int, error) {
	if n, err := strconv.Atoi(name); err == nil {
		return n, n, nil
	}
	for _, l := range layers {
		f, err := openBeneath(l, strings.TrimPrefix(file, "/"))
		if err != nil {
			continue
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) >= 3 && fields[0] == name {
				id, _ := strconv.Atoi(fields[2])
				gid := id
				if len(fields) >= 4 {
					if g, err := strconv.Atoi(fields[3]); err == nil && file == "/etc/passwd" {
						gid = g
					}
				}
				return id, gid, nil
			}
		}
		break
	}
	return 0, 0, fmt.Errorf("%q is not in %s of the image: %w", name, file, errdefs.ErrInvalid)
}

// openBeneath opens rel inside dir without following any symlink.
func openBeneath(dir, rel string) (*os.File, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	fd, err := unix.Openat2(int(d.Fd()), rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}
