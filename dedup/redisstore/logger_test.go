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
