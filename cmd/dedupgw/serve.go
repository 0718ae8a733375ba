package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/boltstore"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

// HTTP server limits. The header, read and idle timeouts are the defaults of
// the server: block (see Server); the default read timeout grows with the
// largest body a route accepts (see readTimeout). The gateway itself bounds
// each forward by the route's upstream_timeout, so there is no write timeout
// on the gateway listener (a delivery on an on_in_flight: wait route may be
// held a lease).
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 120 * time.Second
	maxHeaderBytes    = 64 << 10
	minReadTimeout    = 30 * time.Second
	// slowestSender is the slowest body upload rate a sender is allowed.
	slowestSender = 64 << 10 // bytes per second
	// drainMargin is added to the longest upstream_timeout to bound the drain
	// on SIGTERM: enough for the last forward's commit or release.
	drainMargin = 5 * time.Second
	// adminWriteTimeout bounds admin answers (/metrics, the keys API).
	adminWriteTimeout = 30 * time.Second
)

func cmdServe(args []string, stderr io.Writer) int {
	path, code, ok := configFlag("serve", args, stderr)
	if !ok {
		return code
	}
	f, err := loadConfig(path, os.LookupEnv)
	if err != nil {
		printConfigError(stderr, path, err)
		return exitFail
	}
	log, level, err := newLogger(f.Log, zapcore.AddSync(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "dedupgw: %v\n", err)
		return exitFail
	}
	defer func() { _ = log.Sync() }()
	for _, name := range UnknownEnv(os.Environ()) {
		fields := []zap.Field{zap.String("variable", name)}
		if near := NearestEnv(name); near != "" {
			fields = append(fields, zap.String("did_you_mean", near))
		}
		log.Warn("environment variable overrides no configuration key; ignored (misspelt?)", fields...)
	}
	logWarnings(log, f)
	if v := os.Getenv("GOGC"); gogcUnreadable(v) {
		log.Warn("GOGC is neither a whole number nor off: the Go runtime ignores it and collects at GOGC=100, and the heap floor is off", zap.String("GOGC", v))
	}
	if floor := heapFloor(os.LookupEnv, debug.SetMemoryLimit(-1)); floor > 0 {
		defer startGCFloor(floor)()
		log.Info("garbage collector paced for a heap floor (GOGC is not set)", zap.Uint64("heap_floor_bytes", floor))
	}

	sigs, stopSignals := notifySignals()
	defer stopSignals()

	s := &server{path: path, env: os.LookupEnv, log: log, level: level, file: f}
	if err := s.run(sigs); err != nil {
		msg := "dedupgw stopped with an error"
		if !s.started {
			msg = "dedupgw could not start"
		}
		log.Error(msg, zap.Error(err))
		return exitFail
	}
	return exitOK
}

