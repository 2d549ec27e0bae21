// Package seccomp compiles an OCI seccomp profile into a classic BPF
// program once, in Go, and installs such a program in the calling process.
//
// runc compiles a sandbox's profile with libseccomp at every start, which
// costs a create more than a third of runc's time here. nook compiles
// Docker's default profile once per serve instead, and the sandbox's PID 1
// (nook-agent, before anything else runs) and every `runc exec` process
// (through nook-agent's seccomp-exec) install the compiled program.
//
// Semantics follow libseccomp's for one native architecture: a system call
// of another ABI (another AUDIT_ARCH, or x86_64's x32 numbers) kills the
// process; a call named by an unconditional rule gets that rule's action;
// otherwise the call's argument rules are tried in order (all comparisons
// of a rule must hold; comparisons are on the full 64-bit argument); a
// call numbered above every call this package knows returns ENOSYS (so
// that C libraries fall back from system calls newer than the filter, as
// runc arranges); anything else gets the profile's default action.
package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Return values of a seccomp filter (linux/seccomp.h).
const (
	retKillProcess = 0x80000000
	retKillThread  = 0x00000000
	retTrap        = 0x00030000
	retErrno       = 0x00050000
	retLog         = 0x7ffc0000
	retAllow       = 0x7fff0000
)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

const (
	auditArchX86_64 = 0xc000003e // AUDIT_ARCH_X86_64
	x32SyscallBit   = 0x40000000 // __X32_SYSCALL_BIT
)

// ErrUnsupported: the profile (or this machine's architecture) is not one
// this package compiles; the caller should let the runtime compile it.
var ErrUnsupported = errors.New("seccomp profile not supported by nook's compiler")

// Compile turns p into a BPF program for x86_64. Profiles for other
// architectures, with flags, a listener or actions it does not know
// are ErrUnsupported.
func Compile(p *specs.LinuxSeccomp) ([]bpf.Instruction, error) {
	if p == nil {
		return nil, fmt.Errorf("no profile: %w", ErrUnsupported)
	}
	if len(p.Architectures) != 1 || p.Architectures[0] != specs.ArchX86_64 {
		return nil, fmt.Errorf("architectures %v (only [%s]): %w", p.Architectures, specs.ArchX86_64, ErrUnsupported)
	}
	if len(p.Flags) > 0 || p.ListenerPath != "" {
		return nil, fmt.Errorf("flags or listener: %w", ErrUnsupported)
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, err
	}
	// Per system call: an unconditional action, or conditional rules.
	type rule struct {
		args []specs.LinuxSeccompArg
		ret  uint32
	}
	type call struct {
		uncond *uint32
		rules  []rule
	}
	calls := map[uint32]*call{}
	for _, sc := range p.Syscalls {
		ret, err := action(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, err
		}
		for _, name := range sc.Names {
			nr, ok := sysnumAMD64[name]
			if !ok {
				continue // another ABI's call, or one this kernel table lacks
			}
			c := calls[nr]
			if c == nil {
				c = &call{}
				calls[nr] = c
			}
			if len(sc.Args) == 0 {
				if c.uncond != nil && *c.uncond != ret {
					return nil, fmt.Errorf("system call %s has two unconditional actions: %w", name, ErrUnsupported)
				}
				r := ret
				c.uncond = &r
				continue
			}
			c.rules = append(c.rules, rule{args: sc.Args, ret: ret})
		}
	}
	nrs := make([]uint32, 0, len(calls))
	for nr := range calls {
		nrs = append(nrs, nr)
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })

	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX86_64, SkipTrue: 1},
		bpf.RetConstant{Val: retKillProcess},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
		bpf.RetConstant{Val: retKillProcess},
	}
	for _, nr := range nrs {
		c := calls[nr]
		if c.uncond != nil {
			prog = append(prog,
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1},
				bpf.RetConstant{Val: *c.uncond})
			continue
		}
		// The rules of nr, then the default; A holds nr again only after
		// the block, which always returns.
		block := []bpf.Instruction{bpf.RetConstant{Val: def}}
		for i := len(c.rules) - 1; i >= 0; i-- {
			r, err := ruleCode(c.rules[i].args, c.rules[i].ret)
			if err != nil {
				return nil, err
			}
			block = append(r, block...)
		}
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: 1},
			bpf.Jump{Skip: uint32(len(block))})
		prog = append(prog, block...)
	}
	prog = append(prog,
		bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: maxKnown(), SkipFalse: 1},
		bpf.RetConstant{Val: retErrno | uint32(unix.ENOSYS)},
		bpf.RetConstant{Val: def})
	if len(prog) > 4096 {
		return nil, fmt.Errorf("program of %d instructions exceeds the kernel's 4096", len(prog))
	}
	if _, err := bpf.Assemble(prog); err != nil {
		return nil, err
	}
	return prog, nil
}

func maxKnown() uint32 {
	var m uint32
	for _, nr := range sysnumAMD64 {
		m = max(m, nr)
	}
	return m
}

func action(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return retAllow, nil
	case specs.ActErrno:
		e := uint32(unix.EPERM)
		if errnoRet != nil {
			e = uint32(*errnoRet)
		}
		if e > 0xffff {
			return 0, fmt.Errorf("errno %d out of range", e)
		}
		return retErrno | e, nil
	case specs.ActKill, specs.ActKillThread:
		return retKillThread, nil
	case specs.ActKillProcess:
		return retKillProcess, nil
	case specs.ActTrap:
		return retTrap, nil
	case specs.ActLog:
		return retLog, nil
	}
	return 0, fmt.Errorf("action %s: %w", a, ErrUnsupported)
}

