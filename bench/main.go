// Command bench is dedupgw's load benchmark (issue 7). It measures, in one run
// and with one load driver, the upstream app directly, a bare
// httputil.ReverseProxy (the baseline), nginx when installed, and the dedupgw
// binary on its memory, bolt and redis backends, each in a process of its own,
// and prints one Markdown table.
//
//	go run ./bench                 # the full run, about 3 minutes
//	go run ./bench -quick          # about 30 seconds
//	go run ./bench -targets bare,bolt -workloads unique -rounds 5
//
// Rounds are interleaved (A B C A B C …) and the order of targets rotates from
// round to round, so drift of a shared machine hits every target alike.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the runner's flags.
type options struct {
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	concurrency int
	timeout     time.Duration
	workloads   []string
	targets     []string
	baseline    string
	dedupgw     string
	dedupgwAlt  string
	logLevel    string
	bareGOGC    string
	cpuprofile  string
	keep        bool
	args        []string // as given, for the report
	explicit    map[string]bool
}

// parseOptions parses the runner's flags; -quick shortens every default the
// command line did not set.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{args: args, explicit: map[string]bool{}}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 2500*time.Millisecond, "measured time of one round")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured load before each round")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per target and workload, interleaved")
	fs.IntVar(&o.concurrency, "concurrency", 32, "concurrent senders")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "timeout of one request")
	workloads := fs.String("workloads", "unique,duplicate,mix", "comma-separated workloads: unique, duplicate, mix")
	targets := fs.String("targets", strings.Join(allTargets, ","), "comma-separated targets: "+strings.Join(allTargets, ", ")+" (nginx is skipped when not installed)")
	fs.StringVar(&o.baseline, "baseline", TargetBare, "target the ratio column divides by")
	fs.StringVar(&o.dedupgw, "dedupgw", "", "dedupgw binary to measure (default: go build ./cmd/dedupgw)")
	fs.StringVar(&o.dedupgwAlt, "dedupgw-alt", "", "a second dedupgw binary: each dedupgw target is also measured with it, as \"<backend> (alt)\", interleaved (A/B test of a change)")
	fs.StringVar(&o.logLevel, "log-level", "warn", "dedupgw's log.level (info logs every delivery)")
	fs.StringVar(&o.bareGOGC, "bare-gogc", "", "GOGC for the bare proxy (default: unset, Go's 100); dedupgw paces its own collector unless GOGC is set")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write CPU profiles of the bare proxy and dedupgw (first round of each workload) into this directory; perturbs the numbers")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's directory (configs, logs, databases)")
	quick := fs.Bool("quick", false, "a ~30 s run: -duration 1s -warmup 250ms -rounds 1 unless set")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) { o.explicit[f.Name] = true })
	if *quick {
		if !o.explicit["duration"] {
			o.duration = time.Second
		}
		if !o.explicit["warmup"] {
			o.warmup = 250 * time.Millisecond
		}
		if !o.explicit["rounds"] {
			o.rounds = 1
		}
	}
	o.workloads = splitList(*workloads)
	for _, w := range o.workloads {
		if w != Unique && w != Duplicate && w != Mix {
			return nil, fmt.Errorf("unknown workload %q (want unique, duplicate or mix)", w)
		}
	}
	o.targets = nil
	for _, t := range allTargets { // table order, whatever the flag's order
		if slices.Contains(splitList(*targets), t) {
			o.targets = append(o.targets, t)
		}
	}
	for _, t := range splitList(*targets) {
		if !slices.Contains(allTargets, t) {
			return nil, fmt.Errorf("unknown target %q (want some of %s)", t, strings.Join(allTargets, ", "))
		}
	}
	if o.dedupgwAlt != "" {
		var withAlt []string
		for _, t := range o.targets {
			withAlt = append(withAlt, t)
			if isGateway(t) {
				withAlt = append(withAlt, t+altSuffix)
			}
		}
		o.targets = withAlt
	}
	switch {
	case len(o.workloads) == 0:
		return nil, errors.New("no workloads")
	case len(o.targets) == 0:
		return nil, errors.New("no targets")
	case o.rounds < 1:
		return nil, fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	case !validGOGC(o.bareGOGC):
		return nil, fmt.Errorf("-bare-gogc %q: want a percentage or off, as GOGC takes", o.bareGOGC)
	case o.concurrency < 1:
		return nil, fmt.Errorf("-concurrency %d: want at least 1", o.concurrency)
	case o.duration <= 0 || o.warmup < 0 || o.timeout <= 0:
		return nil, errors.New("-duration and -timeout must be positive, -warmup not negative")
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// run is the runner: it parses flags, starts the upstream and the targets,
// drives the interleaved rounds and prints the table to stdout. Progress and
// warnings go to stderr.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == roleUpstream || args[0] == roleBareProxy) {
		return serveRole(args[0], args[1:], stderr)
	}
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	dir, err := os.MkdirTemp("", "dedupgw-bench-")
	if err != nil {
		return fmt.Errorf("make run directory: %w", err)
	}
	if o.keep {
		fmt.Fprintln(stderr, "bench: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	e := &env{dir: dir, self: self, concurrency: o.concurrency, logLevel: o.logLevel, bareGOGC: o.bareGOGC, profile: o.cpuprofile != "", dedupgwAlt: o.dedupgwAlt}
	if e.profile {
		if err := os.MkdirAll(o.cpuprofile, 0o755); err != nil {
			return fmt.Errorf("make profile directory: %w", err)
		}
	}
	var skipped []string
	skip := func(t string, why error) {
		fmt.Fprintf(stderr, "bench: skipping %s: %v\n", t, why)
		skipped = append(skipped, fmt.Sprintf("%s (%v)", t, firstLine(why)))
		o.targets = slices.DeleteFunc(o.targets, func(s string) bool { return s == t })
	}
	if slices.ContainsFunc(o.targets, func(t string) bool { return isGateway(t) && !isAlt(t) }) {
		e.dedupgw, e.dedupgwPprof, err = dedupgwBinary(ctx, o.dedupgw, dir, e.profile, stderr)
		if err != nil {
			for _, t := range slices.Clone(o.targets) {
				if isGateway(t) && !isAlt(t) {
					skip(t, err)
				}
			}
		}
	}
	if slices.Contains(o.targets, TargetNginx) {
		if e.nginx, err = exec.LookPath("nginx"); err != nil {
			skip(TargetNginx, errors.New("nginx is not installed"))
		}
	}

	up, upURL, err := startUpstream(ctx, e)
	if err != nil {
		return fmt.Errorf("start upstream: %w", err)
	}
	defer up.Stop()
	e.upstreamURL = upURL

	var targets []*target
	defer func() {
		for _, t := range targets {
			t.stop()
		}
	}()
	for _, name := range slices.Clone(o.targets) {
		t, err := startTarget(ctx, e, name, up)
		if err != nil {
			skip(name, err)
			continue
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		return errors.New("no target could be started")
	}

	for _, name := range runtimeEnv {
		if v, ok := os.LookupEnv(name); ok {
			fmt.Fprintf(stderr, "bench: %s=%s is not passed to the targets (-bare-gogc sets the bare proxy's GOGC)\n", name, v)
		}
	}
	total := time.Duration(o.rounds*len(o.workloads)*len(targets)) * (o.warmup + o.duration)
	fmt.Fprintf(stderr, "bench: %d rounds × %d workloads × %d targets × (%s + %s) ≈ %s\n",
		o.rounds, len(o.workloads), len(targets), o.warmup, o.duration, total.Round(time.Second))

	ids := newIDSpace()
	d := newDriver(o.concurrency, o.timeout, ids)
	defer d.Close()
	res := newResults(o.workloads, o.targets, o.baseline)
	var steal stealLog
	started := time.Now().UTC()
	for _, st := range schedule(o.rounds, o.workloads, len(targets)) {
		r, w, t := st.round, st.workload, targets[st.target]
		before, err := d.upstreamCount(ctx, upURL)
		if err != nil {
			return err
		}
		var profiled chan error
		if r == 0 && t.pprof != "" {
			profiled = make(chan error, 1)
			path := filepath.Join(o.cpuprofile, t.name+"-"+w+".pprof")
			go func() { profiled <- cpuProfile(ctx, t.pprof, o.warmup, o.duration, path) }()
		}
		var opsBefore map[string]opStat
		if t.metrics != "" {
			if opsBefore, err = scrapeStoreOps(ctx, d.client, t.metrics); err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
			}
		}
		cpuBefore, cpuOK := t.cpu()
		storeBefore, storeOK := t.storeCPU()
		hostBefore, hostErr := hostCPU()
		rr, err := d.run(ctx, round{url: t.url, workload: w, warmup: o.warmup, duration: o.duration})
		if profiled != nil {
			if perr := <-profiled; perr != nil {
				fmt.Fprintf(stderr, "bench: cpu profile of %s under %s: %v\n", t.name, w, perr)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("round %d, %s, %s: %w", r+1, w, t.name, err)
			}
			// A target that cannot be primed is reported, not fatal:
			// the other targets' numbers still stand.
			fmt.Fprintf(stderr, "round %d/%d %-9s %-18s failed: %v\n", r+1, o.rounds, w, t.label, err)
			continue
		}
		after, err := d.upstreamCount(ctx, upURL)
		if err != nil {
			return err
		}
		res.cell(w, t.name).add(rr, after-before)
		cpuNote := ""
		if cpuAfter, ok := t.cpu(); ok && cpuOK && rr.sent > 0 {
			res.cell(w, t.name).cpu.add(cpuAfter-cpuBefore, rr.sent)
			cpuNote = fmt.Sprintf("  cpu %4.0f µs/req", microsPerRequest(cpuAfter-cpuBefore, rr.sent))
		}
		if storeAfter, ok := t.storeCPU(); ok && storeOK && rr.sent > 0 {
			res.cell(w, t.name).storeCPU.add(storeAfter-storeBefore, rr.sent)
			cpuNote += fmt.Sprintf(" (redis-server %3.0f)", microsPerRequest(storeAfter-storeBefore, rr.sent))
		}
		if hostAfter, err := hostCPU(); err == nil && hostErr == nil {
			if busy, ok := hostAfter.busySince(hostBefore); ok && rr.sent > 0 {
				res.cell(w, t.name).machineCPU.add(busy, rr.sent)
				cpuNote += fmt.Sprintf("  machine %4.0f µs/req", microsPerRequest(busy, rr.sent))
			}
			share := hostAfter.stealSince(hostBefore)
			steal.add(r+1, w, t.label, share)
			if share >= 0.005 {
				cpuNote += fmt.Sprintf("  steal %.0f%%", 100*share)
			}
		}
		opsNote := ""
		if opsBefore != nil {
			if opsAfter, err := scrapeStoreOps(ctx, d.client, t.metrics); err == nil {
				delta := map[string]opStat{}
				for op, st := range opsAfter {
					delta[op] = st.sub(opsBefore[op])
				}
				res.cell(w, t.name).addStoreOps(delta)
				opsNote = fmt.Sprintf("  claim %.3f ms commit %.3f ms", delta["claim"].meanMillis(), delta["commit"].meanMillis())
			}
		}
		fmt.Fprintf(stderr, "round %d/%d %-9s %-18s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  failed %d%s%s %s\n",
			r+1, o.rounds, w, t.label, float64(rr.requests)/rr.elapsed.Seconds(),
			millis(rr.lat.quantile(0.5)), millis(rr.lat.quantile(0.99)), rr.failures, cpuNote, opsNote, rr.firstFailure)
	}

	fmt.Fprintf(stdout, "dedupgw load benchmark, %s: `%s`\n\n", started.Format("2006-01-02 15:04 UTC"), strings.Join(append([]string{"go run ./bench"}, o.args...), " "))
	fmt.Fprintf(stdout, "%s; %s %s/%s; %d senders, ~%d B Stripe events; %d × %s measured (+%s warm-up) per target and workload, interleaved.\n\n",
		machine(), runtime.Version(), runtime.GOOS, runtime.GOARCH, o.concurrency, len(appendEvent(nil, []byte(ids.newID()))),
		o.rounds, o.duration, o.warmup)
	res.writeTable(stdout)
	fmt.Fprintln(stdout)
	res.writeStoreOps(stdout)
	if len(skipped) > 0 {
		fmt.Fprintf(stdout, "Skipped: %s.\n\n", strings.Join(skipped, "; "))
	}
	res.writeGoals(stdout)
	steal.write(stdout)
	return nil
}

// step is one measured span of the run: a round, a workload, a target (by
// index).
type step struct {
	round    int
	workload string
	target   int
}

// schedule returns the measured spans in the order they run: every round
// runs each workload over every target before the next round starts (A B C,
// A B C, …), so drift of the machine hits every target alike, and the order
// of the targets rotates from round to round so none always goes first.
func schedule(rounds int, workloads []string, targets int) []step {
	var out []step
	for r := range rounds {
		for _, w := range workloads {
			for i := range targets {
				out = append(out, step{round: r, workload: w, target: (i + r) % targets})
			}
		}
	}
	return out
}

// dedupgwBinary returns bin when set, else builds ./cmd/dedupgw of the module
// the runner is run from into dir; with pprof, the build adds the pprof
// overlay and reports true.
func dedupgwBinary(ctx context.Context, bin, dir string, pprof bool, stderr io.Writer) (string, bool, error) {
	if bin != "" {
		if pprof {
			fmt.Fprintln(stderr, "bench: -dedupgw given: dedupgw is not profiled")
		}
		return bin, false, nil
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", false, fmt.Errorf("find the module: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", false, errors.New("not inside the dedupgw module; pass -dedupgw")
	}
	root := filepath.Dir(gomod)
	bin = filepath.Join(dir, "dedupgw")
	args := []string{"build", "-o", bin}
	if pprof {
		overlay, err := writePprofOverlay(dir, filepath.Join(root, "cmd", "dedupgw"))
		if err != nil {
			return "", false, err
		}
		args = append(args, "-overlay", overlay)
	}
	args = append(args, "./cmd/dedupgw")
	fmt.Fprintln(stderr, "bench: go", strings.Join(args, " "))
	build := exec.CommandContext(ctx, "go", args...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", false, fmt.Errorf("go build ./cmd/dedupgw: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, pprof, nil
}

// machine describes the CPU the run used.
func machine() string {
	model := runtime.GOARCH
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s)", runtime.NumCPU(), model)
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// validGOGC reports whether v is empty or a value GOGC takes: off or a
// non-negative percentage.
func validGOGC(v string) bool {
	if v == "" || v == "off" {
		return true
	}
	n, err := strconv.Atoi(v)
	return err == nil && n >= 0
}

// microsPerRequest returns d spread over requests, in µs, for a round's
// line on stderr.
func microsPerRequest(d time.Duration, requests int) float64 {
	return float64(d) / float64(time.Microsecond) / float64(requests)
}