// notifySignals relays SIGHUP, SIGINT and SIGTERM to the returned channel
// until stop is called. Reload and stop requests wait in channels of their
// own: signal.Notify drops a signal whose channel is full, so with one
// channel a SIGTERM that came while a SIGHUP was still queued (the store
// opening at start-up, a reload running) was lost, and the gateway kept
// serving. SIGHUPs queued together coalesce into one reload (it reads the
// latest file); a queued stop is relayed before a queued reload. The relay
// goroutine has exited when stop returns.
func notifySignals() (sigs <-chan os.Signal, stop func()) {
	hup := make(chan os.Signal, 1)
	term := make(chan os.Signal, 2) // the stop, and a second one cutting the drain short
	signal.Notify(hup, syscall.SIGHUP)
	signal.Notify(term, syscall.SIGINT, syscall.SIGTERM)
	out := make(chan os.Signal)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			var sig os.Signal
			select {
			case sig = <-term:
			default:
				select {
				case sig = <-term:
				case sig = <-hup:
				case <-done:
					return
				}
			}
			select {
			case out <- sig:
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() {
		once.Do(func() {
			signal.Stop(hup)
			signal.Stop(term)
			close(done)
			<-exited
		})
	}
}

// newLogger builds the process logger from the log: block, writing to w.
// The returned level can be changed while the logger is in use (reload).
func newLogger(cfg Log, w zapcore.WriteSyncer) (*zap.Logger, zap.AtomicLevel, error) {
	level, err := zap.ParseAtomicLevel(cfg.Level)
	if err != nil {
		return nil, level, fmt.Errorf("log.level: %w", err)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	// Durations carry their unit ("35s", "1.2ms"): zap's default writes bare
	// seconds, which a reader of "drain":35 or "took":0.0012 has to guess.
	// Per-delivery timings are numbers with the unit in the name instead
	// (duration_ms), for log queries.
	ec.EncodeDuration = zapcore.StringDurationEncoder
	var enc zapcore.Encoder
	switch cfg.Format {
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, level, fmt.Errorf("log.format: unknown format %q", cfg.Format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(w), level)), level, nil
}

// server is one running gateway: its configuration, store, gateway, and the
// two HTTP listeners.
type server struct {
	path  string
	env   func(string) (string, bool)
	log   *zap.Logger
	level zap.AtomicLevel
	// started is set once both listeners serve: an error before that is
	// a failed start-up, not a stop.
	started bool

	// file is the configuration in force. Keys that need a restart (listen
	// addresses, store, log format) keep their start-up values across reloads.
	file  *File
	store dedup.Store
	gw    *proxy.Gateway
	reg   *prometheus.Registry
	// admin is the current admin handler; a reload rebuilds it (token).
	admin atomic.Pointer[http.Handler]
	// longestTimeout is the longest upstream_timeout of every configuration
	// served since start-up: a delivery keeps the route it started with
	// across a reload, so the drain must outlast the timeouts of the routes
	// a reload replaced, not only of the file in force.
	longestTimeout time.Duration
	// open opens the store; nil means openStore. Tests put a failing store
	// here.
	open func(Store, *zap.Logger) (dedup.Store, error)
	// watchInterval is how often the files the configuration's
	// ${file:PATH} references name are read for a change, which reloads
	// as SIGHUP does. Zero means defaultWatchInterval.
	watchInterval time.Duration
	// storeCheckInterval is how often a Redis that did not answer at
	// start-up is pinged until it does (see checkRedisWhenUp). Zero means
	// defaultStoreCheckInterval.
	storeCheckInterval time.Duration
	// restartCheckInterval is how often a Redis store's masters are asked
	// for their run (see watchRedisRestarts). Zero means
	// defaultRestartCheckInterval.
	restartCheckInterval time.Duration
	// runsRead, when set (tests), is called after each read of the
	// masters' runs that Redis answered.
	runsRead func()
	// watch follows those files while run serves; nil before.
	watch *fileWatch
}

// drainTimeout bounds the drain on SIGTERM: the longest upstream_timeout a
// delivery still running may have been started with, plus drainMargin for
// its commit or release.
func (s *server) drainTimeout() time.Duration {
	return max(s.longestTimeout, s.file.maxUpstreamTimeout()) + drainMargin
}

// run serves until SIGTERM or SIGINT arrives on sigs (SIGHUP reloads) or a
// listener fails, then shuts down gracefully.
func (s *server) run(sigs <-chan os.Signal) error {
	f := s.file
	open := s.open
	if open == nil {
		open = openStore
	}
	store, err := open(f.Store, s.log)
	if err != nil {
		return err
	}
	s.store = store
	storeClosed := false
	closeStore := func() error {
		storeClosed = true
		if err := store.Close(); err != nil {
			return fmt.Errorf("closing the store: %w", err)
		}
		return nil
	}
	defer func() {
		if !storeClosed {
			if err := closeStore(); err != nil {
				s.log.Error("closing the store", zap.Error(err))
			}
		}
	}()
	// An unreachable store is no reason not to start: Redis may come up
	// later, and meanwhile each delivery meets its route's on_store_error
	// policy. But say so now, not at the first delivery or readiness probe.
	// Refused credentials are another matter: a wrong password would fail
	// every delivery open (on_store_error: forward, the default) for as long
	// as the gateway runs, so it is a start-up error, like any wrong key.
	pingCtx, cancel := context.WithTimeout(context.Background(), startupPingTimeout)
	rs, isRedis := store.(*redisstore.Store)
	checkLater := false
	switch err := store.Ping(pingCtx); {
	case redisstore.CredentialsRefused(err):
		cancel()
		return fmt.Errorf("store.redis: Redis refused the gateway's credentials or what they allow (%s): %w", credentialHint(f.Store.Redis, err), err)
	case isRedis && redisstore.RefusesWrites(err):
		// Redis answers, so what it says of its memory policy and
		// persistence is worth saying now (a full Redis under a policy that
		// evicts is the likely story); the probe of every command waits
		// until it takes writes.
		s.log.Warn("Redis answers but refuses writes at start-up: claims of new keys meet their routes' on_store_error policy until it takes writes (copies of keys it holds are answered)",
			zap.Error(err))
		warnRedisSettings(pingCtx, rs, s.log)
		checkLater = true
	case err != nil:
		s.log.Warn("store unreachable at start-up: deliveries meet their routes' on_store_error policy until it answers",
			zap.String("backend", f.Store.Backend), zap.Error(err))
		checkLater = isRedis
	case isRedis:
		if err := s.checkRedis(pingCtx, rs, f.Store.Redis); err != nil {
			cancel()
			return err
		}
	}
	cancel()

	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if bs, ok := store.(*boltstore.Store); ok {
		s.reg.MustRegister(bs.Collectors()...)
	}
	trusted, _, _ := f.Server.trustedProxies() // validated by loadConfig
	gw, err := proxy.New(f.GatewayConfig(), store, proxy.Options{
		Logger:            s.log,
		Registerer:        s.reg,
		Backend:           f.Store.Backend,
		Version:           version,
		BodyTimeout:       bodyTimeout(f),
		TrustedProxies:    trusted,
		StorePingInterval: proxy.DefaultStorePingInterval,
	})
	if err != nil {
		return fmt.Errorf("build gateway: %w", err)
	}
	s.gw = gw
	gwClosed := false
	defer func() {
		if !gwClosed {
			_ = gw.Close()
		}
	}()
	s.setAdmin(f.Admin)

	gl, err := net.Listen("tcp", f.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	al, err := net.Listen("tcp", f.Admin.Listen)
	if err != nil {
		_ = gl.Close()
		return fmt.Errorf("admin.listen: %w", err)
	}
	errLog := zap.NewStdLog(s.log.Named("http"))
	defer redirectStdLog(s.log.Named("stdlib"))()
	gwSrv := &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: headerTimeout(f),
		ReadTimeout:       readTimeout(f),
		IdleTimeout:       idleTimeoutOf(f),
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errLog,
	}
	adminSrv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			(*s.admin.Load()).ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: headerTimeout(f),
		ReadTimeout:       headerTimeout(f),
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       idleTimeoutOf(f),
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errLog,
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- serveListener(gwSrv, gl, "listen") }()
	go func() { serveErr <- serveListener(adminSrv, al, "admin.listen") }()

	routes := make([]string, len(f.Routes))
	for i, r := range f.Routes {
		routes[i] = r.Name + "=" + r.Path
	}
	logSecretIDs(s.log, f)
	s.started = true
	s.log.Info("dedupgw started",
		zap.String("version", version),
		zap.String("listen", gl.Addr().String()),
		zap.String("admin_listen", al.Addr().String()),
		zap.String("backend", f.Store.Backend),
		zap.String("store", storeLocation(f.Store)),
		zap.Strings("routes", routes),
	)

	// The config file, and files read by ${file:PATH}, change without
	// anyone sending SIGHUP (a Kubernetes ConfigMap or Secret volume is
	// updated in place): follow them, and reload as SIGHUP does when one
	// changes.
	interval := s.watchInterval
	if interval <= 0 {
		interval = defaultWatchInterval
	}
	s.watch = startFileWatch(interval, f.watchedFiles(), f.source) // stopped when the drain starts
	checkCtx, stopCheck := context.WithCancel(context.Background())
	defer stopCheck()
	checkDone := make(chan struct{})
	if isRedis {
		go s.followRedis(checkCtx, rs, f.Store.Redis, checkLater, checkDone) // stopped when the drain starts
	} else {
		close(checkDone)
	}

	var runErr error
loop:
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.log.Info("SIGHUP received: reloading", zap.String("config", s.path))
				s.reload()
				continue
			}
			s.log.Info("signal received: draining", zap.String("signal", sig.String()))
			break loop
		case <-s.watch.Changed():
			files := s.watch.Take()
			if len(files) == 0 {
				continue // a SIGHUP's reload read them already
			}
			msg := "a file the config references changed: reloading"
			if slices.Contains(files, s.file.source) {
				msg = "the config file changed: reloading"
			}
			s.log.Info(msg, zap.Strings("files", files))
			s.reload()
		case err := <-serveErr:
			if err == nil {
				continue // cannot happen before Shutdown; kept for clarity
			}
			runErr = err
			s.log.Error("listener failed: shutting down", zap.Error(err))
			break loop
		}
	}

	// Drain: report not ready, stop accepting, let deliveries finish (commit
	// or release), then close the gateway, which cancels and releases
	// whatever is left. A file changing now reloads nothing.
	s.watch.Stop()
	stopCheck() // also cuts a Redis read under way: the drain does not wait for a hung Redis
	<-checkDone
	gw.Drain()
	drain := s.drainTimeout()
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	start := time.Now()
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		// A second SIGTERM or SIGINT cuts the drain short; what is still
		// running is then cancelled and released by gw.Close.
		defer close(watchDone)
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGHUP {
					s.log.Warn("reload ignored: draining")
					continue
				}
				s.log.Warn("second signal: cutting the drain short", zap.String("signal", sig.String()))
				cancel()
				return
			case <-stopWatch:
				return
			}
		}
	}()
	if err := gwSrv.Shutdown(ctx); err != nil {
		s.log.Warn("drain cut short: cancelling the deliveries left", zap.Duration("drain", drain), zap.Error(err))
	}
	close(stopWatch)
	<-watchDone
	_ = gw.Close()
	gwClosed = true
	_ = gwSrv.Close()
	actx, acancel := context.WithTimeout(context.Background(), readHeaderTimeout)
	defer acancel()
	if err := adminSrv.Shutdown(actx); err != nil {
		_ = adminSrv.Close()
	}
	// A store that cannot close cleanly (bolt: the last checkpoint failed,
	// say on a full disk) fails the exit, so a supervisor sees it; what it
	// did not write stays in its journal for the next start.
	closeErr := closeStore() // before the last line, which says all is done
	s.log.Info("dedupgw stopped", zap.Duration("drained_in", time.Since(start)))
	return errors.Join(runErr, closeErr)
}

