// Package agentwire holds the facts that nook serve and the in-sandbox agent
// (cmd/nook-agent) must agree on: where the agent lives inside a sandbox, how
// it is started, and how the host reaches it. It has no dependencies so that
// both binaries can import it.
//
// The contract:
//   - The agent binary is bind-mounted read-only at AgentPath and runs as the
//     sandbox's PID 1 (as container root). Its own environment is the image
//     environment; it passes that unchanged to the start command.
//   - The host directory of the sandbox's run dir is bind-mounted read-write at
//     RunDir. The agent serves HTTP/1.1 on the unix socket SocketName in it.
//     Everything that arrives on that socket comes from nook serve.
//   - Arguments: nook-agent [flags] [-- START_CMD ARGS...]. When a start command
//     is given, the agent starts it as the sandbox's main process with the
//     image environment, StartCwdFlag and StartUserFlag.
//   - On the socket the agent serves the envd protocol (Connect RPC process.Process
//     and filesystem.Filesystem, /files, /health, /envs, /init, /metrics) and
//     the tunnel: "CONNECT 127.0.0.1:PORT" opens a TCP stream to PORT on the
//     sandbox's own loopback (answered "200 Connection established", then raw
//     bytes both ways). Only loopback targets are accepted.
package agentwire

const (
	// AgentDir is the read-only directory inside the sandbox holding the agent.
	AgentDir = "/.nook/bin"
	// AgentPath is the agent binary's path inside the sandbox.
	AgentPath = AgentDir + "/nook-agent"
	// RunDir is the read-write directory shared between host and agent.
	RunDir = "/.nook/run"
	// SocketName is the agent's unix socket, relative to RunDir.
	SocketName = "agent.sock"

	// SocketFlag names the flag that gives the socket path.
	SocketFlag = "socket"
	// ListenFDFlag names the flag that gives a file descriptor on which
	// nook already listens at the socket path (so that it can connect
	// before the agent runs); when it is not a listening socket (a driver
	// that passes no files), the agent listens itself.
	ListenFDFlag = "listen-fd"
	// StartCwdFlag names the flag that gives the start command's working dir.
	StartCwdFlag = "start-cwd"
	// StartUserFlag names the flag that gives the start command's user
	// (a name, "uid" or "uid:gid").
	StartUserFlag = "start-user"

	// EnvdPort is the port the e2b SDK addresses the agent by.
	EnvdPort = 49983
	// CodeInterpreterPort is the port the code-interpreter SDK uses.
	CodeInterpreterPort = 49999
	// SeccompExecCmd is the agent's command that installs the sandbox's
	// seccomp filter (read from the file given as its first argument) and
	// then runs the command after "--": nook-agent seccomp-exec FILTER --
	// ARGV... PID 1 and every `runc exec` process start through it when
	// nook compiled the filter itself; with the agent's own path as ARGV[0]
	// it goes on as the agent in the same process.
	SeccompExecCmd = "seccomp-exec"
	// SeccompFilterPath is where the compiled filter is mounted read-only.
	SeccompFilterPath = AgentDir + "/seccomp.bpf"
	// InterpPath is nook-interp's path inside the sandbox (mounted read-only
	// beside the agent when the template has a code interpreter).
	InterpPath = AgentDir + "/nook-interp"
	// CodeInterpreterFlag makes the agent run InterpPath as a service
	// serving run_code on 127.0.0.1:CodeInterpreterPort with the image env.
	CodeInterpreterFlag = "code-interpreter"
	// RunCodeInheritEnvFlag makes run_code also see the sandbox env (/init).
	RunCodeInheritEnvFlag = "run-code-inherit-env"

	// EnvdVersion is the envd protocol version the agent reports. The e2b SDK
	// enables features by it (stdin 0.3.0, default user 0.4.0, CloseStdin
	// 0.5.2, octet-stream upload 0.5.7, file metadata 0.6.2).
	EnvdVersion = "0.6.2"

	// LaunchEnvHeader, set to LaunchEnvExact on a process Start, makes the
	// agent launch the process with exactly the request's envs (nook serve
	// derived the full environment with envmodel: native exec/terminals).
	// Only nook serve may send it: the proxy strips it from sandbox traffic.
	LaunchEnvHeader = "X-Nook-Launch-Env"
	LaunchEnvExact  = "exact"
	// ControlPrefix is the path prefix of agent routes reserved for nook
	// serve (e.g. /nook/signal); the proxy refuses it, like /init.
	ControlPrefix = "/nook/"
)
