package redisstore

import (
	"context"
	"fmt"

	"go.uber.org/zap"
)

// GoRedisLogger adapts a zap.Logger to go-redis's process-wide logger, which
// otherwise writes plain text lines ("redis: … failed to dial …") to stderr
// next to the gateway's JSON logs. go-redis keeps one logger for the whole
// process, so only main should install it, once:
//
//	redis.SetLogger(redisstore.GoRedisLogger{Logger: log.Named("go-redis")})
//
// Lines are logged at Warn: go-redis logs only trouble (failed dials, pool
// and sentinel events). A nil Logger discards them.
type GoRedisLogger struct {
	Logger *zap.Logger
}

// Printf implements go-redis's logging interface.
func (l GoRedisLogger) Printf(_ context.Context, format string, v ...any) {
	if l.Logger == nil {
		return
	}
	l.Logger.Warn(fmt.Sprintf(format, v...))
}
