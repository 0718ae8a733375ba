package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultKeyPrefix    = "dedupgw:"
	DefaultDialTimeout  = 2 * time.Second
	DefaultReadTimeout  = time.Second
	DefaultWriteTimeout = time.Second
	DefaultWaitTimeout  = 100 * time.Millisecond
)

// sentinelConnLifetime is how long a connection to a Sentinel master lives.
// go-redis learns of a failover from the +switch-master of the one sentinel
// it listens to, or when it dials, asking that sentinel (another one, if it
// does not answer) where the master is. While the sentinel it listens to is
// down, a failover another one makes goes unnoticed, and the old master takes
// the claims and commits, losing them when it is demoted (some 10s later,
// or never while partitioned). Connections that live a second end that
// within about a second, for a dial and a sentinel round trip per
// connection and second.
const sentinelConnLifetime = time.Second

// Config is the plain-data description of the Redis deployment, the
// store.redis block of the configuration file.
type Config struct {
	// Addrs are "host:port" addresses. One address is a single node; two or
	// more (or one, with Cluster) are seed nodes of a Redis Cluster; with
	// MasterName set they are Sentinel addresses. Required.
	Addrs []string
	// Cluster, when true, treats even a single address as a Redis Cluster
	// seed: a managed service's one configuration endpoint. False means
	// Cluster only with several addresses. Not with MasterName.
	Cluster bool
	// MasterName, when set, selects Sentinel: the store talks to the master
	// the sentinels at Addrs report under this name, and follows failovers.
	// Empty means single node or Cluster.
	MasterName string
	// Username and Password authenticate (Redis 6 ACL when Username is set,
	// the legacy requirepass otherwise). Empty means no authentication. With
	// Sentinel they authenticate to the master (and its replicas).
	Username string
	Password string
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// themselves (their requirepass, or an ACL user with SentinelUsername).
	// Empty means the sentinels are reached without. Sentinel only.
	SentinelUsername string
	SentinelPassword string
	// DB selects the logical database on a single node or Sentinel master.
	// Zero means database 0. A Cluster has only database 0: a non-zero DB
	// with several addresses, or with Cluster, is an error.
	DB int
	// TLS, when true, connects with TLS (minimum TLS 1.2, server name from
	// the address, system roots). False means plain TCP.
	TLS bool
	// KeyPrefix starts every key the store writes. Empty means "dedupgw:".
	KeyPrefix string
	// DialTimeout bounds establishing a connection. Zero means 2s.
	DialTimeout time.Duration
	// ReadTimeout and WriteTimeout bound one command's socket read and write.
	// Zero means 1s each; a negative value means no timeout. A request's
	// context deadline applies as well.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// PoolSize is the number of connections per node. Zero means go-redis's
	// default, 10 per GOMAXPROCS. The store's operations travel in pipelines
	// (see pipeliner), which go-redis sends on its separate pipeline pool,
	// at most two at once per node; this pool serves the rest (Ping).
	PoolSize int
	// WaitReplicas, when positive, makes every claim and commit wait (Redis
	// WAIT, in the same pipeline) until that many replicas acknowledged it,
	// for at most WaitTimeout. A claim too few acknowledged is undone and
	// fails, and a commit fails, both with dedup.ErrNotReplicated: a
	// Sentinel failover then cannot lose a claim or commit the gateway acted
	// on without its saying so. Single node or Sentinel only (a Cluster
	// routes WAIT to no particular shard). Zero means no waiting.
	WaitReplicas int
	// WaitTimeout bounds that wait. Zero means DefaultWaitTimeout (100ms);
	// it must stay below ReadTimeout.
	//
	// While waiting, go-redis does not retry a command that failed on the
	// network: a re-sent claim or commit that finds its own write in place
	// writes nothing, and from Redis 7.2 on WAIT then checks nothing on the
	// new connection.
	WaitTimeout time.Duration
}

// waitTimeout is WaitTimeout with its default.
func (c Config) waitTimeout() time.Duration {
	if c.WaitTimeout == 0 {
		return DefaultWaitTimeout
	}
	return c.WaitTimeout
}

