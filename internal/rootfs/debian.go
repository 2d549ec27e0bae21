package rootfs

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// BasePackages are the Debian packages of the default `base` template.
var BasePackages = []string{
	"bash", "coreutils", "procps", "curl", "git", "ca-certificates", "python3", "nodejs",
	"iproute2", "less", "sudo",
}

// Recipe is the version of BuildDebian's steps besides the packages: a
// change to them changes it, so cached root filesystems are rebuilt.
const Recipe = 2

// DebianOptions describe a Debian root filesystem to build.
type DebianOptions struct {
	Suite    string   // e.g. "bookworm"
	Mirror   string   // e.g. "http://deb.debian.org/debian"
	Packages []string // extra packages on top of minbase
	// User, when set, is created with uid/gid 1000 and home /home/USER.
	User string
}

// BuildDebian builds a Debian root filesystem into dest (which must not
// exist) with mmdebstrap, writing its progress to progress.
func BuildDebian(ctx context.Context, dest string, o DebianOptions, progress io.Writer) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return fmt.Errorf("mmdebstrap not found (apt-get install mmdebstrap): %w", err)
	}
	args := []string{"--variant=minbase", "--mode=root", "--format=directory"}
	if len(o.Packages) > 0 {
		args = append(args, "--include="+strings.Join(o.Packages, ","))
	}
	if o.User != "" {
		args = append(args, "--customize-hook=chroot \"$1\" useradd --create-home --shell /bin/bash --uid 1000 --user-group "+o.User)
	}
	// commands.run starts every command with `bash -l`, which reads
	// /etc/profile; Debian's runs `id -u` there (a fork and exec per
	// command, ~1.5 ms here). bash knows its uid: use $EUID where it is set
	// (sh, which lacks it, still runs id).
	args = append(args, `--customize-hook=sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/' "$1/etc/profile"`)
	// Sandboxes get their own resolver config and hostname at start; leave
	// none of the build host's behind.
	args = append(args, `--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"`)
	args = append(args, o.Suite, dest, o.Mirror)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	var tail []string
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if tail = append(tail, line); len(tail) > 20 {
				tail = tail[1:]
			}
			fmt.Fprintln(progress, line)
		}
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	if err != nil {
		os.RemoveAll(dest)
		return fmt.Errorf("mmdebstrap: %w\n%s", err, strings.Join(tail, "\n"))
	}
	return nil
}
