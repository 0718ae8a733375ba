// Package redistest starts real Redis servers for tests: a single node
// (Start), a three-master Cluster (StartCluster; with a replica per master,
// StartClusterWithReplicas) and a master watched by one
// Sentinel (StartSentinel; more with AddSentinel).
//
// Every server runs the redis-server binary found on PATH, binds only to
// 127.0.0.1 on a free port, keeps its files in t.TempDir(), persists nothing
// (--save "" --appendonly no) and is killed by t.Cleanup. A test whose machine
// has no redis-server is skipped, not failed, so packages that use these
// helpers still pass where Redis is not installed; set
// DEDUPGW_REQUIRE_REDIS=1 (CI does) to turn the skip into a failure.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server, a cluster or a sentinel may take to
// become ready before the test fails.
const startTimeout = 15 * time.Second

// Sentinel timings: how long a sentinel in TILT mode takes no action
// (Redis's SENTINEL_TILT_PERIOD), and the failover-timeout StartSentinel
// configures.
const (
	tiltPeriod              = 30 * time.Second
	sentinelFailoverTimeout = 10 * time.Second
)

// Binary returns the path of redis-server, or skips t (fails it when
// DEDUPGW_REQUIRE_REDIS is set) when there is none on PATH.
func Binary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("DEDUPGW_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-server not found on PATH: %v", err)
		}
		t.Skipf("redis-server not found on PATH (apt-get install redis-server): %v", err)
	}
	return path
}

// Server is one redis-server process on a fixed loopback port. Its methods
// are safe for concurrent use.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	conf string   // config file passed first (sentinel), or ""
	args []string // extra arguments after the common ones
	user string   // the ACL user the server requires (a sentinel's), or ""
	auth string   // the password the server requires (a sentinel's), or ""

	mu   sync.Mutex
	proc *process // nil while stopped
}

// process is one running redis-server and a channel closed when it exits.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server on a free 127.0.0.1 port and waits until it
// answers PING. It is killed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return startServer(t, func() int { return freePort(t, false) }, nil)
}

// StartWith is Start with extra redis-server arguments appended after the
// defaults, which they override (for instance "--appendonly", "yes",
// "--appendfsync", "always" for a server whose data survives Stop and Start).
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	return startServer(t, func() int { return freePort(t, false) }, args)
}

// startServer creates and starts a server with extra arguments on a port
// from pick, which it calls again when another process took that port.
func startServer(t testing.TB, pick func() int, extra []string) *Server {
	t.Helper()
	s := &Server{
		t:    t,
		bin:  Binary(t),
		dir:  t.TempDir(),
		port: pick(),
		args: extra,
	}
	t.Cleanup(s.Stop)
	for attempt := 1; ; attempt++ {
		err := s.start()
		if err == nil {
			return s
		}
		// Another process may take the port between pick and the server's
		// bind (go test runs packages side by side): move on, with the
		// logs of this attempt out of the way of the next one's.
		if attempt == 3 || !strings.Contains(s.logTail(), "Address already in use") {
			t.Fatal(err)
		}
		for _, name := range []string{"stderr.log", "redis.log"} {
			_ = os.Remove(filepath.Join(s.dir, name))
		}
		s.port = pick()
	}
}

// Addr returns the server's "127.0.0.1:port". It stays the same across Stop
// and Start.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory.
func (s *Server) Dir() string { return s.dir }

// Start starts the server again on the same port after Stop (an outage that
// ends) and waits until it answers PING. It does nothing if it is running.
// Data is not kept across Stop and Start unless StartWith enabled persistence
// (the files stay in Dir).
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return nil
	}
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "redis.log",
	)
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	out, err := os.OpenFile(filepath.Join(s.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open redis-server output file: %w", err)
	}
	defer out.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = out, out
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	if err := waitPing(s.Addr(), cmd.Process.Pid, s.user, s.auth, p.done); err != nil {
		_ = cmd.Process.Kill() // when it is still running, unanswering
		<-p.done
		s.proc = nil
		return fmt.Errorf("redis-server on %s not ready: %w\n%s", s.Addr(), err, s.logTail())
	}
	return nil
}

