package template

import (
	"errors"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/errdefs"
)

func TestNormalizeCIDRs(t *testing.T) {
	got, err := NormalizeCIDRs("allowOut", []string{"10.1.2.3/16", "198.18.0.2", " 10.1.0.0/16 ", "fd00::1"})
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(got, " "); s != "10.1.0.0/16 198.18.0.2/32 fd00::1/128" {
		t.Fatalf("got %q", s)
	}
	for _, bad := range []string{"", "example.com", "*.example.com", "10.0.0.0/33", "1.2.3"} {
		if _, err := NormalizeCIDRs("denyOut", []string{bad}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
