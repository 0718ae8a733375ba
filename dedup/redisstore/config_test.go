package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // substring; empty means valid
	}{
		{"single", Config{Addrs: []string{"127.0.0.1:6379"}}, ""},
		{"single with db", Config{Addrs: []string{"127.0.0.1:6379"}, DB: 3}, ""},
		{"cluster", Config{Addrs: []string{"a:1", "b:1", "c:1"}}, ""},
		{"sentinel with db", Config{Addrs: []string{"a:26379", "b:26379"}, MasterName: "m", DB: 2}, ""},
		{"no addrs", Config{}, "addrs"},
		{"empty addr", Config{Addrs: []string{""}}, "addrs"},
		{"negative db", Config{Addrs: []string{"a:1"}, DB: -1}, "db"},
		{"cluster with db", Config{Addrs: []string{"a:1", "b:1"}, DB: 1}, "db"},
		{"negative pool", Config{Addrs: []string{"a:1"}, PoolSize: -1}, "pool_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate: got %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate: got %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	o := Config{Addrs: []string{"127.0.0.1:6379"}}.universalOptions()
	tests := []struct {
		name      string
		got, want any
	}{
		{"DialTimeout", o.DialTimeout, 2 * time.Second},
		{"ReadTimeout", o.ReadTimeout, time.Second},
		{"WriteTimeout", o.WriteTimeout, time.Second},
		{"PoolSize", o.PoolSize, 0},
		{"TLSConfig", o.TLSConfig == nil, true},
		{"ContextTimeoutEnabled", o.ContextTimeoutEnabled, true},
		{"DialerRetries", o.DialerRetries, 1},
		{"MaxRetries", o.MaxRetries, 1},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	o = Config{Addrs: []string{"a:1"}, TLS: true, ReadTimeout: -1, DialTimeout: time.Minute, PoolSize: 7}.universalOptions()
	if o.TLSConfig == nil || o.ReadTimeout != -1 || o.DialTimeout != time.Minute || o.PoolSize != 7 {
		t.Errorf("explicit values: got TLS %v, ReadTimeout %v, DialTimeout %v, PoolSize %d; want TLS set, -1, 1m, 7",
			o.TLSConfig != nil, o.ReadTimeout, o.DialTimeout, o.PoolSize)
	}
	// Waiting for replicas, a re-sent write could find itself in place,
	// write nothing, and leave WAIT nothing to wait for: no retries.
	if o = (Config{Addrs: []string{"a:1"}, WaitReplicas: 1}).universalOptions(); o.MaxRetries != -1 {
		t.Errorf("MaxRetries with WaitReplicas: got %d, want -1 (none)", o.MaxRetries)
	}
}

func TestNewPicksClient(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
		mode string
	}{
		{"one address is a single node", Config{Addrs: []string{"127.0.0.1:1"}}, "*redis.Client", "single"},
		{"several addresses are a cluster", Config{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "*redis.ClusterClient", "cluster"},
		{"master name is sentinel", Config{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}, MasterName: "m"}, "*redis.Client", "sentinel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg, Options{})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			defer s.Close()
			got := typeName(s.Client())
			if got != tt.want {
				t.Errorf("client type: got %s, want %s", got, tt.want)
			}
			if got := tt.cfg.mode(); got != tt.mode {
				t.Errorf("mode: got %s, want %s", got, tt.mode)
			}
			// go-redis marks a Sentinel (failover) client by this address.
			c, ok := s.Client().(*redis.Client)
			if isFailover := ok && c.Options().Addr == "FailoverClient"; isFailover != (tt.cfg.MasterName != "") {
				t.Errorf("failover client: got %v, want %v", isFailover, tt.cfg.MasterName != "")
			}
		})
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *redis.ClusterClient:
		return "*redis.ClusterClient"
	case *redis.Client:
		return "*redis.Client"
	}
	return "other"
}