// serveListener serves srv on l until Shutdown; name says which listener.
func serveListener(srv *http.Server, l net.Listener, name string) error {
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s %s: %w", name, l.Addr(), err)
	}
	return nil // Shutdown was called
}

// headerTimeout is server.read_header_timeout, or readHeaderTimeout.
func headerTimeout(f *File) time.Duration {
	if d := f.Server.ReadHeaderTimeout; d != nil {
		return *d
	}
	return readHeaderTimeout
}

// idleTimeoutOf is server.idle_timeout, or idleTimeout.
func idleTimeoutOf(f *File) time.Duration {
	if d := f.Server.IdleTimeout; d != nil {
		return *d
	}
	return idleTimeout
}

// readTimeout bounds reading a whole request: server.read_timeout when set,
// else the header timeout plus the largest body any route accepts uploaded
// at the slowest rate allowed, and at least minReadTimeout.
func readTimeout(f *File) time.Duration {
	if d := f.Server.ReadTimeout; d != nil {
		return *d
	}
	var largest int64
	for i := range f.Routes {
		largest = max(largest, *f.effective(i).MaxBodyBytes)
	}
	return max(minReadTimeout, headerTimeout(f)+time.Duration(largest/slowestSender)*time.Second)
}

// bodyTimeout bounds reading one delivery's body inside the gateway
// (proxy.Options.BodyTimeout). The gateway's read deadline replaces the
// server's ReadTimeout once the handler runs, so it is the same bound:
// server.read_timeout, or by default the largest body at the slowest rate
// allowed, at least minReadTimeout. Like ReadTimeout it is fixed at
// start-up; a reload that changes server: or raises max_body_bytes takes
// effect on these timeouts at the next restart.
func bodyTimeout(f *File) time.Duration { return readTimeout(f) }

