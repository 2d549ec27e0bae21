package proxy

import (
	"context"

	"github.com/nookhq/nook/internal/agentclient"
)

// Resumer resumes a paused sandbox whose lifecycle allows resuming on
// traffic (E2B autoResume); the sandbox manager is one.
type Resumer interface {
	AutoResume(ctx context.Context, id string) error
}

// autoResume resumes paused sandbox id if Agents can, and returns its
// agent; otherwise it returns pausedErr (or why resuming failed).
func (p *Proxy) autoResume(ctx context.Context, id string, pausedErr error) (*agentclient.Client, error) {
	rs, ok := p.Agents.(Resumer)
	if !ok {
		return nil, pausedErr
	}
	if err := rs.AutoResume(context.WithoutCancel(ctx), id); err != nil {
		return nil, err
	}
	agent, _, err := p.Agents.Agent(id)
	return agent, err
}