// Stop kills the server (SIGKILL, like a crash) and waits until it exited.
// Clients see connection errors until Start. It does nothing if stopped.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Kill()
	<-s.proc.done
	s.proc = nil
}

// Shutdown stops the server gracefully (SIGTERM: Redis flushes its append-only
// file or snapshot as configured) and waits until it exited. It does nothing
// if stopped.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Signal(syscall.SIGTERM)
	<-s.proc.done
	s.proc = nil
}

// Pause freezes the server (SIGSTOP): it keeps its connections open and
// answers nothing, like a hung process, until Resume. Kill (Stop) still
// ends it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.cmd.Process.Signal(sig)
	}
}

// Restart stops the server and starts it again on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Client returns a new go-redis client for the server, closed when the test
// ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// logTail returns the end of the server's log for failure messages.
func (s *Server) logTail() string {
	var b []byte
	for _, name := range []string{"stderr.log", "redis.log"} {
		lb, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			lb = []byte("(no " + name + ": " + err.Error() + ")\n")
		}
		b = append(b, lb...)
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// waitPing polls addr until the redis-server with process ID pid answers
// there, the process exits (exited) or startTimeout passes. Checking the
// process ID, not just a PONG, keeps a test from silently using a foreign
// server that took the port first (ours then fails to bind and exits).
func waitPing(addr string, pid int, user, auth string, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-exited:
			return errors.New("redis-server exited (is the port taken?)")
		default:
		}
		if last = pingPIDAuth(addr, pid, user, auth); last == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("redis-server exited (is the port taken?)")
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG after %s: %w", startTimeout, last)
		}
	}
}

// pingPID checks over a fresh connection that the server on addr answers, is
// the process pid (INFO server's process_id) and has finished loading its
// data (not INFO persistence's loading:1; until then it answers LOADING).
func pingPID(addr string, pid int) error { return pingPIDAuth(addr, pid, "", "") }

// pingPIDAuth is pingPID, authenticating first as user (or the default user
// when user is "") with password auth, unless auth is "".
func pingPIDAuth(addr string, pid int, user, auth string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(conn)
	if auth != "" {
		var err error
		if user != "" {
			_, err = fmt.Fprintf(conn, "*3\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(user), user, len(auth), auth)
		} else {
			_, err = fmt.Fprintf(conn, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(auth), auth)
		}
		if err != nil {
			return err
		}
		if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "+OK" {
			return fmt.Errorf("AUTH: got %q (%v), want +OK", strings.TrimSpace(line), err)
		}
	}
	if _, err := conn.Write([]byte("INFO server\r\nINFO persistence\r\n")); err != nil {
		return err
	}
	server, err := readInfo(r)
	if err != nil {
		return err
	}
	if !hasLine(server, "process_id:"+strconv.Itoa(pid)) {
		return fmt.Errorf("another redis-server answers on %s (want process_id:%d)", addr, pid)
	}
	persistence, err := readInfo(r)
	if err != nil {
		return err
	}
	if hasLine(persistence, "loading:1") { // a sentinel has no such line
		return errors.New("still loading its data")
	}
	return nil
}

// readInfo reads one INFO reply (a bulk string).
func readInfo(r *bufio.Reader) (string, error) {
	head, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(head, "$") {
		return "", fmt.Errorf("got %q, want the INFO reply", strings.TrimSpace(head))
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n < 0 {
		return "", fmt.Errorf("got %q, want the INFO reply", strings.TrimSpace(head))
	}
	body := make([]byte, n+2) // and the CRLF
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	return string(body[:n]), nil
}

// hasLine reports whether want is one of info's lines.
func hasLine(info, want string) bool {
	for _, line := range strings.Split(info, "\n") {
		if strings.TrimSpace(line) == want {
			return true
		}
	}
	return false
}

// ping sends one inline PING over a fresh connection.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("got %q, want +PONG", strings.TrimSpace(line))
	}
	return nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago. With
// bus set, port+10000 (a Cluster node's bus port) was free as well.
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			_ = l.Close()
			return port
		}
		if port+10000 > 65535 {
			_ = l.Close()
			continue
		}
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = l2.Close()
		return port
	}
	t.Fatalf("no free port pair (port, port+10000) after 50 tries")
	return 0
}

