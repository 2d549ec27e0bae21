package runtime

import (
	"context"
	"errors"
	"fmt"
)

// Holder is a driver that can tell whether it holds anything of a sandbox.
type Holder interface {
	Holds(id string) bool
}

// Router runs each sandbox with the driver its Spec.Runtime names (the
// default driver for ""), and sends every later call for an id to the
// driver that holds it. Drivers other than the default must be Holders.
type Router struct {
	Default Runtime
	Others  map[string]Runtime
}

var (
	_ Runtime = (*Router)(nil)
	_ Pauser  = (*Router)(nil)
	_ Execer  = (*Router)(nil)
)

func (r *Router) named(name string) (Runtime, error) {
	if name == "" {
		return r.Default, nil
	}
	if d, ok := r.Others[name]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("runtime %q is not available on this nook serve", name)
}

// owner is the driver holding id (the default one when no other does).
func (r *Router) owner(id string) Runtime {
	for _, d := range r.Others {
		if h, ok := d.(Holder); ok && h.Holds(id) {
			return d
		}
	}
	return r.Default
}

func (r *Router) Start(ctx context.Context, spec Spec) error {
	d, err := r.named(spec.Runtime)
	if err != nil {
		return err
	}
	return d.Start(ctx, spec)
}

// Stop stops id in every driver (each is idempotent).
func (r *Router) Stop(ctx context.Context, id string) error {
	var errs []error
	for _, d := range r.Others {
		errs = append(errs, d.Stop(ctx, id))
	}
	errs = append(errs, r.Default.Stop(ctx, id))
	return errors.Join(errs...)
}

func (r *Router) Inspect(ctx context.Context, id string) (Info, error) {
	return r.owner(id).Inspect(ctx, id)
}

func (r *Router) List(ctx context.Context) ([]string, error) {
	ids, err := r.Default.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range r.Others {
		more, err := d.List(ctx)
		if err != nil {
			return nil, err
		}
		ids = append(ids, more...)
	}
	return ids, nil
}

func (r *Router) Exec(ctx context.Context, id string, spec ExecSpec, withStdin bool) (ExecProcess, error) {
	e, ok := r.owner(id).(Execer)
	if !ok {
		return nil, fmt.Errorf("the runtime of sandbox %s cannot exec (use the envd process API)", id)
	}
	return e.Exec(ctx, id, spec, withStdin)
}

func (r *Router) pauser(id string) (Pauser, error) {
	p, ok := r.owner(id).(Pauser)
	if !ok {
		return nil, fmt.Errorf("the runtime of sandbox %s cannot pause", id)
	}
	return p, nil
}

func (r *Router) Pause(ctx context.Context, id, dir string, keepMemory bool) (bool, error) {
	p, err := r.pauser(id)
	if err != nil {
		return false, err
	}
	return p.Pause(ctx, id, dir, keepMemory)
}

func (r *Router) Restore(ctx context.Context, spec Spec, dir string) error {
	d, err := r.named(spec.Runtime)
	if err != nil {
		return err
	}
	p, ok := d.(Pauser)
	if !ok {
		return fmt.Errorf("runtime %q cannot restore memory", spec.Runtime)
	}
	return p.Restore(ctx, spec, dir)
}

func (r *Router) CopyLayer(ctx context.Context, id, dst string) error {
	p, err := r.pauser(id)
	if err != nil {
		return err
	}
	return p.CopyLayer(ctx, id, dst)
}

func (r *Router) RootPath(id string) string {
	if p, err := r.pauser(id); err == nil {
		return p.RootPath(id)
	}
	return ""
}

func (r *Router) Freeze(ctx context.Context, id string, thaw bool) error {
	p, err := r.pauser(id)
	if err != nil {
		return err
	}
	return p.Freeze(ctx, id, thaw)
}
