package redisstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The adapter must satisfy redis.SetLogger's parameter type.
var _ = func() { redis.SetLogger(GoRedisLogger{}) }

func TestGoRedisLogger(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	GoRedisLogger{Logger: zap.New(core)}.Printf(context.Background(), "redis: failed to dial after %d attempts: %v", 1, "refused")
	GoRedisLogger{}.Printf(context.Background(), "dropped %d", 1) // nil Logger: no panic
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("entries: got %d, want 1", len(entries))
	}
	if got, want := entries[0].Message, "redis: failed to dial after 1 attempts: refused"; got != want {
		t.Errorf("message: got %q, want %q", got, want)
	}
	if got := entries[0].Level; got != zapcore.WarnLevel {
		t.Errorf("level: got %v, want warn", got)
	}
}

func TestGoRedisLoggerLevels(t *testing.T) {
	tests := []struct {
		format string
		args   []any
		want   zapcore.Level
	}{
		{"sentinel: selected addr=%s masterAddr=%s", []any{"a:1", "b:2"}, zapcore.InfoLevel},
		{"sentinel: new master=%q addr=%q", []any{"m", "b:2"}, zapcore.InfoLevel},
		{"sentinel: discovered new sentinel=%q for master=%q", []any{"c:3", "m"}, zapcore.InfoLevel},
		{"sentinel: GetMasterAddrByName name=%q failed: %s", []any{"m", "refused"}, zapcore.WarnLevel},
		{"sentinel: GetMasterAddrByName addr=%s, master=%q failed: %s", []any{"a:1", "m", context.Canceled}, zapcore.DebugLevel},
		{"redis: connection pool: %v", []any{"broken"}, zapcore.WarnLevel},
	}
	for _, tt := range tests {
		core, logs := observer.New(zapcore.DebugLevel)
		GoRedisLogger{Logger: zap.New(core)}.Printf(context.Background(), tt.format, tt.args...)
		if got := logs.All(); len(got) != 1 || got[0].Level != tt.want {
			t.Errorf("%q: got %v, want one %v line", tt.format, got, tt.want)
		}
	}
}
