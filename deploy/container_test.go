package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// dockerfile is a parsed Dockerfile: its instructions (continuations joined), in order.
type instruction struct{ cmd, args string }

func parseDockerfile(t *testing.T, p string) []instruction {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur string
	for _, line := range strings.Split(string(data), "\n") {
		l := strings.TrimSpace(line)
		if cur == "" && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if strings.HasPrefix(l, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(l, `\`); ok {
			cur += s + " "
			continue
		}
		cur += l
		cmd, args, _ := strings.Cut(cur, " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur = ""
	}
	return out
}

// TestDockerfile checks the container build file textually (no test depends on docker
// reaching a registry): a Go builder matching go.mod's Go version, a static build with
// the release flags, and a final stage that is distroless-static or scratch, running as
// a non-root user, exposing both ports, starting `parity serve`.
func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t, "container/Dockerfile")
	var froms []int
	for i, in := range ins {
		if in.cmd == "FROM" {
			froms = append(froms, i)
		}
	}
	if len(froms) < 2 {
		t.Fatalf("%d FROM lines: want a multi-stage build", len(froms))
	}

	// The builder: golang:<go.mod's go version>.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVer == nil {
		t.Fatal("no go directive in ../go.mod")
	}
	builder := ins[froms[0]].args
	if !regexp.MustCompile(`(^|\s)golang:` + regexp.QuoteMeta(string(goVer[1])) + `[-.\s]`).MatchString(builder + " ") {
		t.Errorf("builder FROM %q: want golang:%s (go.mod's go version)", builder, goVer[1])
	}
	build := ""
	for _, in := range ins[froms[0]:froms[len(froms)-1]] {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			build = in.args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=", "-X main.commit=", "./cmd/parity"} {
		if !strings.Contains(build, want) {
			t.Errorf("builder's go build %q lacks %s", build, want)
		}
	}

	final := ins[froms[len(froms)-1]:]
	base := final[0].args
	distroless := regexp.MustCompile(`^gcr\.io/distroless/static(-debian\d+)?:nonroot$`).MatchString(base)
	if !distroless && base != "scratch" {
		t.Errorf("final stage FROM %q: want gcr.io/distroless/static-debian12:nonroot or scratch", base)
	}
	user := ""
	var expose []string
	entry := ""
	copied := false
	for _, in := range final[1:] {
		switch in.cmd {
		case "USER":
			user = in.args
		case "EXPOSE":
			expose = append(expose, strings.Fields(in.args)...)
		case "ENTRYPOINT":
			entry = in.args
		case "COPY":
			copied = copied || strings.HasPrefix(in.args, "--from=")
		case "RUN":
			t.Errorf("final stage runs %q: it has no shell", in.args)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || uid == "root" {
		t.Errorf("final stage USER %q: want a non-root user", user)
	}
	if !copied {
		t.Error("final stage copies nothing from the builder")
	}
	for _, p := range []string{"8390", "8391"} {
		if !strings.Contains(" "+strings.Join(expose, " ")+" ", " "+p+" ") && !strings.Contains(strings.Join(expose, " "), p+"/tcp") {
			t.Errorf("EXPOSE %v lacks %s", expose, p)
		}
	}
	if !regexp.MustCompile(`^\["[^"]*/parity",\s*"serve"\]$`).MatchString(entry) {
		t.Errorf("ENTRYPOINT %s: want [\".../parity\", \"serve\"] (exec form)", entry)
	}
}
