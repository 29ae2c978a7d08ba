package deploy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestReleaseBinaries checks what `make release` left in $PARITY_DIST (make test sets
// it after running the target): a static, trimmed, version-stamped parity for
// linux/amd64 and linux/arm64, each listed with its hash in SHA256SUMS.
func TestReleaseBinaries(t *testing.T) {
	dist := os.Getenv("PARITY_DIST")
	if dist == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PARITY_DIST is not set: make test runs make release and sets it")
		}
		t.Skip("PARITY_DIST is not set (make test runs make release and sets it)")
	}
	sums := readSums(t, filepath.Join(dist, "SHA256SUMS"))
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			var name string
			for n := range sums {
				if strings.HasPrefix(n, "parity-") && strings.HasSuffix(n, "-linux-"+arch) {
					name = n
				}
			}
			if name == "" {
				t.Fatalf("SHA256SUMS lists no parity-<version>-linux-%s: %v", arch, sums)
			}
			p := filepath.Join(dist, name)
			if got := fileSum(t, p); got != sums[name] {
				t.Errorf("%s: sha256 %s, SHA256SUMS says %s", name, got, sums[name])
			}

			f, err := elf.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
			if f.Machine != want {
				t.Errorf("%s: ELF machine %v, want %v", name, f.Machine, want)
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
					t.Errorf("%s: has a %v program header: not a static binary", name, prog.Type)
				}
			}

			bi, err := buildinfo.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			settings := map[string]string{}
			for _, s := range bi.Settings {
				settings[s.Key] = s.Value
			}
			for k, v := range map[string]string{"CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": arch, "-trimpath": "true"} {
				if settings[k] != v {
					t.Errorf("%s: build setting %s = %q, want %q", name, k, settings[k], v)
				}
			}
			version := strings.TrimSuffix(strings.TrimPrefix(name, "parity-"), "-linux-"+arch)
			// -trimpath leaves -ldflags out of the build info: the stamped version is
			// looked for in the binary (and printed by the one this machine can run).
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(data, []byte(version)) {
				t.Errorf("%s: version %q is not stamped in the binary", name, version)
			}
			if bi.Path != "github.com/tidb-parity/parity/cmd/parity" {
				t.Errorf("%s: main package %q", name, bi.Path)
			}

			if runtime.GOOS == "linux" && runtime.GOARCH == arch {
				out, err := exec.Command(p, "version").CombinedOutput()
				if err != nil || !strings.HasPrefix(string(out), "parity "+version+" (commit ") {
					t.Errorf("%s version: %q (%v), want it to print version %s", name, out, err, version)
				}
			}
		})
	}
}

func readSums(t *testing.T, p string) map[string]string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("%s: not a sha256sum line: %q", p, sc.Text())
		}
		sums[name] = sum
	}
	return sums
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
