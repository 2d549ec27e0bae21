package agent

import (
	"slices"
	"testing"
)

func TestProcessEnv(t *testing.T) {
	image := []string{"PATH=/img/bin:/usr/bin", "IMAGE_SECRET=x", "HOME=/root", "LANG=C"}
	u := &User{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}
	tests := []struct {
		name    string
		agent   []string
		inherit bool
		user    *User
		sandbox map[string]string
		request map[string]string
		want    []string
	}{
		{
			name: "path only", agent: image, user: u,
			want: []string{"HOME=/home/user", "LOGNAME=user", "PATH=/img/bin:/usr/bin", "USER=user"},
		},
		{
			name: "sandbox and request layers", agent: image, user: u,
			sandbox: map[string]string{"A": "sb", "B": "sb", "HOME": "/sbhome"},
			request: map[string]string{"B": "req", "C": "req"},
			want:    []string{"A=sb", "B=req", "C=req", "HOME=/sbhome", "LOGNAME=user", "PATH=/img/bin:/usr/bin", "USER=user"},
		},
		{
			name: "request overrides PATH", agent: image, user: u,
			sandbox: map[string]string{"PATH": "/sb"},
			request: map[string]string{"PATH": "/req"},
			want:    []string{"HOME=/home/user", "LOGNAME=user", "PATH=/req", "USER=user"},
		},
		{
			name: "no PATH in agent env", agent: []string{"X=1"}, user: u,
			want: []string{"HOME=/home/user", "LOGNAME=user", "PATH=" + DefaultPath, "USER=user"},
		},
		{
			name: "inherit image env", agent: image, inherit: true, user: u,
			request: map[string]string{"LANG": "C.UTF-8"},
			want:    []string{"HOME=/home/user", "IMAGE_SECRET=x", "LANG=C.UTF-8", "LOGNAME=user", "PATH=/img/bin:/usr/bin", "USER=user"},
		},
		{
			name: "malformed entries ignored", agent: []string{"garbage", "=x", "PATH=/p"}, user: u,
			want: []string{"HOME=/home/user", "LOGNAME=user", "PATH=/p", "USER=user"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ProcessEnv(tc.agent, tc.inherit, tc.user, tc.sandbox, tc.request)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}