// setAdmin installs an admin handler guarded as a says.
func (s *server) setAdmin(a Admin) {
	h := proxy.NewAdmin(s.gw, s.store, proxy.AdminOptions{Token: string(a.Token), AnyHost: a.Insecure, Gatherer: s.reg})
	s.admin.Store(&h)
}

// changedKeys returns the config keys (prefix.key, by config tag) whose
// values differ between the structs a and b, walking nested structs; the
// values themselves (a password, say) are not part of the answer.
func changedKeys(prefix string, a, b reflect.Value) []string {
	var keys []string
	for i := range a.NumField() {
		name, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("config"), ",")
		if name == "" {
			continue
		}
		key := prefix + "." + name
		fa, fb := a.Field(i), b.Field(i)
		switch {
		case fa.Kind() == reflect.Struct:
			keys = append(keys, changedKeys(key, fa, fb)...)
		case !reflect.DeepEqual(fa.Interface(), fb.Interface()):
			keys = append(keys, key)
		}
	}
	return keys
}

// reload re-reads the configuration file, and the files its ${file:PATH}
// references name. An invalid file is logged and counted, and the running
// configuration stays. Listen addresses, the store
// and the log format need a restart: a change to them is logged and the rest
// applied.
func (s *server) reload() {
	f, err := loadConfig(s.path, s.env)
	// What this load read of the files followed is tried now, and need
	// not be tried again, whether or not the reload succeeds: also a
	// config file it could not read or parse.
	if f != nil {
		s.watch.Saw(f.watchedFiles())
	} else if se, ok := errors.AsType[*sourceError](err); ok && se.source != "" {
		s.watch.Saw(map[string]fileState{se.source: se.read})
	}
	if err != nil {
		s.gw.ReloadFailed()
		var ps Problems
		if errors.As(err, &ps) {
			list := make([]string, len(ps))
			for i, p := range ps {
				list[i] = p.String()
			}
			s.log.Error("config reload rejected: keeping the running config", zap.String("config", s.path), zap.Strings("problems", list))
		} else {
			s.log.Error("config reload rejected: keeping the running config", zap.String("config", s.path), zap.Error(err))
		}
		return
	}
	old := s.file
	var restart, storeKeys []string
	if !reflect.DeepEqual(f.Store, old.Store) {
		storeKeys = changedKeys("store", reflect.ValueOf(old.Store), reflect.ValueOf(f.Store))
		if len(storeKeys) == 0 {
			storeKeys = []string{"store"} // a field without a config name
		}
		f.Store = old.Store
	}
	if f.Listen != old.Listen {
		restart = append(restart, "listen")
		f.Listen = old.Listen
	}
	if f.Admin.Listen != old.Admin.Listen {
		restart = append(restart, "admin.listen")
		f.Admin.Listen = old.Admin.Listen
	}
	if !reflect.DeepEqual(f.Server, old.Server) {
		restart = append(restart, "server")
		f.Server = old.Server
	}
	if f.Log.Format != old.Log.Format {
		restart = append(restart, "log.format")
		f.Log.Format = old.Log.Format
	}
	if f.Admin.unguarded() {
		// The file is valid for its own admin.listen, but the running one
		// stays until a restart: dropping the token now would open the keys
		// API on it.
		s.gw.ReloadFailed()
		s.log.Error("config reload rejected: keeping the running config", zap.String("config", s.path),
			zap.Strings("problems", []string{fmt.Sprintf("admin.token: the running admin.listen %q is not a loopback address and stays until a restart; keep the token (or set admin.insecure: true)", f.Admin.Listen)}))
		return
	}
	if err := s.gw.Reload(f.GatewayConfig()); err != nil {
		// The gateway counted the failure and kept its routes.
		s.log.Error("config reload rejected: keeping the running config", zap.String("config", s.path), zap.Error(err))
		return
	}
	// Said once the rest is applied: a reload rejected above ignores
	// everything, and one line saying so is enough.
	if len(storeKeys) > 0 {
		s.log.Warn("store change needs a restart: keeping the running store, applying the rest", zap.Strings("keys", storeKeys))
	}
	if len(restart) > 0 {
		s.log.Warn("changes that need a restart are ignored until then", zap.Strings("keys", restart))
	}
	if err := s.level.UnmarshalText([]byte(f.Log.Level)); err != nil {
		s.log.Warn("log.level not applied", zap.Error(err))
	}
	if f.Admin.Token != old.Admin.Token || f.Admin.Insecure != old.Admin.Insecure {
		s.setAdmin(f.Admin)
	}
	s.longestTimeout = max(s.longestTimeout, old.maxUpstreamTimeout())
	logWarnings(s.log, f)
	warnKeyChanges(s.log, old, f)
	s.file = f
	s.watch.Follow(f.watchedFiles())
	fields := []zap.Field{zap.String("config", s.path), zap.Int("routes", len(f.Routes))}
	if added, removed, changed := routeChanges(old, f); len(added)+len(removed)+len(changed) > 0 {
		fields = append(fields, zap.Strings("routes_added", added), zap.Strings("routes_removed", removed), zap.Strings("routes_changed", changed))
	}
	if !reflect.DeepEqual(old.Defaults, f.Defaults) {
		fields = append(fields, zap.Bool("defaults_changed", true))
	}
	s.log.Info("config reloaded", fields...)
}

