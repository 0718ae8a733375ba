package redisstore

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"
)

// GoRedisLogger adapts a zap.Logger to go-redis's process-wide logger, which
// otherwise writes plain text lines ("redis: … failed to dial …") to stderr
// next to the gateway's JSON logs. go-redis keeps one logger for the whole
// process, so only main should install it, once:
//
//	redis.SetLogger(redisstore.GoRedisLogger{Logger: log.Named("go-redis")})
//
// Lines are logged at Warn: go-redis logs mostly trouble (failed dials, pool
// errors). The Sentinel client's news (the master it found or switched to, a
// sentinel discovered) is logged at Info, since every start and every
// failover logs it. A sentinel query cut short because another sentinel
// answered first (go-redis asks them all at once and cancels the rest) is
// logged at Debug: every start logs one per other sentinel. A nil Logger
// discards them.
type GoRedisLogger struct {
	Logger *zap.Logger
}

// Printf implements go-redis's logging interface.
func (l GoRedisLogger) Printf(_ context.Context, format string, v ...any) {
	if l.Logger == nil {
		return
	}
	msg := fmt.Sprintf(format, v...)
	if strings.HasPrefix(format, "sentinel: GetMasterAddrByName") && strings.HasSuffix(msg, context.Canceled.Error()) {
		l.Logger.Debug(msg)
		return
	}
	if sentinelNews(format) {
		l.Logger.Info(msg)
		return
	}
	l.Logger.Warn(msg)
}

// sentinelNews reports whether format is one of go-redis's Sentinel lines
// that report normal events rather than trouble.
func sentinelNews(format string) bool {
	for _, p := range []string{"sentinel: selected addr=", "sentinel: new master=", "sentinel: discovered new sentinel="} {
		if strings.HasPrefix(format, p) {
			return true
		}
	}
	return false
}