// validate checks Config before a client is built.
func (c Config) validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("redisstore: addrs: at least one address is required")
	}
	for _, a := range c.Addrs {
		if a == "" {
			return errors.New("redisstore: addrs: empty address")
		}
	}
	if c.DB < 0 {
		return errors.New("redisstore: db: must not be negative")
	}
	if c.MasterName == "" && (c.SentinelUsername != "" || c.SentinelPassword != "") {
		return errors.New("redisstore: sentinel_username, sentinel_password: set only with master_name (Sentinel)")
	}
	if c.SentinelUsername != "" && c.SentinelPassword == "" {
		return errors.New("redisstore: sentinel_username: needs sentinel_password (go-redis sends no AUTH without one)")
	}
	if c.Cluster && c.MasterName != "" {
		return errors.New("redisstore: cluster: a Redis Cluster has no master_name (that is Sentinel)")
	}
	if c.mode() == "cluster" && c.DB != 0 {
		return errors.New("redisstore: db: a cluster has only database 0")
	}
	if c.PoolSize < 0 {
		return errors.New("redisstore: pool_size: must not be negative")
	}
	switch {
	case c.WaitReplicas < 0:
		return errors.New("redisstore: wait_replicas: must not be negative")
	case c.WaitReplicas > 0 && c.mode() == "cluster":
		return errors.New("redisstore: wait_replicas: a Cluster routes WAIT to no particular shard; use it with a single node or Sentinel")
	case c.WaitTimeout < 0:
		return errors.New("redisstore: wait_timeout: must not be negative")
	case c.WaitTimeout > 0 && c.WaitTimeout < time.Millisecond:
		return errors.New("redisstore: wait_timeout: must be at least 1ms (WAIT counts milliseconds; 0 would wait for ever)")
	}
	if read := c.universalOptions().ReadTimeout; c.WaitReplicas > 0 && read > 0 && c.waitTimeout() >= read {
		return fmt.Errorf("redisstore: wait_timeout: %s must be below the read timeout (%s), which would cut the wait off", c.waitTimeout(), read)
	}
	return nil
}

// mode names the topology New picks for c: "sentinel", "cluster" or "single".
func (c Config) mode() string {
	switch {
	case c.MasterName != "":
		return "sentinel"
	case len(c.Addrs) > 1 || c.Cluster:
		return "cluster"
	}
	return "single"
}

// universalOptions returns the go-redis options for c with defaults filled
// in. redis.NewUniversalClient picks the client from them: MasterName set
// means a failover (Sentinel) client, several Addrs a cluster client, one
// address a single-node client (a cluster client with Cluster).
func (c Config) universalOptions() *redis.UniversalOptions {
	o := &redis.UniversalOptions{
		Addrs:         c.Addrs,
		MasterName:    c.MasterName,
		IsClusterMode: c.Cluster,
		Username:      c.Username,
		Password:      c.Password,
		// The sentinels' own credentials; go-redis uses them for Sentinel
		// only.
		SentinelUsername: c.SentinelUsername,
		SentinelPassword: c.SentinelPassword,
		DB:               c.DB,
		DialTimeout:      c.DialTimeout,
		ReadTimeout:      c.ReadTimeout,
		WriteTimeout:     c.WriteTimeout,
		PoolSize:         c.PoolSize,
		// Honour the caller's context deadline (the gateway bounds each store
		// call), not only the socket timeouts.
		ContextTimeoutEnabled: true,
		// Fail fast while Redis is down, so a delivery meets its
		// on_store_error policy in milliseconds, not seconds: one dial per
		// connection attempt (go-redis's default is 5, 100ms apart) and one
		// retry of a command that failed on a network error (default 3).
		DialerRetries: 1,
		MaxRetries:    1,
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if c.WaitReplicas > 0 {
		o.MaxRetries = -1 // see WaitTimeout
	}
	if c.MasterName != "" {
		o.ConnMaxLifetime = sentinelConnLifetime
		o.ConnMaxLifetimeJitter = sentinelConnLifetime / 4
	}
	if c.TLS {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return o
}