// logWarnings logs what validate would warn about in f, at start-up and
// after each reload: a file a reload brought in is as likely to be wrong as
// the one serve started with.
func logWarnings(log *zap.Logger, f *File) {
	for _, w := range f.Warnings() {
		log.Warn("configuration likely wrong", zap.String("key", w.Key), zap.String("problem", w.Msg))
	}
}

// routeChanges names the routes a reload from old to f added, removed and
// changed (any key of the route itself; a change of defaults: is reported
// apart), by route name, each list in f's or old's order, so an operator
// reading "config reloaded" sees what the reload did.
func routeChanges(old, f *File) (added, removed, changed []string) {
	was := make(map[string]Route, len(old.Routes))
	for _, r := range old.Routes {
		was[r.Name] = r
	}
	is := make(map[string]bool, len(f.Routes))
	for _, r := range f.Routes {
		is[r.Name] = true
		prev, ok := was[r.Name]
		switch {
		case !ok:
			added = append(added, r.Name)
		case !reflect.DeepEqual(prev, r):
			changed = append(changed, r.Name)
		}
	}
	for _, r := range old.Routes {
		if !is[r.Name] {
			removed = append(removed, r.Name)
		}
	}
	return added, removed, changed
}

// warnKeyChanges warns about each path served before and after a reload
// whose events now get other keys, which the reload is otherwise silent
// about: every event the route already forwarded is forwarded again on its
// next copy.
//   - Its keys live in another namespace: a route renamed without
//     namespace: (the namespace defaults to the name).
//   - Its key sources changed (keys:, or the provider whose preset they
//     are when keys: is empty), unless the old list is the start of the
//     new one: a source added at the end gives a key only to events that
//     had none. A change of client_identity or client_identity_secret,
//     which scope every key, is such a change too; the secret is logged
//     only as added, removed, changed or unchanged.
func warnKeyChanges(log *zap.Logger, old, f *File) {
	was := make(map[string]Route, len(old.Routes))
	for _, r := range old.Routes {
		was[r.Path] = r
	}
	for _, r := range f.Routes {
		prev, ok := was[r.Path]
		if !ok {
			continue
		}
		if ns, pns := namespaceOf(r), namespaceOf(prev); ns != pns {
			log.Warn("route's key namespace changed: keys recorded before the reload are not consulted, so copies of events already forwarded are forwarded again (set namespace: to the old one to keep them)",
				zap.String("route", r.Name), zap.String("path", r.Path),
				zap.String("namespace", ns), zap.String("previous_namespace", pns))
			continue
		}
		keys, prevKeys := effectiveKeys(r), effectiveKeys(prev)
		secret := secretChange(identitySecretOf(prev), identitySecretOf(r))
		kept := len(keys) >= len(prevKeys) && slices.Equal(prevKeys, keys[:len(prevKeys)]) &&
			http.CanonicalHeaderKey(r.ClientIdentity) == http.CanonicalHeaderKey(prev.ClientIdentity) &&
			secret == "unchanged"
		if !kept {
			log.Warn(keySourcesChanged,
				zap.String("route", r.Name), zap.String("path", r.Path),
				zap.String("provider", providerOf(r)), zap.String("previous_provider", providerOf(prev)),
				zap.Strings("keys", keys), zap.Strings("previous_keys", prevKeys),
				zap.String("client_identity", r.ClientIdentity), zap.String("previous_client_identity", prev.ClientIdentity),
				zap.String("client_identity_secret", secret),
				zap.String("client_identity_secret_id", secretID(identitySecretOf(r))),
				zap.String("previous_client_identity_secret_id", secretID(identitySecretOf(prev))))
		}
	}
}

// secretID identifies a client_identity_secret without showing it: the
// first 8 hex digits of its HMAC-SHA256 over a fixed label (a key check
// value), "" for none. Replicas, and runs before and after a restart,
// whose ids differ scope every key differently; the id gives away no more
// about the secret than any Dedup-Key scoped with it.
func secretID(secret string) string {
	if secret == "" {
		return ""
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("dedupgw client_identity_secret id"))
	return hex.EncodeToString(mac.Sum(nil))[:8]
}