// Cluster is a Redis Cluster of masters, without replicas (StartCluster) or
// with one each (StartClusterWithReplicas).
type Cluster struct {
	// Nodes are the cluster's masters, as started.
	Nodes []*Server
	// Replicas are the replicas StartClusterWithReplicas started, one per
	// master (which one follows which is redis-cli's choice).
	Replicas []*Server
	t        testing.TB
}

// StartCluster starts n (at least 3) cluster-enabled servers, joins them with
// `redis-cli --cluster create … --cluster-replicas 0` and waits until every
// node reports cluster_state:ok and knows all 16384 slots.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return startCluster(t, n, false)
}

// StartClusterWithReplicas is StartCluster with one replica per master
// (`--cluster-replicas 1`): a master that dies is replaced by its replica
// after the cluster-node-timeout (2s). It waits, besides, until every
// replica's link to its master is up, so that a replica can be promoted.
func StartClusterWithReplicas(t testing.TB, n int) *Cluster {
	t.Helper()
	return startCluster(t, n, true)
}

func startCluster(t testing.TB, n int, replicas bool) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("StartCluster: got %d nodes, want at least 3", n)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Binary(t) // skips when redis-server is missing too
		t.Fatalf("redis-cli not found on PATH: %v", err)
	}
	c := &Cluster{t: t}
	ports := make(map[int]bool)
	pick := func() int { // a port and its bus port, clear of the other nodes'
		for {
			port := freePort(t, true)
			if !ports[port] && !ports[port+10000] && !ports[port-10000] {
				ports[port] = true
				return port
			}
		}
	}
	start := func() *Server {
		return startServer(t, pick, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		})
	}
	for len(c.Nodes) < n {
		c.Nodes = append(c.Nodes, start())
	}
	perMaster := "0"
	for replicas && len(c.Replicas) < n {
		c.Replicas = append(c.Replicas, start())
		perMaster = "1"
	}
	// redis-cli makes masters of the first n addresses (they share one
	// host), replicas of the rest.
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	for _, r := range c.Replicas {
		args = append(args, r.Addr())
	}
	args = append(args, "--cluster-replicas", perMaster, "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitOK(ctx)
	return c
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Client returns a new cluster client, closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// waitOK polls every node's CLUSTER INFO until all report cluster_state:ok
// with all slots assigned and ok, and all nodes know each other; and each
// replica's INFO replication until its link to its master is up.
func (c *Cluster) waitOK(ctx context.Context) {
	c.t.Helper()
	nodes := c.servers()
	clients := make([]*redis.Client, len(nodes))
	for i, s := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		defer clients[i].Close()
	}
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_slots_ok:16384",
		"cluster_known_nodes:" + strconv.Itoa(len(nodes)),
	}
	ok, last := poll(ctx, func() (bool, string) {
		for _, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return false, err.Error()
			}
			for _, w := range want {
				if !strings.Contains(info, w) {
					return false, info
				}
			}
		}
		for _, cl := range clients[len(c.Nodes):] {
			info, err := cl.Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false, fmt.Sprint(info, err)
			}
		}
		return true, ""
	})
	if !ok {
		c.t.Fatalf("cluster not ok after %s; last CLUSTER INFO:\n%s", startTimeout, last)
	}
}

// servers returns the Cluster's masters, then its replicas.
func (c *Cluster) servers() []*Server { return append(slices.Clone(c.Nodes), c.Replicas...) }

