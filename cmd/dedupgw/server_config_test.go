package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestServerTimeouts: the server: block's keys, their defaults, their
// DEDUPGW_* overrides and their problems.
func TestServerTimeouts(t *testing.T) {
	tests := []struct {
		name                 string
		text                 string
		env                  map[string]string
		wantHeader, wantRead time.Duration
		wantIdle             time.Duration
		wantProblems         []string
	}{
		{"defaults", minimal, nil, 10 * time.Second, 30 * time.Second, 120 * time.Second, nil},
		{"default read timeout grows with max_body_bytes", "defaults:\n  max_body_bytes: 67108864\n" + minimal, nil,
			10 * time.Second, 10*time.Second + 1024*time.Second, 120 * time.Second, nil},
		{"default read timeout follows the header timeout", "server:\n  read_header_timeout: 20s\ndefaults:\n  max_body_bytes: 67108864\n" + minimal, nil,
			20 * time.Second, 20*time.Second + 1024*time.Second, 120 * time.Second, nil},
		{"all set (the chaos suite's block)", "server:\n  read_header_timeout: 1s\n  read_timeout: 2s\n  idle_timeout: 5s\n" + minimal, nil,
			time.Second, 2 * time.Second, 5 * time.Second, nil},
		{"environment overrides the file", "server:\n  read_timeout: 2s\n" + minimal, map[string]string{
			"DEDUPGW_SERVER_READ_HEADER_TIMEOUT": "3s",
			"DEDUPGW_SERVER_READ_TIMEOUT":        "45s",
			"DEDUPGW_SERVER_IDLE_TIMEOUT":        "1m",
		}, 3 * time.Second, 45 * time.Second, time.Minute, nil},
		{"zero and negative", "server:\n  read_header_timeout: 0s\n  read_timeout: -1s\n  idle_timeout: 0\n" + minimal, nil,
			0, 0, 0, []string{
				"server.read_header_timeout: must be greater than 0, got 0s",
				"server.read_timeout: must be greater than 0, got -1s",
				"server.idle_timeout: must be greater than 0, got 0s",
			}},
		{"read shorter than header", "server:\n  read_header_timeout: 5s\n  read_timeout: 2s\n" + minimal, nil,
			0, 0, 0, []string{"server.read_timeout: 2s must not be shorter than read_header_timeout 5s (it bounds headers and body)"}},
		{"read shorter than the default header timeout", "server:\n  read_timeout: 2s\n" + minimal, nil,
			0, 0, 0, []string{"server.read_timeout: 2s must not be shorter than read_header_timeout 10s (it bounds headers and body)"}},
		{"bad duration", "server:\n  idle_timeout: soon\n" + minimal, nil,
			0, 0, 0, []string{`server.idle_timeout: invalid duration "soon" (want e.g. "300ms", "30s", "24h")`}},
		{"unknown key", "server:\n  write_timeout: 1s\n" + minimal, nil,
			0, 0, 0, []string{"server.write_timeout: unknown key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, problems := loadText(t, tt.text, tt.env)
			if !slices.Equal(problems, tt.wantProblems) {
				t.Fatalf("got problems\n  %s\nwant\n  %s", strings.Join(problems, "\n  "), strings.Join(tt.wantProblems, "\n  "))
			}
			if len(problems) > 0 {
				return
			}
			checks := []struct {
				name      string
				got, want time.Duration
			}{
				{"read_header_timeout", headerTimeout(f), tt.wantHeader},
				{"read_timeout", readTimeout(f), tt.wantRead},
				{"body timeout", bodyTimeout(f), tt.wantRead},
				{"idle_timeout", idleTimeoutOf(f), tt.wantIdle},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
				}
			}
		})
	}
}