// logSecretIDs logs, at start-up, the id of each route's
// client_identity_secret: a restart warns about nothing it does not see
// (the secret comes from the environment), so this line is what shows that
// a replica, or this run against the last, scopes keys with another one.
func logSecretIDs(log *zap.Logger, f *File) {
	for _, r := range f.Routes {
		if id := secretID(identitySecretOf(r)); id != "" {
			log.Info("route scopes client keys with its client_identity_secret; every replica and every run must show this id, or their keys differ",
				zap.String("route", r.Name), zap.String("client_identity_secret_id", id))
		}
	}
}

// keySourcesChanged is warnKeyChanges' warning about a route whose events
// get other keys.
const keySourcesChanged = "route's key sources changed: events get other keys than those recorded before the reload, so copies of events already forwarded may be forwarded again (add new sources after the old ones to keep their keys); a change of client_identity or client_identity_secret re-scopes every key, so every retry of a request made before the reload is forwarded again"

// secretChange describes how a secret went from was to is without showing
// either: "unchanged", "added", "removed" or "changed".
func secretChange(was, is string) string {
	switch {
	case was == is:
		return "unchanged"
	case was == "":
		return "added"
	case is == "":
		return "removed"
	}
	return "changed"
}

// effectiveKeys is the key sources r keys on: its keys:, else its
// provider's preset, with header names in canonical form (header:x-id and
// header:X-Id read the same header).
func effectiveKeys(r Route) []string {
	keys := providers.Config{Provider: r.Provider, Keys: r.Keys}.KeySources()
	out := make([]string, len(keys))
	for i, k := range keys {
		if name, ok := strings.CutPrefix(k, "header:"); ok {
			k = "header:" + http.CanonicalHeaderKey(name)
		}
		out[i] = k
	}
	return out
}

// startupPingTimeout bounds the store check at start-up.
const startupPingTimeout = 3 * time.Second

// credentialHint says which keys to check when Redis refused the
// gateway's credentials (err), for the start-up error.
func credentialHint(r Redis, err error) string {
	if redis.IsPermissionError(err) || strings.Contains(err.Error(), "NOPERM ") {
		return "the ACL user may not run a command the store needs: grant it the ones the README lists under Redis"
	}
	hint := "check store.redis.username and store.redis.password"
	if r.MasterName != "" {
		hint += ", and the sentinels' sentinel_username and sentinel_password"
	}
	return hint
}

// warnEviction warns when Redis may evict the store's keys: an evicted
// processed key lets its event's next copy through, silently.
func warnEviction(ctx context.Context, rs *redisstore.Store, log *zap.Logger) {
	policy, err := rs.MaxmemoryPolicy(ctx)
	switch {
	case err != nil:
		log.Info("could not read Redis's maxmemory-policy (INFO memory); make sure it is noeviction", zap.Error(err))
	case policy == "volatile-ttl":
		// The README's choice when Redis must evict: the keys nearest their
		// end go first.
		log.Info("Redis evicts the dedup keys nearest their end first under memory pressure (maxmemory-policy volatile-ttl): each evicted processed key still lets its next copy through; noeviction avoids it")
	case policy != "noeviction":
		log.Warn("Redis may evict dedup keys under memory pressure, and an evicted processed key lets its next copy through: set maxmemory-policy noeviction",
			zap.String("maxmemory_policy", policy))
	}
}

// checkRedis runs the checks of a Redis that answers: PING alone does not
// show what an ACL user may do, so it runs every command the store sends
// on a probe key of its own (redisstore.Store.CheckCommands), whose writes
// wait for replicas as a claim's do, so it also finds claims that fail for
// want of them (wait_replicas; /readyz does not check replicas, and each
// refused claim counts in dedupgw_store_errors_total{op="claim"}); then
// it warns about eviction, persistence and a lone Cluster node. It returns
// an error only when Redis refuses the credentials or what they allow.
func (s *server) checkRedis(ctx context.Context, rs *redisstore.Store, cfg Redis) error {
	switch err := rs.CheckCommands(ctx); {
	case redisstore.CredentialsRefused(err):
		return fmt.Errorf("store.redis: Redis refused the gateway's credentials or what they allow (%s): %w", credentialHint(cfg, err), err)
	case errors.Is(err, dedup.ErrNotReplicated):
		s.log.Warn("Redis answers, but claims fail at start-up: fewer replicas acknowledge writes than store.redis.wait_replicas asks for, or WAIT is refused (an ACL user needs +wait); deliveries meet their routes' on_store_error policy until enough do",
			zap.Error(err))
	case err != nil:
		s.log.Info("could not run the start-up probe of the store's Redis commands", zap.Error(err))
	}
	warnRedisSettings(ctx, rs, s.log)
	return nil
}

// warnRedisSettings warns about what Redis's own settings mean for the
// dedup keys, reading them only: eviction, persistence, and a Cluster node
// given alone.
func warnRedisSettings(ctx context.Context, rs *redisstore.Store, log *zap.Logger) {
	warnEviction(ctx, rs, log)
	warnPersistence(ctx, rs, log)
	warnClusterNode(ctx, rs, log)
}