// MasterOf returns the address of the master that serves slot, as the
// running node at addr reports it (CLUSTER SLOTS), or "" when none does.
func MasterOf(ctx context.Context, addr string, slot int) (string, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer cl.Close()
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, r := range slots {
		if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil
		}
	}
	return "", nil
}

// AwaitFailover waits until a node other than dead, the master of slot that
// was stopped, serves slot as its master, and every running node reports
// cluster_state:ok: the dead master's replica was promoted.
func (c *Cluster) AwaitFailover(dead *Server, slot int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var live []*Server
	for _, s := range c.servers() {
		if s != dead {
			live = append(live, s)
		}
	}
	ok, last := poll(ctx, func() (bool, string) {
		for _, s := range live {
			master, err := MasterOf(ctx, s.Addr(), slot)
			if err != nil || master == "" || master == dead.Addr() {
				return false, fmt.Sprintf("%s: slot %d served by %q (%v)", s.Addr(), slot, master, err)
			}
			cl := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
			info, err := cl.ClusterInfo(ctx).Result()
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false, fmt.Sprintf("%s: %v %v", s.Addr(), info, err)
			}
		}
		return true, ""
	})
	if !ok {
		c.t.Fatalf("no failover of %s within %s: %s", dead.Addr(), startTimeout, last)
	}
}

// Sentinel is a master with one replica, watched by one sentinel (more with
// AddSentinel).
type Sentinel struct {
	// Master is the master StartSentinel started; after Failover it is a
	// replica.
	Master *Server
	// Replica replicates Master; after Failover it is the master.
	Replica *Server
	// Sentinel is the sentinel process (redis-server --sentinel).
	Sentinel *Server
	// MasterName is the name the sentinel monitors the master under.
	MasterName string
	// Username and Password are the sentinel's ACL user (Username "" for
	// requirepass), Password "" for none.
	Username, Password string
	t                  testing.TB
}

// MasterName is the master name StartSentinel uses.
const MasterName = "dedupgw-test"

// StartSentinel starts a master, a replica of it, and a sentinel monitoring
// the master under MasterName, and waits until the replica is in sync and the
// sentinel reports the master and knows the replica as linked to it (one it
// can promote).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return startSentinel(t, "", "")
}

// StartSentinelWithPassword is StartSentinel with a sentinel that requires
// password (requirepass in its configuration file).
func StartSentinelWithPassword(t testing.TB, password string) *Sentinel {
	t.Helper()
	return startSentinel(t, "", password)
}

// StartSentinelWithUser is StartSentinel with a sentinel whose only user is
// the ACL user username with password (the default user is off).
func StartSentinelWithUser(t testing.TB, username, password string) *Sentinel {
	t.Helper()
	return startSentinel(t, username, password)
}

