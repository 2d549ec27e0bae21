package main

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// warmThreads makes the Go runtime start about n OS threads now, while the
// sandbox's pids limit has room. The runtime keeps idle threads and reuses
// them, so the agent (the sandbox's PID 1) keeps answering, and can kill
// the culprit, when the sandbox's own processes use up every pid (a fork
// bomb): a Go program that cannot make a thread it needs dies.
func warmThreads(n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A blocking system call holds its thread; the runtime hands
			// the processor to a new thread for the next goroutine.
			ts := unix.NsecToTimespec((50 * time.Millisecond).Nanoseconds())
			unix.Nanosleep(&ts, nil)
		}()
	}
	wg.Wait()
}
