package agent

import (
	"sort"
	"strings"
)

// DefaultPath is used when the agent's own environment has no PATH.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ProcessEnv derives the environment of a process started through the envd
// protocol. Without inheritImage it is: PATH from the agent's own environment
// (nothing else of it), HOME/USER/LOGNAME of the target user, the sandbox-wide
// variables set by /init, then the request's envs; later layers win. With
// inheritImage the agent's full environment replaces the PATH-only base.
// The result is sorted by name.
func ProcessEnv(agentEnv []string, inheritImage bool, u *User, sandbox, request map[string]string) []string {
	m := map[string]string{}
	for _, kv := range agentEnv {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if inheritImage || k == "PATH" {
			m[k] = v
		}
	}
	if _, ok := m["PATH"]; !ok {
		m["PATH"] = DefaultPath
	}
	if u != nil {
		m["HOME"] = u.Home
		m["USER"] = u.Name
		m["LOGNAME"] = u.Name
	}
	for k, v := range sandbox {
		if k != "" {
			m[k] = v
		}
	}
	for k, v := range request {
		if k != "" {
			m[k] = v
		}
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// envLookup returns the value of key in a KEY=VALUE list.
func envLookup(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