func startSentinel(t testing.TB, username, password string) *Sentinel {
	t.Helper()
	// The replica must be attached before the sentinel's first look at the
	// master (it lists replicas from the master's INFO, then only every 10s).
	master, replica := StartReplicated(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	st := &Sentinel{Master: master, Replica: replica, MasterName: MasterName, Username: username, Password: password, t: t}
	st.Sentinel = st.startSentinelProcess()
	st.waitKnows(ctx, st.Sentinel, "the sentinel")
	return st
}

// waitKnows waits until the sentinel sent (named what in a failure) reports
// st's master and knows st's replica as linked to it, one it can promote.
func (st *Sentinel) waitKnows(ctx context.Context, sent *Server, what string) {
	st.t.Helper()
	sc := st.clientOf(sent)
	defer sc.Close()
	st.waitFor(ctx, what+" to know master and replica", func() (bool, string) {
		addr, err := sc.GetMasterAddrByName(ctx, MasterName).Result()
		if err != nil || len(addr) != 2 || addr[1] != strconv.Itoa(st.Master.Port()) {
			return false, fmt.Sprintf("get-master-addr-by-name: %v %v", addr, err)
		}
		// A sentinel promotes only a replica whose own INFO it has read
		// and found linked to the master (else SENTINEL FAILOVER answers
		// NOGOODSLAVE); it reads a replica's INFO only every 10s.
		replicas, err := sc.Replicas(ctx, MasterName).Result()
		if err != nil || len(replicas) != 1 || replicas[0]["port"] != strconv.Itoa(st.Replica.Port()) ||
			strings.Contains(replicas[0]["flags"], "disconnected") || replicas[0]["master-link-status"] != "ok" {
			return false, fmt.Sprintf("SENTINEL REPLICAS: %v %v", replicas, err)
		}
		return true, ""
	})
}

// startSentinelProcess starts a sentinel monitoring st.Master under
// MasterName (quorum 1), with st's user or password, and returns it.
func (st *Sentinel) startSentinelProcess() *Server {
	t := st.t
	t.Helper()
	port := freePort(t, false)
	// A sentinel rewrites its configuration file, so it must have one of its
	// own, writable.
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %s 5000\nsentinel failover-timeout %s %d\n",
		port, MasterName, st.Master.Port(), MasterName, MasterName, sentinelFailoverTimeout.Milliseconds())
	switch {
	case st.Username != "":
		conf += fmt.Sprintf("user default off\nuser %s on >%s allcommands allkeys allchannels\n", st.Username, st.Password)
	case st.Password != "":
		conf += fmt.Sprintf("requirepass %q\n", st.Password)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatalf("write sentinel.conf: %v", err)
	}
	// The config file must be the first argument; the common arguments
	// Start adds after it agree with the file.
	sent := &Server{t: t, bin: Binary(t), dir: dir, port: port, conf: path, args: []string{"--sentinel"}, user: st.Username, auth: st.Password}
	t.Cleanup(sent.Stop)
	sent.Start()
	return sent
}

// AddSentinel starts another sentinel watching st's master, as StartSentinel
// started st.Sentinel, and waits until it knows the master and the replica
// as StartSentinel does (so that it, too, can promote the replica). Call it
// before Failover. Failover and FailoverBy may then go through either
// sentinel.
func (st *Sentinel) AddSentinel() *Server {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	sent := st.startSentinelProcess()
	st.waitKnows(ctx, sent, "the added sentinel")
	return sent
}

// client returns a new client of the sentinel, authenticated as st's user;
// the caller closes it.
func (st *Sentinel) client() *redis.SentinelClient { return st.clientOf(st.Sentinel) }

// clientOf returns a new client of the sentinel sent, authenticated as st's
// user; the caller closes it.
func (st *Sentinel) clientOf(sent *Server) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: sent.Addr(), Username: st.Username, Password: st.Password, MaxRetries: -1})
}

// StartReplicated starts a master and one replica of it, and waits until the
// replica acknowledges the master's writes (AwaitReplicas).
func StartReplicated(t testing.TB) (master, replica *Server) {
	t.Helper()
	// Without the delay a master waits 5s for more replicas before the
	// first (diskless) sync.
	master = StartWith(t, "--repl-diskless-sync-delay", "0")
	replica = StartWith(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port()))
	AwaitReplicas(t, master, 1)
	return master, replica
}

// AwaitReplicas waits until n replicas acknowledge master's writes (WAIT),
// failing t after startTimeout. After a full sync a master streams writes
// to a replica only from the replica's first acknowledgement, which Redis
// sends once a second: until then WAIT counts it out. The probe writes and
// deletes one key, redistest:replicated, leaving nothing behind, and sends
// WAIT in the same pipeline: WAIT counts the writes of its own connection
// (from Redis 7.2 on, a connection that wrote nothing counts every replica).
//
// A master without a replication backlog (none attached yet) does not
// advance its replication offset for a write, so a WAIT after it waits for
// offset 0, which a replica meets the moment its full sync ends, before its
// first acknowledgement: the first real write then waits up to a second.
// The probe therefore counts only when the backlog existed before its
// writes (INFO replication first, in the same pipeline).
func AwaitReplicas(t testing.TB, master *Server, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: master.Addr(), MaxRetries: -1})
	defer c.Close()
	var (
		acked   int64
		backlog bool
		err     error
	)
	for ctx.Err() == nil {
		var (
			info *redis.StringCmd
			wait *redis.IntCmd
		)
		_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			info = p.Info(ctx, "replication")
			p.Set(ctx, "redistest:replicated", 1, 0)
			p.Del(ctx, "redistest:replicated")
			wait = redis.NewIntCmd(ctx, "wait", n, 100)
			return p.Process(ctx, wait)
		})
		if err == nil {
			acked, backlog = wait.Val(), hasLine(info.Val(), "repl_backlog_active:1")
		}
		if err == nil && backlog && acked >= int64(n) {
			return
		}
	}
	t.Fatalf("%d replicas acknowledging %s within %v: got %d, replication backlog %v (%v)", n, master.Addr(), startTimeout, acked, backlog, err)
}

