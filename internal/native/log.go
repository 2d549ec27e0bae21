package native

import (
	"sync"
	"time"
)

// Retention limits of one process's (or terminal's) output log.
const (
	MaxLogBytes  = 1 << 20
	MaxLogEvents = 10000
)

// Event is one chunk of output. Cursor is its sequence number (from 1);
// a reader that has seen cursor c asks for since=c next.
type Event struct {
	Cursor uint64    `json:"cursor"`
	Stream string    `json:"stream"` // stdout, stderr or pty
	Data   []byte    `json:"data"`
	Time   time.Time `json:"time"`
}

// outputLog is a bounded, cursor-addressed log of output events with
// waiters. It drops the oldest events past maxBytes or MaxLogEvents.
type outputLog struct {
	mu       sync.Mutex
	events   []Event
	bytes    int
	maxBytes int
	next     uint64 // cursor of the next event
	dropped  bool   // some events were dropped
	ended    bool
	changed  chan struct{} // closed and replaced on every change
}

func newOutputLog(maxBytes int) *outputLog {
	if maxBytes <= 0 {
		maxBytes = MaxLogBytes
	}
	return &outputLog{maxBytes: maxBytes, next: 1, changed: make(chan struct{})}
}

func (l *outputLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *outputLog) append(stream string, data []byte) {
	if len(data) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// A chunk larger than the whole budget keeps only its tail.
	if len(data) > l.maxBytes {
		data = data[len(data)-l.maxBytes:]
		l.dropped = true
	}
	l.events = append(l.events, Event{Cursor: l.next, Stream: stream, Data: data, Time: time.Now().UTC()})
	l.next++
	l.bytes += len(data)
	drop := 0
	for (l.bytes > l.maxBytes || len(l.events)-drop > MaxLogEvents) && drop < len(l.events) {
		l.bytes -= len(l.events[drop].Data)
		drop++
	}
	if drop > 0 {
		l.events = append([]Event(nil), l.events[drop:]...)
		l.dropped = true
	}
	l.notifyLocked()
}

// end marks the log complete: no more events will come.
func (l *outputLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		l.notifyLocked()
	}
}

// cursor is the cursor of the last event so far (0: none yet).
func (l *outputLog) cursor() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

// since returns the retained events after cursor c, whether some events
// after c were dropped (gap), whether the log has ended, and a channel that
// is closed on the next change.
func (l *outputLog) since(c uint64) (evs []Event, gap, ended bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.next
	if len(l.events) > 0 {
		first = l.events[0].Cursor
	}
	if c+1 < first && l.dropped {
		gap = true
	}
	for i := range l.events {
		if l.events[i].Cursor > c {
			evs = append(evs, l.events[i:]...)
			break
		}
	}
	return evs, gap, l.ended, l.changed
}

// truncated reports whether any event was dropped.
func (l *outputLog) truncated() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}
