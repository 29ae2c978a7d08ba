package api

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// TestREADMEFieldNames checks api/README.md against the proto: every grpcurl request
// body (-d '{…}') and every answer it shows decode strictly (no unknown field) as the
// method's request and response, and every field a paragraph names in backticks is a
// field of the method it last named (its request or response, or a message inside
// them). The README once told CutoverCheck's callers to set `timeout`, a field it does
// not have (it is wait_timeout).
func TestREADMEFieldNames(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	services := map[string]protoreflect.ServiceDescriptor{
		"Parity": parityv1.File_parity_v1_parity_proto.Services().ByName("Parity"),
		"Fleet":  parityv1.File_parity_v1_fleet_proto.Services().ByName("Fleet"),
	}
	for name, d := range services {
		if d == nil {
			t.Fatalf("parity.v1.%s not in the descriptor", name)
		}
	}
	readme := parseREADME(string(raw))
	if len(readme.commands) < 15 || len(readme.paragraphs) < 10 {
		t.Fatalf("README parsed into %d commands and %d paragraphs: the parser no longer reads it", len(readme.commands), len(readme.paragraphs))
	}

	// The grpcurl commands: requests and answers.
	methodRE := regexp.MustCompile(`parity\.v1\.(Parity|Fleet)/(\w+)`)
	bodyRE := regexp.MustCompile(`-d '([^']*)'`)
	checked := map[string]bool{}
	for _, c := range readme.commands {
		m := methodRE.FindStringSubmatch(c.line)
		if m == nil {
			continue
		}
		svc := services[m[1]]
		m = m[1:] // m[1]: the method
		md := svc.Methods().ByName(protoreflect.Name(m[1]))
		if md == nil {
			t.Errorf("line %d: %s is not a method of %s", c.lineNo, m[1], svc.FullName())
			continue
		}
		checked[string(md.FullName())] = true
		if b := bodyRE.FindStringSubmatch(c.line); b != nil {
			if err := protojson.Unmarshal([]byte(b[1]), dynamicpb.NewMessage(md.Input())); err != nil {
				t.Errorf("line %d: %s's request %s: %v", c.lineNo, m[1], b[1], err)
			}
		}
		if strings.HasPrefix(strings.TrimSpace(c.output), "ERROR:") {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(untrim(c.output)))
		n := 0
		for {
			var msg json.RawMessage
			if err := dec.Decode(&msg); err == io.EOF {
				break
			} else if err != nil {
				t.Errorf("line %d: %s's answer is not JSON once the … lines are removed: %v\n%s", c.lineNo, m[1], err, c.output)
				break
			}
			n++
			if err := protojson.Unmarshal(msg, dynamicpb.NewMessage(md.Output())); err != nil {
				t.Errorf("line %d: %s's answer: %v", c.lineNo, m[1], err)
			}
		}
		if n == 0 {
			t.Errorf("line %d: %s shows no answer", c.lineNo, m[1])
		}
	}
	for _, svc := range services {
		for i := range svc.Methods().Len() {
			if md := svc.Methods().Get(i); !checked[string(md.FullName())] {
				t.Errorf("the README shows no grpcurl call of %s", md.Name())
			}
		}
	}

	// The prose: a backticked field name belongs to the method named last before it.
	tokenRE := regexp.MustCompile("\\*\\*(\\w+)\\*\\*|`([^`]+)`")
	identRE := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	named := 0
	for _, p := range readme.paragraphs {
		var method protoreflect.MethodDescriptor
		for _, m := range tokenRE.FindAllStringSubmatch(p.text, -1) {
			word := m[1] + m[2]
			if md := methodNamed(services, word); md != nil {
				method = md
				continue
			}
			if method == nil || m[2] == "" || !identRE.MatchString(word) {
				continue
			}
			named++
			if !hasField(method, word) {
				t.Errorf("line %d: `%s` is not a field of %s (its request %s or response %s): %q", p.lineNo, word, method.Name(),
					method.Input().Name(), method.Output().Name(), p.text)
			}
		}
	}
	if named < 15 {
		t.Errorf("only %d field names found in the README's prose: the parser no longer reads it", named)
	}
}