// Failover makes the sentinel promote the replica (SENTINEL FAILOVER) and
// waits until it reports the replica as the master, which then accepts
// writes. The old master becomes its replica.
func (st *Sentinel) Failover() {
	st.t.Helper()
	st.FailoverBy(st.Sentinel)
}

// FailoverBy is Failover asked of the sentinel sent (st.Sentinel, or one
// AddSentinel started), which the others learn about from it.
//
// A sentinel whose timer ran more than 2 s late (a loaded machine) enters
// TILT mode and takes no action for 30 s, and the failover it was asked for
// may meanwhile pass its failover-timeout unfinished. So the wait allows
// for a TILT, and FailoverBy asks again, once, after a TILT it saw.
func (st *Sentinel) FailoverBy(sent *Server) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+tiltPeriod+sentinelFailoverTimeout)
	defer cancel()
	sc := st.clientOf(sent)
	defer sc.Close()
	if err := sc.Failover(ctx, st.MasterName).Err(); err != nil {
		st.t.Fatalf("SENTINEL FAILOVER %s: %v", st.MasterName, err)
	}
	asked, tilted, again := time.Now(), false, false
	rc := redis.NewClient(&redis.Options{Addr: st.Replica.Addr(), MaxRetries: -1})
	defer rc.Close()
	st.waitFor(ctx, "the replica promoted", func() (bool, string) {
		addr, err := sc.GetMasterAddrByName(ctx, st.MasterName).Result()
		if err != nil || len(addr) != 2 || addr[1] != strconv.Itoa(st.Replica.Port()) {
			cmd := redis.NewStringCmd(ctx, "info", "sentinel")
			_ = sc.Process(ctx, cmd)
			inTilt := hasLine(cmd.Val(), "sentinel_tilt:1")
			tilted = tilted || inTilt
			if tilted && !again && time.Since(asked) > sentinelFailoverTimeout+time.Second && !inTilt {
				again = true // the first request timed out during the TILT
				_ = sc.Failover(ctx, st.MasterName).Err()
			}
			return false, fmt.Sprintf("get-master-addr-by-name: %v %v (TILT seen: %v)", addr, err, tilted)
		}
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "role:master") {
			return false, fmt.Sprintf("new master INFO replication: %v %q", err, info)
		}
		return true, ""
	})
}

// waitFor polls cond until it holds, failing the test with cond's last
// explanation when ctx ends.
func (st *Sentinel) waitFor(ctx context.Context, what string, cond func() (bool, string)) {
	st.t.Helper()
	if ok, why := poll(ctx, cond); !ok {
		log := ""
		if st.Sentinel != nil {
			log = st.Sentinel.logTail()
		}
		st.t.Fatalf("sentinel set-up: waiting for %s: %s\n%s", what, why, log)
	}
}

// poll calls cond every 20ms until it holds or ctx ends. It reports
// whether cond held, and otherwise cond's last explanation.
func poll(ctx context.Context, cond func() (bool, string)) (bool, string) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return true, ""
		}
		select {
		case <-ctx.Done():
			return false, why
		case <-tick.C:
		}
	}
}
