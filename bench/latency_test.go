package main

import (
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	ms := func(v ...int) latencies {
		var l latencies
		for _, x := range v {
			l = append(l, time.Duration(x)*time.Millisecond)
		}
		return l
	}
	hundred := make(latencies, 100)
	for i := range hundred {
		hundred[99-i] = time.Duration(i+1) * time.Millisecond // unsorted on purpose
	}
	tests := []struct {
		name string
		l    latencies
		q    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of odd", ms(3, 1, 2), 0.5, 2 * time.Millisecond},
		{"median of even", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p50 of 100", hundred, 0.5, 50 * time.Millisecond},
		{"p99 of 100", hundred, 0.99, 99 * time.Millisecond},
		{"max", hundred, 1, 100 * time.Millisecond},
		{"tiny q", hundred, 0.0001, time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.l.quantile(tt.q); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}
