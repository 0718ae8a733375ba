package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"
)

// The runner re-runs its own executable with one of these first arguments to
// serve the upstream app or the bare proxy in a process of their own, so every
// target sits behind the same process boundary.
const (
	roleUpstream  = "serve-upstream"
	roleBareProxy = "serve-bareproxy"
)

// serveRole runs the server named by role until SIGTERM or SIGINT.
func serveRole(role string, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	upstreamURL := fs.String("upstream", "", "upstream base URL ("+roleBareProxy+")")
	maxIdle := fs.Int("max-idle", 64, "idle keep-alive connections to the upstream ("+roleBareProxy+")")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var h http.Handler
	switch role {
	case roleUpstream:
		h = &upstream{}
	case roleBareProxy:
		p, err := newBareProxy(*upstreamURL, *maxIdle)
		if err != nil {
			return err
		}
		h = p
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if role == roleBareProxy {
		if err := servePprofFromEnv(ctx); err != nil {
			return err
		}
	}
	return serve(ctx, *listen, h)
}

// serve serves h on addr until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, addr string, h http.Handler) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