// defaultStoreCheckInterval is how often serve pings a Redis that did not
// answer at start-up, to run checkRedis once it does.
const defaultStoreCheckInterval = 5 * time.Second

// followRedis follows a Redis store while the gateway serves, until ctx
// is done, which also cuts a read under way; it closes done when it
// returns. When Redis did not answer at start-up (checkLater) it runs the
// start-up checks once it does (see checkRedisWhenUp); then it watches for
// a restart of Redis (see watchRedisRestarts).
func (s *server) followRedis(ctx context.Context, rs *redisstore.Store, cfg Redis, checkLater bool, done chan<- struct{}) {
	defer close(done)
	if checkLater && !s.checkRedisWhenUp(ctx, rs, cfg) {
		return
	}
	s.watchRedisRestarts(ctx, rs)
}

// checkRedisWhenUp runs checkRedis once rs answers a ping, every
// storeCheckInterval until then, and reports true, or false when ctx was
// done first. A Redis that was unreachable at start-up (the gateway
// started before it) would otherwise never be checked. Refused credentials
// cannot end the start-up any more: they are logged as an error.
func (s *server) checkRedisWhenUp(ctx context.Context, rs *redisstore.Store, cfg Redis) bool {
	interval := s.storeCheckInterval
	if interval <= 0 {
		interval = defaultStoreCheckInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		pingCtx, cancel := context.WithTimeout(ctx, startupPingTimeout)
		if rs.Ping(pingCtx) != nil {
			cancel()
			continue
		}
		s.log.Info("Redis answers now: running the start-up checks")
		if err := s.checkRedis(pingCtx, rs, cfg); err != nil {
			s.log.Error("deliveries meet their routes' on_store_error policy until this is fixed", zap.Error(err))
		}
		cancel()
		return true
	}
}

// defaultRestartCheckInterval is how often serve asks Redis's masters for
// their run (watchRedisRestarts): one INFO server and replication per
// master.
const defaultRestartCheckInterval = 30 * time.Second

// restartSlack allows for INFO's whole seconds of uptime and the time the
// reads take when telling a restart from a failover.
const restartSlack = 5 * time.Second

// watchRedisRestarts reads the masters' runs (run_id, uptime, promoted)
// and persistence every restartCheckInterval until ctx is done, and logs a
// master it has not seen before: a warning when it started since the last
// answer and no failover promoted it (Redis restarted and holds only the
// keys its persistence kept: every key, with appendonly; none, without
// persistence), then the persistence and eviction checks of the start-up
// again, once per read; an info line otherwise (a replica promoted by a failover, a
// new Cluster master). A persistence that changed since the last read
// (CONFIG SET appendonly no, a master replaced by one configured
// otherwise) is logged, then checked as at start-up. A read that fails is
// skipped: store errors are counted and logged where deliveries meet
// them, and a persistence the ACL forbids reading was logged at start-up.
func (s *server) watchRedisRestarts(ctx context.Context, rs *redisstore.Store) {
	interval := s.restartCheckInterval
	if interval <= 0 {
		interval = defaultRestartCheckInterval
	}
	var (
		known    map[string]bool // run_ids of the last answer
		answered time.Time       // when the last answer came, by the monotonic clock
		persists string          // the last persistence read, "" before one
	)
	read := func() {
		readCtx, cancel := context.WithTimeout(ctx, startupPingTimeout)
		defer cancel()
		runs, err := rs.MasterRuns(readCtx)
		if err != nil {
			return
		}
		now := time.Now()
		restarted := false
		for _, r := range runs {
			switch {
			case known == nil || known[r.RunID]:
			case !r.Promoted && r.Uptime <= now.Sub(answered)+restartSlack:
				s.log.Warn("Redis restarted: a master has a new run_id and started since the gateway last asked; it holds only the keys its persistence kept, and the next copy of each event it forgot is forwarded again",
					zap.String("run_id", r.RunID), zap.Duration("uptime", r.Uptime))
				restarted = true
			default:
				s.log.Info("a Redis master the gateway had not seen: a replica promoted by a failover, or a new Cluster master",
					zap.String("run_id", r.RunID), zap.Duration("uptime", r.Uptime))
			}
		}
		// Persistence reads every master: once for all that restarted.
		p, err := rs.Persistence(readCtx)
		changed := err == nil && persists != "" && p != persists
		if changed {
			s.log.Info("Redis persists the dedup keys differently now (CONFIG SET, or a master configured otherwise)",
				zap.String("was", persists), zap.String("now", p))
		}
		if restarted || changed {
			logPersistence(p, err, s.log)
		}
		if err == nil {
			persists = p
		}
		if restarted {
			// A restarted Redis runs the configuration it started with,
			// which need not be the one the start-up checks read.
			warnEviction(readCtx, rs, s.log)
		}
		known = make(map[string]bool, len(runs))
		for _, r := range runs {
			known[r.RunID] = true
		}
		answered = now
		if s.runsRead != nil {
			s.runsRead()
		}
	}
	read()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			read()
		}
	}
}

