package sandbox

import (
	"context"
	"reflect"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/internal/envdpb/process"
	"github.com/nookhq/nook/internal/envdpb/process/processconnect"
	"github.com/nookhq/nook/internal/template"
)

// pool keeps started, not yet initialised sandboxes per template, so that a
// create only has to initialise the agent. Pooled sandboxes are invisible in
// lists, have no end time, and are refilled in the background one boot at a
// time, so refilling never competes with live creates for more than one
// core's worth of work.
type pool struct {
	m           *Manager
	defaultSize int

	mu      sync.Mutex
	warm    map[string][]booted // guarded by mu; template id -> ready sandboxes
	filling map[string]bool     // guarded by mu; template ids being refilled
	// epoch counts drains (guarded by mu): a boot that began before a
	// drain kills its sandbox instead of pooling it (its template may have
	// changed, or nook is stopping). stopped: no more refills.
	epoch   int
	stopped bool
	fills   sync.WaitGroup // refill goroutines
}

func newPool(m *Manager, defaultSize int) *pool {
	return &pool{m: m, defaultSize: defaultSize, warm: map[string][]booted{}, filling: map[string]bool{}}
}

func (p *pool) size(tpl template.Template) int {
	if tpl.PoolSize != nil {
		return *tpl.PoolSize
	}
	return p.defaultSize
}

// claim takes a warm sandbox of tpl, if there is one and the create asks for
// nothing a pooled sandbox was not started with (a network of its own;
// pooled sandboxes boot with the template's default network).
func (p *pool) claim(tpl template.Template, o CreateOptions) (booted, bool) {
	if o.NoPool || p.size(tpl) == 0 || !reflect.ValueOf(o.Network).IsZero() {
		return booted{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.warm[tpl.ID]
	if len(list) == 0 {
		return booted{}, false
	}
	b := list[0]
	p.warm[tpl.ID] = list[1:]
	return b, true
}

// refill starts booting sandboxes of tplID in the background until its pool
// is full, unless that is already under way.
func (p *pool) refill(tplID string) {
	p.mu.Lock()
	if p.filling[tplID] || p.stopped {
		p.mu.Unlock()
		return
	}
	p.filling[tplID] = true
	p.fills.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.fills.Done()
		defer func() {
			p.mu.Lock()
			delete(p.filling, tplID)
			p.mu.Unlock()
		}()
		for {
			tpl, err := p.m.cfg.Templates.Get(tplID)
			if err != nil || tpl.State != template.StateReady {
				return
			}
			p.mu.Lock()
			n, epoch, stopped := len(p.warm[tplID]), p.epoch, p.stopped
			p.mu.Unlock()
			if n >= p.size(tpl) || stopped {
				return
			}
			p.waitIdle()
			b, err := p.m.boot(context.Background(), tpl, WithTemplateNetwork(tpl, NetworkConfig{}))
			if err != nil {
				p.m.cfg.Log.Warn("warm pool: boot failed", "template", tplID, "err", err)
				time.Sleep(time.Second)
				return
			}
			warmUp(b)
			p.mu.Lock()
			if p.epoch != epoch {
				p.mu.Unlock()
				p.discard(context.Background(), b)
				continue // drained meanwhile: check again from the top
			}
			p.warm[tplID] = append(p.warm[tplID], b)
			p.mu.Unlock()
		}
	}()
}

// refillQuiet is how long after the last create a refill boot waits: a
// new sandbox's first commands usually follow its create at once, and a
// boot (tens of ms of CPU) beside them would slow them down.
const refillQuiet = 50 * time.Millisecond

// waitIdle lets live work go first: it waits (up to a second) until no
// create is in flight and none answered within refillQuiet, so that a
// refill boot does not compete for the CPU with the create that claimed
// the pool's sandbox or with that sandbox's first commands.
func (p *pool) waitIdle() {
	for i := 0; i < 500; i++ {
		quiet := time.Since(time.Unix(0, p.m.lastCreate.Load())) >= refillQuiet
		if p.m.creating.Load() == 0 && quiet {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// drain kills the warm sandboxes of tplID (or of every template when
// tplID is empty).
func (p *pool) drain(ctx context.Context, tplID string) {
	p.mu.Lock()
	p.epoch++
	var victims []booted
	for id, list := range p.warm {
		if tplID == "" || id == tplID {
			victims = append(victims, list...)
			delete(p.warm, id)
		}
	}
	p.mu.Unlock()
	for _, b := range victims {
		p.discard(ctx, b)
	}
}

// discard kills a warm (or just booted) sandbox.
func (p *pool) discard(ctx context.Context, b booted) {
	b.agent.HTTP.CloseIdleConnections()
	if err := p.m.cleanup(ctx, b.id); err != nil {
		p.m.cfg.Log.Error("warm pool: cleanup", "id", b.id, "err", err)
	}
}

// WarmPools starts filling the pool of every ready template.
func (m *Manager) WarmPools() error {
	tpls, err := m.cfg.Templates.List()
	if err != nil {
		return err
	}
	for _, t := range tpls {
		if t.State == template.StateReady && m.pool.size(t) > 0 {
			m.pool.refill(t.ID)
		}
	}
	return nil
}

// DrainPool kills the warm sandboxes of a template (all templates when id
// is empty), e.g. before the template is deleted or changed; a sandbox
// booting for the pool meanwhile is killed when it is up.
func (m *Manager) DrainPool(ctx context.Context, templateID string) {
	m.pool.drain(ctx, templateID)
}

// StopPool ends refilling and kills every warm sandbox, including those
// booting now (it waits for them), before nook serve stops.
func (m *Manager) StopPool(ctx context.Context) {
	m.pool.mu.Lock()
	m.pool.stopped = true
	m.pool.mu.Unlock()
	m.pool.drain(ctx, "")
	m.pool.fills.Wait()
}

// PoolSizes reports how many warm sandboxes each template has now.
func (m *Manager) PoolSizes() map[string]int {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	out := map[string]int{}
	for id, list := range m.pool.warm {
		out[id] = len(list)
	}
	return out
}

// warmUp runs what a first commands.run runs (bash -l -c true, else
// sh -c true) once in a pooled sandbox, so that its claimer's first
// command does not pay for first use: the overlay root's lookups of the
// shell, the C library and the profile files, and the agent's first
// spawn (about 4 ms of a 9 ms first command here). It leaves nothing:
// the process has ended, wrote nothing, and the sandbox has no env, token
// or record yet. Failures are ignored (an image without a shell).
func warmUp(b booted) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc := processconnect.NewProcessClient(b.agent.HTTP, "http://agent")
	for _, argv := range [][]string{{"/bin/bash", "-l", "-c", "true"}, {"/bin/sh", "-c", "true"}} {
		stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
			Process: &process.ProcessConfig{Cmd: argv[0], Args: argv[1:]},
		}))
		if err != nil {
			continue
		}
		ok := false
		for stream.Receive() {
			if end := stream.Msg().GetEvent().GetEnd(); end != nil {
				ok = end.GetExitCode() == 0
			}
		}
		stream.Close()
		if ok {
			return
		}
	}
}
