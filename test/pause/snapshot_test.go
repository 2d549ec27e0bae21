package pause

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type snapshotRec struct {
	ID        string   `json:"id"`
	SandboxID string   `json:"sandboxID"`
	Layers    []string `json:"layers"`
	SizeBytes int64    `json:"sizeBytes"`
	Digest    string   `json:"digest"`
}

func TestSnapshotCreateFromRollbackClone(t *testing.T) {
	src := create(t, nil)
	run(t, src, "echo v1 > /home/user/s.txt && rm /etc/motd && chown user /home/user/s.txt")
	// E2B face: POST /sandboxes/{id}/snapshots.
	r := api(t, "POST", "/sandboxes/"+src+"/snapshots", map[string]string{})
	want(t, r, http.StatusCreated, "create snapshot")
	e2b := decodeBody[struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}](t, r)
	if e2b.SnapshotID == "" || len(e2b.Names) != 1 {
		t.Fatalf("snapshot answer: %s", r)
	}
	snap := e2b.SnapshotID
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/snapshots/"+snap, nil, nil) })
	r = api(t, "GET", "/snapshots?sandboxID="+src, nil)
	if !strings.Contains(string(r.Body), snap) {
		t.Errorf("GET /snapshots?sandboxID: %s", r)
	}
	rec := decodeBody[snapshotRec](t, api(t, "GET", "/v1/snapshots/"+snap+"?verify=true", nil))
	t.Logf("snapshot %s: %d bytes, layers %v", snap, rec.SizeBytes, rec.Layers)

	run(t, src, "echo v2 > /home/user/s.txt && echo later > /home/user/later")

	// Create from the snapshot: it is a template id.
	from := create(t, map[string]any{"templateID": snap})
	if got := run(t, from, "cat /home/user/s.txt; stat -c %U /home/user/s.txt; test ! -e /etc/motd && echo motd-gone; test ! -e /home/user/later && echo no-later"); got != "v1\nuser\nmotd-gone\nno-later\n" {
		t.Errorf("sandbox from snapshot sees %q", got)
	}

	// Clone: copies of the source as it is now.
	r = api(t, "POST", "/v1/sandboxes/"+src+"/clone", map[string]any{"count": 2, "timeout": 600})
	want(t, r, http.StatusCreated, "clone")
	var clones []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
		Error json.RawMessage `json:"error"`
	}
	json.Unmarshal(r.Body, &clones)
	if len(clones) != 2 {
		t.Fatalf("clone answer: %s", r)
	}
	for _, c := range clones {
		if c.Sandbox == nil {
			t.Fatalf("clone failed: %s", c.Error)
		}
		id := c.Sandbox.SandboxID
		t.Cleanup(func() { doErr("DELETE", apiURL+"/sandboxes/"+id, nil, nil) })
		if got := run(t, id, "cat /home/user/s.txt /home/user/later"); got != "v2\nlater\n" {
			t.Errorf("clone %s sees %q", id, got)
		}
		if id == src {
			t.Errorf("a clone has the source's id")
		}
	}
	// Clones are independent of each other and of the source.
	run(t, clones[0].Sandbox.SandboxID, "echo mine > /home/user/s.txt")
	if got := run(t, src, "cat /home/user/s.txt"); got != "v2\n" {
		t.Errorf("source changed by its clone: %q", got)
	}

	// Roll the source back to the snapshot.
	cli(t, "sandbox", "rollback", src, snap)
	if got := run(t, src, "cat /home/user/s.txt; test ! -e /home/user/later && echo no-later"); got != "v1\nno-later\n" {
		t.Errorf("after rollback the source sees %q", got)
	}
	// In use: not deletable.
	want(t, api(t, "DELETE", "/v1/snapshots/"+snap, nil), http.StatusConflict, "delete a snapshot in use")
	if out := cli(t, "snapshot", "ls"); !strings.Contains(out, snap) {
		t.Errorf("nook snapshot ls: %q", out)
	}
	for _, id := range []string{src, from} {
		want(t, api(t, "DELETE", "/sandboxes/"+id, nil), http.StatusNoContent, "kill")
	}
	cli(t, "snapshot", "rm", snap)
	want(t, api(t, "GET", "/v1/snapshots/"+snap, nil), http.StatusNotFound, "deleted snapshot")
}

func TestSnapshotOfPausedSandbox(t *testing.T) {
	id := create(t, nil)
	run(t, id, "echo paused-state > /home/user/p")
	pause(t, id, nil)
	snap := strings.TrimSpace(cli(t, "sandbox", "snapshot", "--name", "paused-"+id[:8], id))
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/snapshots/"+snap, nil, nil) })
	from := create(t, map[string]any{"templateID": snap})
	if got := run(t, from, "cat /home/user/p"); got != "paused-state\n" {
		t.Errorf("from a snapshot of a paused sandbox: %q", got)
	}
}
