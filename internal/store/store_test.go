package store

import (
	"errors"
	"path/filepath"
	"testing"
)

type rec struct{ Name string }

func TestPutGetDeleteAll(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Get("b", "x", &rec{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing bucket: got %v", err)
	}
	for _, k := range []string{"b2", "a1"} {
		if err := s.Put("b", k, rec{Name: k}); err != nil {
			t.Fatal(err)
		}
	}
	var r rec
	if err := s.Get("b", "a1", &r); err != nil || r.Name != "a1" {
		t.Fatalf("get: %v %+v", err, r)
	}
	all, err := All[rec](s, "b")
	if err != nil || len(all) != 2 || all[0].Name != "a1" {
		t.Fatalf("all: %v %+v", err, all)
	}
	if err := s.Delete("b", "a1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("b", "a1", &r); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}