// methodNamed is the method of one of services named name (nil: none).
func methodNamed(services map[string]protoreflect.ServiceDescriptor, name string) protoreflect.MethodDescriptor {
	for _, svc := range services {
		if md := svc.Methods().ByName(protoreflect.Name(name)); md != nil {
			return md
		}
	}
	return nil
}

// readmeCommand is a console block's command (continuation lines joined) and what it
// printed.
type readmeCommand struct {
	lineNo       int
	line, output string
}

type readmeParagraph struct {
	lineNo int
	text   string
}

type readme struct {
	commands   []readmeCommand
	paragraphs []readmeParagraph
}

// parseREADME splits markdown into the commands of its console blocks and its prose
// paragraphs (a list item is a paragraph of its own).
func parseREADME(s string) readme {
	var r readme
	lines := strings.Split(s, "\n")
	inFence, console := false, false
	var cur *readmeCommand
	var para *readmeParagraph
	endPara := func() {
		if para != nil {
			r.paragraphs = append(r.paragraphs, *para)
			para = nil
		}
	}
	endCmd := func() {
		if cur != nil {
			r.commands = append(r.commands, *cur)
			cur = nil
		}
	}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			endPara()
			endCmd()
			if !inFence {
				console = strings.TrimSpace(l) == "```console"
			}
			inFence = !inFence
			continue
		}
		if inFence {
			if !console {
				continue
			}
			if strings.HasPrefix(l, "$ ") {
				endCmd()
				cur = &readmeCommand{lineNo: i + 1, line: strings.TrimPrefix(l, "$ ")}
				for strings.HasSuffix(cur.line, `\`) && i+1 < len(lines) {
					i++
					cur.line = strings.TrimSuffix(cur.line, `\`) + " " + strings.TrimSpace(lines[i])
				}
				continue
			}
			if cur != nil {
				cur.output += l + "\n"
			}
			continue
		}
		trimmed := strings.TrimSpace(l)
		switch {
		case trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "|"):
			endPara()
		case strings.HasPrefix(trimmed, "- "):
			endPara()
			para = &readmeParagraph{lineNo: i + 1, text: trimmed}
		case para == nil:
			para = &readmeParagraph{lineNo: i + 1, text: trimmed}
		default:
			para.text += " " + trimmed
		}
	}
	endPara()
	endCmd()
	return r
}

var trailingComma = regexp.MustCompile(`,(\s*[}\]])`)

// untrim makes an answer trimmed with … lines JSON again: the … lines go, and the
// commas left before a closing bracket.
func untrim(out string) string {
	var b bytes.Buffer
	for _, l := range strings.Split(out, "\n") {
		if t := strings.TrimSpace(l); t == "…" || t == "…," {
			continue
		}
		b.WriteString(l + "\n")
	}
	return trailingComma.ReplaceAllString(b.String(), "$1")
}

// hasField reports whether name is a field of the method's request or response or of a
// message inside them.
func hasField(md protoreflect.MethodDescriptor, name string) bool {
	seen := map[protoreflect.FullName]bool{}
	var walk func(m protoreflect.MessageDescriptor) bool
	walk = func(m protoreflect.MessageDescriptor) bool {
		if seen[m.FullName()] || strings.HasPrefix(string(m.FullName()), "google.protobuf.") {
			return false
		}
		seen[m.FullName()] = true
		if m.Fields().ByName(protoreflect.Name(name)) != nil || m.Oneofs().ByName(protoreflect.Name(name)) != nil {
			return true
		}
		for i := range m.Fields().Len() {
			f := m.Fields().Get(i)
			if f.IsMap() {
				f = f.MapValue()
			}
			if f.Message() != nil && walk(f.Message()) {
				return true
			}
		}
		return false
	}
	return walk(md.Input()) || walk(md.Output())
}
