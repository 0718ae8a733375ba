package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof" // served only on the pprof listener of a profiled bare proxy
	"os"
	"path/filepath"
	"time"
)

// pprofOverlay is added to cmd/dedupgw, with go build -overlay and without
// touching the source tree, when the runner profiles (-cpuprofile): it serves
// net/http/pprof on $DEDUPGW_BENCH_PPROF. Shipped binaries never contain it.
const pprofOverlay = `package main

import (
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("` + pprofEnvVar + `"); addr != "" {
		if l, err := net.Listen("tcp", addr); err == nil {
			go http.Serve(l, http.DefaultServeMux)
		}
	}
}
`

// writePprofOverlay writes the overlay file and its go build -overlay
// description into dir, for the package in pkgDir, and returns the latter's path.
func writePprofOverlay(dir, pkgDir string) (string, error) {
	src := filepath.Join(dir, "zz_bench_pprof.go")
	if err := os.WriteFile(src, []byte(pprofOverlay), 0o600); err != nil {
		return "", fmt.Errorf("write pprof overlay: %w", err)
	}
	b, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(pkgDir, "zz_bench_pprof.go"): src},
	})
	if err != nil {
		return "", fmt.Errorf("encode overlay: %w", err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlay, b, 0o600); err != nil {
		return "", fmt.Errorf("write overlay: %w", err)
	}
	return overlay, nil
}

// servePprofFromEnv serves net/http/pprof on $DEDUPGW_BENCH_PPROF, if set,
// until ctx ends. The bare proxy role calls it.
func servePprofFromEnv(ctx context.Context) error {
	addr := os.Getenv(pprofEnvVar)
	if addr == "" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("pprof listen: %w", err)
	}
	srv := &http.Server{Handler: http.DefaultServeMux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return nil
}

// cpuProfile records a CPU profile of the target at addr for d (whole
// seconds, at least 1) after waiting delay, and writes it to path. It is
// meant to run beside a round: delay skips the warm-up.
func cpuProfile(ctx context.Context, addr string, delay, d time.Duration, path string) error {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	secs := max(1, int(d/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Duration(secs)*time.Second + 30*time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("fetch cpu profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch cpu profile: got status %d, want 200", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("write profile: %w", err)
	}
	return f.Close()
}
