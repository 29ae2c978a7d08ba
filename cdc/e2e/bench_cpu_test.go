package e2e

// bench_cpu_test.go is what one arm of an applier pair costs, read from the OS: the
// fallback's, the broker's and the bench's own CPU time, the machine's and core 0's use
// (/proc/stat), taken as a mark before the arm and its difference after (armUse); and
// PARITY_BENCH_PIN, which gives the fallback a core of its own.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// armUse is what one arm of a pair cost: the CPU time of the fallback's server, of the
// broker (0 when it is not a process of this machine) and of the bench process itself
// (its /status polling under the applier, its client under raw); and the machine's and
// core 0's use (core 0 is the fallback's own with PARITY_BENCH_PIN).
type armUse struct {
	fallback, broker, bench time.Duration
	machine, core0          machineUse
}

// armMark is the counters armUse is the difference of, read before an arm.
type armMark struct {
	fallback, broker, bench time.Duration
	machine, core0          machineUse // the counters so far, not a difference
}

// mark reads the counters before an arm.
func (be *benchEnv) mark(tb testing.TB) armMark {
	tb.Helper()
	m := armMark{fallback: be.fallbackCPU(tb), bench: selfCPU()}
	m.broker, _ = be.brokerCPU()
	m.machine.busy, m.machine.total = cpuTime(tb, "cpu")
	m.core0.busy, m.core0.total = cpuTime(tb, "cpu0")
	return m
}

// since returns what the arm since m cost.
func (be *benchEnv) since(tb testing.TB, m armMark) armUse {
	tb.Helper()
	now := be.mark(tb)
	return armUse{
		fallback: now.fallback - m.fallback,
		broker:   now.broker - m.broker,
		bench:    now.bench - m.bench,
		machine:  machineUse{busy: now.machine.busy - m.machine.busy, total: now.machine.total - m.machine.total},
		core0:    machineUse{busy: now.core0.busy - m.core0.busy, total: now.core0.total - m.core0.total},
	}
}

// machineUse is CPU time over one arm of a pair (the machine's or one core's): busy
// time against the cores' time (wall time x cores).
type machineUse struct{ busy, total time.Duration }

// share is the busy share of the cores' time, in per cent.
func (m machineUse) share() float64 {
	if m.total <= 0 {
		return 0
	}
	return 100 * m.busy.Seconds() / m.total.Seconds()
}

// cpuTime reads CPU time so far from /proc/stat's line name: "cpu" (every core) or
// "cpuN". busy is time spent on anything (user, nice, system, irq, softirq, and steal:
// time the hypervisor gave to another guest, which was not ours to use either), total
// adds idle and iowait. Clock ticks are 100 a second on Linux.
func cpuTime(tb testing.TB, name string) (busy, total time.Duration) {
	tb.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatalf("the machine's CPU time: %v", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != name {
			continue
		}
		var t [8]int64 // user nice system idle iowait irq softirq steal
		for i := range t {
			if _, err := fmt.Sscan(f[i+1], &t[i]); err != nil {
				tb.Fatalf("the machine's CPU time: /proc/stat field %d of %q: %v", i+1, line, err)
			}
		}
		b := t[0] + t[1] + t[2] + t[5] + t[6] + t[7]
		return time.Duration(b) * 10 * time.Millisecond, time.Duration(b+t[3]+t[4]) * 10 * time.Millisecond
	}
	tb.Fatalf("the machine's CPU time: /proc/stat has no line %q", name)
	return 0, 0
}

// fallbackCPU is the fallback server's CPU time so far (user+sys of its process, from
// /proc: the server runs on this machine), found through its pid file the first time.
func (be *benchEnv) fallbackCPU(tb testing.TB) time.Duration {
	tb.Helper()
	if be.fallbackPID == "" {
		var pidFile string
		if err := be.down.QueryRow("SELECT @@pid_file").Scan(&pidFile); err != nil {
			tb.Fatalf("the fallback's pid file: %v", err)
		}
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			tb.Fatalf("the fallback's pid file: %v", err)
		}
		be.fallbackPID = strings.TrimSpace(string(raw))
	}
	d, err := procCPU(be.fallbackPID)
	if err != nil {
		tb.Fatalf("the fallback's CPU time: %v", err)
	}
	return d
}

