package network

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// spareNamespaces keeps a few network namespaces (each with its owning user
// namespace, IPv6 off) made ahead of time, so that a create only moves one
// into place instead of spending most of its network setup (a holder
// process, two unshares, a setns) on the hot path. They hold nothing of a
// sandbox: no address, no veth, no rules.
type spareNamespaces struct {
	dir  string // the netns dir; spares are "spare-*" in it
	size int
	log  *slog.Logger

	mu      sync.Mutex
	ready   []string // guarded by mu; paths of spare netns pins
	filling bool     // guarded by mu
	closed  bool     // guarded by mu
	filler  sync.WaitGroup
}

const sparePrefix = "spare-"

// take moves a spare to path (and its user namespace to userNSPath(path))
// and reports whether there was one; it starts a refill either way.
func (s *spareNamespaces) take(path string) bool {
	defer s.refill(refillDelay)
	s.mu.Lock()
	if len(s.ready) == 0 {
		s.mu.Unlock()
		return false
	}
	spare := s.ready[len(s.ready)-1]
	s.ready = s.ready[:len(s.ready)-1]
	s.mu.Unlock()
	if err := movePin(userNSPath(spare), userNSPath(path)); err != nil {
		s.log.Warn("spare network namespace", "err", err)
		removeNetns(spare)
		return false
	}
	if err := movePin(spare, path); err != nil {
		s.log.Warn("spare network namespace", "err", err)
		removeNetns(spare)
		removeNetns(path)
		return false
	}
	return true
}

// movePin re-pins the namespace pinned at from at to (a new bind mount)
// and unpins from.
func movePin(from, to string) error {
	f, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		os.Remove(to)
		return fmt.Errorf("re-pin namespace %s: %w", from, err)
	}
	if err := unix.Unmount(from, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unpin namespace %s: %w", from, err)
	}
	return os.Remove(from)
}

// refillDelay is how long a refill after a take waits before it starts,
// so as not to compete for the CPU with the create that took the spare.
const refillDelay = 100 * time.Millisecond

// refill makes spares in the background, one at a time, up to size,
// starting after delay.
func (s *spareNamespaces) refill(delay time.Duration) {
	s.mu.Lock()
	if s.filling || s.closed || len(s.ready) >= s.size {
		s.mu.Unlock()
		return
	}
	s.filling = true
	s.filler.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.filler.Done()
		time.Sleep(delay)
		for {
			s.mu.Lock()
			if s.closed || len(s.ready) >= s.size {
				s.filling = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			b := make([]byte, 8)
			rand.Read(b)
			path := filepath.Join(s.dir, sparePrefix+hex.EncodeToString(b))
			if err := newNetns(path); err != nil {
				s.log.Warn("spare network namespace", "err", err)
				s.mu.Lock()
				s.filling = false
				s.mu.Unlock()
				return
			}
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				removeNetns(path)
				continue
			}
			s.ready = append(s.ready, path)
			s.mu.Unlock()
		}
	}()
}

// close stops refilling and removes the spares.
func (s *spareNamespaces) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.filler.Wait()
	s.mu.Lock()
	ready := s.ready
	s.ready = nil
	s.mu.Unlock()
	var errs []error
	for _, p := range ready {
		errs = append(errs, removeNetns(p))
	}
	return errors.Join(errs...)
}
