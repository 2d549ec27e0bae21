package agent

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Reaper owns all waiting for children: a single Wait4(-1) loop reaps every
// child (including orphans re-parented to PID 1) and hands the exit status of
// processes started through Spawn to their waiter. Nothing else in the agent
// may call wait.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	kick    chan os.Signal
}

var (
	reaperOnce sync.Once
	theReaper  *Reaper
)

// NewReaper returns the process-wide reaper, starting its loop on first use.
// There must be only one Wait4(-1) loop per process.
func NewReaper() *Reaper {
	reaperOnce.Do(func() { theReaper = newReaper() })
	return theReaper
}

func newReaper() *Reaper {
	r := &Reaper{waiters: map[int]chan syscall.WaitStatus{}, kick: make(chan os.Signal, 1)}
	signal.Notify(r.kick, syscall.SIGCHLD)
	go r.loop()
	return r
}

// Spawn forks a child via syscall.ForkExec and registers it. The returned
// channel receives its wait status exactly once.
func (r *Reaper) Spawn(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	// Holding mu across the fork guarantees that the loop cannot dispatch the
	// child's status before the waiter is registered.
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	select {
	case r.kick <- syscall.SIGCHLD:
	default:
	}
	return pid, ch, nil
}

func (r *Reaper) loop() {
	for range r.kick {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			r.mu.Lock()
			ch, ok := r.waiters[pid]
			delete(r.waiters, pid)
			r.mu.Unlock()
			if ok {
				ch <- ws
			} else {
				slog.Debug("reaped orphan", "pid", pid)
			}
		}
	}
}

// statusString formats a wait status like os.ProcessState.String.
func statusString(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	default:
		return "unknown status"
	}
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Exited() {
		return ws.ExitStatus()
	}
	return -1
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