// brokerCPU is the Kafka broker's CPU time so far, when the broker is a process of this
// machine (scripts/env runs it here): the process holding the listening socket of the
// broker's port, found the first time (listenerPID). ok is false when it cannot be
// found (another machine, no permission).
func (be *benchEnv) brokerCPU() (d time.Duration, ok bool) {
	if be.brokerPID == "" {
		be.brokerPID = "-"
		if pid := listenerPID(be.broker); pid != "" {
			be.brokerPID = pid
		}
	}
	if be.brokerPID == "-" {
		return 0, false
	}
	d, err := procCPU(be.brokerPID)
	return d, err == nil
}

// procCPU is process pid's CPU time so far, from /proc/<pid>/stat (user+sys; clock
// ticks are 100 a second on Linux).
func procCPU(pid string) (time.Duration, error) {
	path := "/proc/" + pid + "/stat"
	stat, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// Fields after the command's closing parenthesis: state is field 3; utime and stime
	// are fields 14 and 15.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: unexpected contents %q", path, stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: unexpected contents %q", path, stat)
	}
	var utime, stime int64
	if _, err := fmt.Sscan(f[11]+" "+f[12], &utime, &stime); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// selfCPU is the bench process's own CPU time so far (user+sys, every thread).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// listenerPID returns the pid of the local process listening on addr's TCP port, or "":
// the socket's inode from /proc/net/tcp(6), then the process whose file descriptors
// hold it.
func listenerPID(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return ""
	}
	want := fmt.Sprintf(":%04X", p)
	var inode string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			// local_address is field 1, st (0A = LISTEN) field 3, inode field 9.
			if len(f) > 9 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
				inode = f[9]
			}
		}
	}
	if inode == "" {
		return ""
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == "socket:["+inode+"]" {
			return strings.Split(fd, "/")[2]
		}
	}
	return ""
}

// benchPinned reports PARITY_BENCH_PIN: the fallback's server runs on core 0 alone, and
// the bench (with serve, its child), the broker and everything they start on the other
// cores (pin). The fallback then has one core of its own in both arms, as on a fallback
// host that parity does not share, and each arm's rows/s is what it gets out of that
// core. Without it, every process shares every core (the default).
func benchPinned() bool { return os.Getenv("PARITY_BENCH_PIN") != "" }

// pin moves the fallback's server to core 0 and the bench process and the broker to the
// other cores (every thread: taskset -a; threads and processes started later inherit
// their creator's cores), and puts all three back on every core when the benchmark ends.
func (be *benchEnv) pin(tb testing.TB) {
	tb.Helper()
	n := runtime.NumCPU()
	if n < 2 {
		tb.Fatalf("PARITY_BENCH_PIN needs at least 2 cores, this machine has %d", n)
	}
	be.fallbackCPU(tb) // finds the fallback's pid
	pids := []string{strconv.Itoa(os.Getpid())}
	if _, ok := be.brokerCPU(); ok {
		pids = append(pids, be.brokerPID)
	} else {
		tb.Logf("PARITY_BENCH_PIN: the broker %s is not a process of this machine; not pinned", be.broker)
	}
	taskset := func(cores, pid string) {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cores, pid).CombinedOutput(); err != nil {
			tb.Fatalf("taskset -a -p -c %s %s: %v: %s", cores, pid, err, out)
		}
	}
	all := fmt.Sprintf("0-%d", n-1)
	tb.Cleanup(func() {
		for _, pid := range append(pids, be.fallbackPID) {
			taskset(all, pid)
		}
	})
	taskset("0", be.fallbackPID)
	for _, pid := range pids {
		taskset(fmt.Sprintf("1-%d", n-1), pid)
	}
}
