package api

import (
	"errors"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

func TestSecondsField(t *testing.T) {
	for _, tc := range []struct {
		v      int64
		zeroOK bool
		want   time.Duration
		ok     bool
	}{
		{30, false, 30 * time.Second, true},
		{0, true, 0, true},
		{0, false, 0, false},
		{-1, true, 0, false},
		{18446744074 / 2, false, 0, false}, // would overflow time.Duration
		{9223372037, false, 0, false},
		{maxSeconds, false, maxSeconds * time.Second, true},
	} {
		got, err := secondsField("timeout", tc.v, tc.zeroOK)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("%d: got %v, %v; want %v", tc.v, got, err, tc.want)
		}
		if !tc.ok && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%d (zeroOK %v): got %v, %v; want ErrInvalid", tc.v, tc.zeroOK, got, err)
		}
	}
}
