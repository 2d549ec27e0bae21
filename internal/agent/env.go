package agent

import (
	"strings"

	"github.com/nookhq/nook/internal/envmodel"
)

// DefaultPath is used when the agent's own environment has no PATH.
const DefaultPath = envmodel.DefaultPath

// ProcessEnv derives the environment of a process started through the envd
// protocol. Without inheritImage it is: PATH from the agent's own environment
// (nothing else of it), HOME/USER/LOGNAME of the target user, the sandbox-wide
// variables set by /init, then the request's envs; later layers win. With
// inheritImage the agent's full environment replaces the PATH-only base.
// The result is sorted by name. The rules live in envmodel.Envd.
func ProcessEnv(agentEnv []string, inheritImage bool, u *User, sandbox, request map[string]string) []string {
	var eu *envmodel.User
	if u != nil {
		eu = &envmodel.User{Name: u.Name, Home: u.Home}
	}
	return envmodel.Envd(envmodel.Parse(agentEnv), eu, sandbox, request,
		envmodel.Options{EnvdInheritImage: inheritImage}).List()
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