// ruleCode is the code of one rule: every comparison must hold for the
// final return of ret; a failed comparison jumps past the rule.
func ruleCode(args []specs.LinuxSeccompArg, ret uint32) ([]bpf.Instruction, error) {
	code := []bpf.Instruction{bpf.RetConstant{Val: ret}}
	for i := len(args) - 1; i >= 0; i-- {
		c, err := compare(args[i], len(code))
		if err != nil {
			return nil, err
		}
		code = append(c, code...)
	}
	return code, nil
}

// compare is the code of one 64-bit comparison. Its instructions fall
// through past its end when the comparison holds, and jump fail
// instructions past its end when it does not.
func compare(a specs.LinuxSeccompArg, fail int) ([]bpf.Instruction, error) {
	if a.Index > 5 {
		return nil, fmt.Errorf("argument index %d: %w", a.Index, ErrUnsupported)
	}
	lo := uint32(offArgs + 8*a.Index)
	hi := lo + 4
	vhi, vlo := uint32(a.Value>>32), uint32(a.Value)
	// Targets as symbolic positions: pass = end of this code, failT =
	// beyond it by fail; resolved into skips below.
	const pass, failT = -1, -2
	type jmp struct {
		cond    bpf.JumpTest
		val     uint32
		ifTrue  int // 0: next instruction; else pass or failT
		ifFalse int
	}
	var seq []any // bpf.Instruction or jmp
	switch a.Op {
	case specs.OpEqualTo:
		seq = []any{bpf.LoadAbsolute{Off: hi, Size: 4}, jmp{bpf.JumpEqual, vhi, 0, failT},
			bpf.LoadAbsolute{Off: lo, Size: 4}, jmp{bpf.JumpEqual, vlo, 0, failT}}
	case specs.OpNotEqual:
		seq = []any{bpf.LoadAbsolute{Off: hi, Size: 4}, jmp{bpf.JumpEqual, vhi, 0, pass},
			bpf.LoadAbsolute{Off: lo, Size: 4}, jmp{bpf.JumpEqual, vlo, failT, 0}}
	case specs.OpMaskedEqual:
		dhi, dlo := uint32(a.ValueTwo>>32), uint32(a.ValueTwo)
		seq = []any{bpf.LoadAbsolute{Off: hi, Size: 4}, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: vhi}, jmp{bpf.JumpEqual, dhi, 0, failT},
			bpf.LoadAbsolute{Off: lo, Size: 4}, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: vlo}, jmp{bpf.JumpEqual, dlo, 0, failT}}
	case specs.OpLessThan, specs.OpLessEqual:
		loTest := bpf.JumpGreaterOrEqual // lo < v fails when lo >= v
		if a.Op == specs.OpLessEqual {
			loTest = bpf.JumpGreaterThan
		}
		seq = []any{bpf.LoadAbsolute{Off: hi, Size: 4}, jmp{bpf.JumpGreaterThan, vhi, failT, 0}, jmp{bpf.JumpEqual, vhi, 0, pass},
			bpf.LoadAbsolute{Off: lo, Size: 4}, jmp{loTest, vlo, failT, 0}}
	case specs.OpGreaterThan, specs.OpGreaterEqual:
		loTest := bpf.JumpGreaterThan
		if a.Op == specs.OpGreaterEqual {
			loTest = bpf.JumpGreaterOrEqual
		}
		seq = []any{bpf.LoadAbsolute{Off: hi, Size: 4}, jmp{bpf.JumpGreaterThan, vhi, pass, 0}, jmp{bpf.JumpEqual, vhi, 0, failT},
			bpf.LoadAbsolute{Off: lo, Size: 4}, jmp{loTest, vlo, 0, failT}}
	default:
		return nil, fmt.Errorf("comparison %s: %w", a.Op, ErrUnsupported)
	}
	out := make([]bpf.Instruction, len(seq))
	for i, s := range seq {
		j, ok := s.(jmp)
		if !ok {
			out[i] = s.(bpf.Instruction)
			continue
		}
		skip := func(t int) (uint8, error) {
			n := 0
			switch t {
			case pass:
				n = len(seq) - i - 1
			case failT:
				n = len(seq) - i - 1 + fail
			}
			if n > 255 {
				return 0, fmt.Errorf("rule too long for a conditional jump: %w", ErrUnsupported)
			}
			return uint8(n), nil
		}
		st, err := skip(j.ifTrue)
		if err != nil {
			return nil, err
		}
		sf, err := skip(j.ifFalse)
		if err != nil {
			return nil, err
		}
		out[i] = bpf.JumpIf{Cond: j.cond, Val: j.val, SkipTrue: st, SkipFalse: sf}
	}
	return out, nil
}

// Marshal encodes a program as the kernel's struct sock_filter array.
func Marshal(prog []bpf.Instruction) ([]byte, error) {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
}

// InstallFile reads a program written by Marshal and installs it on every
// thread of the calling process, with no_new_privs set first.
func InstallFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	if len(data) == 0 || len(data)%8 != 0 || len(data)/8 > 4096 {
		return fmt.Errorf("seccomp filter %s: %d bytes is not a program", path, len(data))
	}
	filter := make([]unix.SockFilter, len(data)/8)
	for i := range filter {
		b := data[8*i:]
		filter[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("install seccomp filter: thread %d could not be synchronised", r)
	}
	return nil
}
