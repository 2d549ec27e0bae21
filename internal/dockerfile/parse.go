// Package dockerfile parses Dockerfiles and builds them into layers without a
// Docker daemon: FROM an image source or a template, RUN in nook's own
// runtime, COPY from the build context, and the config instructions.
package dockerfile

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
)

// Instruction is one Dockerfile instruction.
type Instruction struct {
	Line     int      // 1-based line it starts on
	Cmd      string   // upper case: FROM, RUN, ...
	Flags    []string // --name=value flags before the arguments
	Args     []string // the JSON form's elements, or the shell form split on spaces
	Raw      string   // the arguments as written (after the flags)
	JSONForm bool
}

func (in Instruction) String() string { return in.Cmd + " " + in.Raw }

// Supported instructions; LABEL and MAINTAINER are accepted and ignored.
var supported = map[string]bool{
	"FROM": true, "RUN": true, "ENV": true, "ARG": true, "COPY": true, "WORKDIR": true,
	"USER": true, "CMD": true, "ENTRYPOINT": true, "EXPOSE": true, "LABEL": true, "MAINTAINER": true,
}

// ParseFile parses the Dockerfile at path.
func ParseFile(path string) ([]Instruction, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(string(data))
}

// Parse parses a Dockerfile. Every error names its line.
func Parse(text string) ([]Instruction, error) {
	var out []Instruction
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// Continuations: a trailing backslash joins the next line; comment
		// lines inside a continuation are dropped.
		for strings.HasSuffix(line, "\\") {
			line = strings.TrimSuffix(line, "\\")
			i++
			for i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "#") {
				i++
			}
			if i >= len(lines) {
				break
			}
			line += " " + strings.TrimSpace(lines[i])
		}
		cmd, rest, _ := strings.Cut(line, " ")
		cmd = strings.ToUpper(cmd)
		if !supported[cmd] {
			return nil, fmt.Errorf("Dockerfile line %d: unsupported instruction %s (nook supports FROM, RUN, ENV, ARG, COPY, WORKDIR, USER, CMD, ENTRYPOINT, EXPOSE, LABEL): %w",
				start, cmd, errdefs.ErrInvalid)
		}
		in := Instruction{Line: start, Cmd: cmd}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			flag, r, _ := strings.Cut(rest, " ")
			in.Flags = append(in.Flags, flag)
			rest = strings.TrimSpace(r)
		}
		in.Raw = rest
		if strings.HasPrefix(rest, "[") && (cmd == "RUN" || cmd == "CMD" || cmd == "ENTRYPOINT" || cmd == "COPY") {
			var arr []string
			if err := json.Unmarshal([]byte(rest), &arr); err == nil {
				in.Args, in.JSONForm = arr, true
			}
		}
		if !in.JSONForm {
			in.Args = strings.Fields(rest)
		}
		if len(in.Args) == 0 && cmd != "CMD" && cmd != "ENTRYPOINT" {
			return nil, fmt.Errorf("Dockerfile line %d: %s needs arguments: %w", start, cmd, errdefs.ErrInvalid)
		}
		out = append(out, in)
	}
	froms := 0
	for _, in := range out {
		if in.Cmd == "FROM" {
			froms++
			if froms > 1 {
				return nil, fmt.Errorf("Dockerfile line %d: a second FROM (multi-stage builds are not supported): %w", in.Line, errdefs.ErrInvalid)
			}
		} else if froms == 0 && in.Cmd != "ARG" {
			return nil, fmt.Errorf("Dockerfile line %d: %s before FROM: %w", in.Line, in.Cmd, errdefs.ErrInvalid)
		}
	}
	if froms == 0 {
		return nil, fmt.Errorf("Dockerfile has no FROM: %w", errdefs.ErrInvalid)
	}
	for _, in := range out {
		for _, f := range in.Flags {
			name, _, _ := strings.Cut(f, "=")
			if !(in.Cmd == "COPY" && (name == "--chown" || name == "--chmod")) && !(in.Cmd == "FROM" && name == "--platform") {
				return nil, fmt.Errorf("Dockerfile line %d: %s flag %s is not supported: %w", in.Line, in.Cmd, name, errdefs.ErrInvalid)
			}
		}
	}
	return out, nil
}

// expand substitutes $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alt} from
// vars; "\$" stays a literal "$".
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			body := s[i+2 : i+end]
			i += end
			name, word, mod := body, "", ""
			if k := strings.Index(body, ":-"); k >= 0 {
				name, word, mod = body[:k], body[k+2:], "-"
			} else if k := strings.Index(body, ":+"); k >= 0 {
				name, word, mod = body[:k], body[k+2:], "+"
			}
			v, ok := vars[name]
			switch {
			case mod == "-" && (!ok || v == ""):
				b.WriteString(word)
			case mod == "+":
				if ok && v != "" {
					b.WriteString(word)
				}
			default:
				b.WriteString(v)
			}
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || j > i+1 && s[j] >= '0' && s[j] <= '9') {
			j++
		}
		if j == i+1 {
			b.WriteByte(c)
			continue
		}
		b.WriteString(vars[s[i+1:j]])
		i = j - 1
	}
	return b.String()
}

// keyValues parses ENV/ARG/LABEL arguments: "K=V K2=V2" (values may be
// quoted) or the legacy "K V..." form.
func keyValues(raw string) ([][2]string, error) {
	raw = strings.TrimSpace(raw)
	words, err := splitQuoted(raw)
	if err != nil {
		return nil, err
	}
	if len(words) > 0 && !strings.Contains(words[0], "=") {
		// Legacy form: the rest of the line is the value.
		k, v, _ := strings.Cut(raw, " ")
		return [][2]string{{k, strings.TrimSpace(v)}}, nil
	}
	var out [][2]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want NAME=VALUE", w)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// splitQuoted splits on unquoted spaces and removes the quotes.
func splitQuoted(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' && i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			} else {
				cur.WriteByte(c)
			}
		case c == '"' || c == '\'':
			quote, in = c, true
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			in = true
		case c == ' ' || c == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}