// warnPersistence warns when Redis keeps the dedup keys in memory only: a
// restart of Redis then forgets every key, and the only trace in the
// gateway's log is "ready again" (found by an on-call trial).
func warnPersistence(ctx context.Context, rs *redisstore.Store, log *zap.Logger) {
	p, err := rs.Persistence(ctx)
	logPersistence(p, err, log)
}

// logPersistence logs what warnPersistence logs for Persistence's answer.
func logPersistence(p string, err error, log *zap.Logger) {
	switch {
	case err != nil:
		log.Info("could not read how Redis persists its keys (INFO persistence, CONFIG GET save); make sure appendonly is on", zap.Error(err))
	case p == redisstore.PersistenceNone:
		log.Warn("Redis keeps the dedup keys in memory only (neither appendonly nor save): a restart of Redis forgets every key, and the next copy of each processed event is forwarded again; set appendonly yes")
	case p == redisstore.PersistenceRDB:
		log.Info("Redis saves snapshots only (appendonly no): a Redis crash forgets the keys written since the last snapshot, and their events' next copies are forwarded again; appendonly yes avoids it")
	default:
		log.Info("Redis persists the dedup keys with appendonly: a restart of Redis keeps them (a crash, all but those written in the last fsync interval: a second with appendfsync everysec)")
	}
}

// warnClusterNode warns when the one address of a single-node store is a
// Redis Cluster node: keys on other nodes' slots fail with MOVED, and each
// such delivery meets on_store_error (fail-open by default, so without
// deduplication), while /readyz stays 200.
func warnClusterNode(ctx context.Context, rs *redisstore.Store, log *zap.Logger) {
	switch in, err := rs.SingleNodeInCluster(ctx); {
	case err != nil:
		log.Info("could not check whether Redis is a Cluster node (INFO cluster)", zap.Error(err))
	case in:
		log.Warn("store.redis.addrs names one node of a Redis Cluster, taken for a single node: keys on other nodes' slots fail with MOVED and meet their routes' on_store_error; set store.redis.cluster: true (or list several nodes)")
	}
}

// goRedisLogger installs go-redis's process-wide logger once.
var goRedisLogger sync.Once

// goRedisLog is the logger of go-redis's own lines: log named go-redis,
// each distinct line at most goRedisLinesPerSecond times a second and one
// in 100 beyond. During an outage every pooled connection's dial fails
// alike (a trial counted 25 lines a replica for one second of Redis
// down); the gateway's own lines (not ready, store unavailable) say what the
// outage costs.
func goRedisLog(log *zap.Logger) *zap.Logger {
	return log.Named("go-redis").WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, goRedisLinesPerSecond, 100)
	}))
}

// goRedisLinesPerSecond is how many times a second goRedisLog writes one
// line before sampling it.
const goRedisLinesPerSecond = 3

// storeLocation says where cfg keeps the keys, for the start-up line: the
// bolt file's absolute path (a relative one depends on the working
// directory, and another directory is another, empty, store), the Redis
// addresses, or that memory keeps nothing.
func storeLocation(cfg Store) string {
	switch cfg.Backend {
	case "bolt":
		if p, err := filepath.Abs(cfg.Bolt.Path); err == nil {
			return p
		}
		return cfg.Bolt.Path
	case "redis":
		loc := strings.Join(cfg.Redis.Addrs, ",")
		if cfg.Redis.MasterName != "" {
			loc = "sentinel " + cfg.Redis.MasterName + "@" + loc
		}
		return loc
	default:
		return "process memory (lost at exit)"
	}
}

// openStore opens the configured backend.
func openStore(cfg Store, log *zap.Logger) (dedup.Store, error) {
	switch cfg.Backend {
	case "bolt":
		s, err := boltstore.Open(cfg.Bolt.Path, boltstore.Options{Logger: log.Named("boltstore")})
		if err != nil {
			return nil, fmt.Errorf("open bolt store: %w", err)
		}
		return s, nil
	case "memory":
		return memstore.New(memstore.Options{}), nil
	case "redis":
		// go-redis has one process-wide logger that writes plain text to
		// stderr; route it through zap so every line stays JSON.
		goRedisLogger.Do(func() { redis.SetLogger(redisstore.GoRedisLogger{Logger: goRedisLog(log)}) })
		r := cfg.Redis
		s, err := redisstore.New(redisstore.Config{
			Addrs:            r.Addrs,
			Cluster:          r.Cluster,
			MasterName:       r.MasterName,
			Username:         r.Username,
			Password:         string(r.Password),
			SentinelUsername: r.SentinelUsername,
			SentinelPassword: string(r.SentinelPassword),
			DB:               r.DB,
			TLS:              r.TLS,
			KeyPrefix:        r.KeyPrefix,
			DialTimeout:      r.DialTimeout,
			ReadTimeout:      r.ReadTimeout,
			WriteTimeout:     r.WriteTimeout,
			PoolSize:         r.PoolSize,
			WaitReplicas:     r.WaitReplicas,
			WaitTimeout:      r.WaitTimeout,
		}, redisstore.Options{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("open redis store: %w", err)
		}
		return s, nil
	}
	return nil, fmt.Errorf("store.backend: unknown backend %q", cfg.Backend)
}
