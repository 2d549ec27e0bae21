// Package errdefs names the few categories of error that cross package
// boundaries. Packages wrap these with %w; the API turns them into HTTP
// status codes in exactly one place.
package errdefs

import "errors"

var (
	// ErrInvalid marks bad input from a caller.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound marks a missing sandbox, template or other named thing.
	ErrNotFound = errors.New("not found")
	// ErrConflict marks a request that clashes with the current state.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable marks a dependency that is not ready (yet).
	ErrUnavailable = errors.New("unavailable")
)
