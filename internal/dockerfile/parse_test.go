package dockerfile

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	df := `# syntax=docker/dockerfile:1
ARG BASE=busybox
FROM ${BASE} AS one
ENV A=1 B="two words" \
    C=3
RUN echo hi && \
    # a comment inside
    echo there
COPY --chown=user:user ["a b", "/dst/"]
CMD ["/bin/sh", "-c", "sleep 1"]
ENTRYPOINT /bin/run
EXPOSE 8080/tcp 9090
`
	got, err := Parse(df)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ARG", "FROM", "ENV", "RUN", "COPY", "CMD", "ENTRYPOINT", "EXPOSE"}
	if len(got) != len(want) {
		t.Fatalf("got %d instructions: %+v", len(got), got)
	}
	for i, in := range got {
		if in.Cmd != want[i] {
			t.Errorf("%d: %s, want %s", i, in.Cmd, want[i])
		}
	}
	if got[3].Raw != "echo hi &&  echo there" || got[3].Line != 6 {
		t.Errorf("RUN: %q line %d", got[3].Raw, got[3].Line)
	}
	if !got[4].JSONForm || got[4].Args[0] != "a b" || got[4].Flags[0] != "--chown=user:user" {
		t.Errorf("COPY: %+v", got[4])
	}
	kv, err := keyValues(got[2].Raw)
	if err != nil || len(kv) != 3 || kv[1] != [2]string{"B", "two words"} {
		t.Errorf("ENV: %v %v", kv, err)
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	for df, want := range map[string]string{
		"FROM x\n\nADD a /b\n":           "line 3: unsupported instruction ADD",
		"FROM x\nHEALTHCHECK CMD true\n": "line 2: unsupported instruction HEALTHCHECK",
		"RUN true\n":                     "line 1: RUN before FROM",
		"FROM a\nFROM b\n":               "line 2: a second FROM",
		"FROM a\nCOPY --from=x a b\n":    "line 2: COPY flag --from is not supported",
		"ENV A=1\n":                      "line 1: ENV before FROM",
		"# nothing\n":                    "no FROM",
	} {
		_, err := Parse(df)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", df, err, want)
		}
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "EMPTY": ""}
	for in, want := range map[string]string{
		"$A/b": "x/b", "${A}b": "xb", "${B:-def}": "def", "${EMPTY:-d}": "d", "${A:+alt}": "alt",
		"${B:+alt}": "", `\$A`: "$A", "$": "$", "a$1": "a$1",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}
