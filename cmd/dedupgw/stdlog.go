package main

import (
	stdlog "log"
	"strings"

	"go.uber.org/zap"
)

// redirectStdLog sends what the standard library writes to the log
// package's default logger to log, at warn, as JSON like every other line,
// until the returned func restores the previous output. net/http's
// Transport writes there: "Unsolicited response received on idle HTTP
// channel starting with %q" quotes what an upstream sent past its response
// (a 204 with a body, a wrong Content-Length), which may be a body, and a
// body is never logged; stdLogMessage cuts it out.
func redirectStdLog(log *zap.Logger) (restore func()) {
	out, flags, prefix := stdlog.Writer(), stdlog.Flags(), stdlog.Prefix()
	stdlog.SetOutput(stdLogWriter{log})
	stdlog.SetFlags(0)
	stdlog.SetPrefix("")
	return func() {
		stdlog.SetOutput(out)
		stdlog.SetFlags(flags)
		stdlog.SetPrefix(prefix)
	}
}

// stdLogWriter logs each line the standard library's logger writes.
type stdLogWriter struct{ log *zap.Logger }

// Write implements io.Writer; the log package calls it once per line.
func (w stdLogWriter) Write(p []byte) (int, error) {
	w.log.Warn(stdLogMessage(string(p)))
	return len(p), nil
}

// maxStdLogLine bounds a line from the standard library's logger.
const maxStdLogLine = 512

// stdLogMessage returns line without the peer's bytes that net/http quotes
// after "starting with" and without its newline, at most maxStdLogLine
// bytes.
func stdLogMessage(line string) string {
	line = strings.TrimSpace(line)
	if i := strings.Index(line, " starting with "); i >= 0 {
		line = line[:i] + " (the bytes are not logged)"
	}
	if len(line) > maxStdLogLine {
		line = line[:maxStdLogLine] + "…"
	}
	return line
}
