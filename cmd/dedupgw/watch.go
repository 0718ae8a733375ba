package main

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// defaultWatchInterval is how often serve reads the configuration file and
// the files that the running configuration's ${file:PATH} references name.
// A change is acted on once two reads in a row agree on it, so within two
// intervals: ten seconds. A ConfigMap or Secret volume's update reaches
// the pod within the kubelet's sync period (a minute or so); ten seconds
// more is small beside it, and reading a few small files that often costs
// nothing.
const defaultWatchInterval = 5 * time.Second

// fileWatch follows a configuration file and the files its ${file:PATH}
// references named. Every interval it reads each of them and compares the
// content's hash (not the modification time: a Kubernetes Secret volume
// updates by swapping a symlink, and a file may be replaced by one with an
// older mtime) with the state last seen; a file that changed, or that became
// readable or unreadable, is reported once on Changed, when the next read
// finds the same new state. A file written in place (truncated, then
// written) can be read half-written, and half a YAML file may well be a
// valid configuration with routes missing: a state that the next read
// does not find again is a write under way, and is not reported. Each
// state is reported once, so a change that makes the configuration
// invalid is tried once, not every interval. The goroutine runs until
// Stop.
type fileWatch struct {
	interval time.Duration
	// config is the configuration file's path, read whole (configStateOf);
	// the others are read as references are (fileStateOf).
	config string

	mu sync.Mutex
	// seen is the state last seen of each file followed, by absolute path.
	seen map[string]fileState
	// unsettled holds a new state that one read found, for a path whose
	// change is reported when the next read finds that state again.
	unsettled map[string]fileState
	// gen counts the changes of seen from outside (Follow, Saw): a read
	// that started before one is dropped, not compared with the new states.
	gen uint64
	// pending are the paths changed since Take last ran.
	pending []string

	changed      chan struct{} // one buffered signal: pending is not empty
	done, exited chan struct{}
	once         sync.Once
}

// startFileWatch starts following files (states by absolute path, as
// File.watchedFiles gives them), reading them every interval; config is
// the configuration file's path among them.
func startFileWatch(interval time.Duration, files map[string]fileState, config string) *fileWatch {
	w := &fileWatch{
		interval: interval,
		config:   config,
		seen:     maps.Clone(files),
		changed:  make(chan struct{}, 1),
		done:     make(chan struct{}),
		exited:   make(chan struct{}),
	}
	go w.loop()
	return w
}

func (w *fileWatch) loop() {
	defer close(w.exited)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.poll()
		case <-w.done:
			return
		}
	}
}

// poll reads every file followed, and signals Changed when one's state
// differs from the state last seen, and the read before found it too.
func (w *fileWatch) poll() {
	w.mu.Lock()
	paths := slices.Collect(maps.Keys(w.seen))
	gen := w.gen
	w.mu.Unlock()
	if len(paths) == 0 {
		return
	}
	now := make(map[string]fileState, len(paths))
	for _, p := range paths {
		if p == w.config {
			now[p] = configStateOf(p)
		} else {
			now[p] = fileStateOf(p)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen != w.gen {
		return // followed anew while reading: compare at the next tick
	}
	n := len(w.pending)
	for _, p := range paths {
		st := now[p]
		if st == w.seen[p] {
			delete(w.unsettled, p) // back as it was: a change undone
			continue
		}
		if u, ok := w.unsettled[p]; !ok || u != st {
			if w.unsettled == nil {
				w.unsettled = make(map[string]fileState)
			}
			w.unsettled[p] = st // a write may be under way: read it again
			continue
		}
		delete(w.unsettled, p)
		w.seen[p] = st
		if !slices.Contains(w.pending, p) {
			w.pending = append(w.pending, p)
		}
	}
	if len(w.pending) > n {
		select {
		case w.changed <- struct{}{}:
		default: // a signal is already waiting; Take gets these paths too
		}
	}
}

// Changed receives a value when followed files changed; Take names them.
// A nil fileWatch's channel is nil, which never receives.
func (w *fileWatch) Changed() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.changed
}

// Take returns the paths that changed since it last ran, sorted.
func (w *fileWatch) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pending
	w.pending = nil
	slices.Sort(out)
	return out
}

// Follow replaces the files followed by files (a configuration now in
// force), with the states its load read.
func (w *fileWatch) Follow(files map[string]fileState) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = maps.Clone(files)
	w.unsettled = nil
	w.pending = nil
	w.gen++
}

// Saw records the states a load read (whether the configuration it loaded
// is in force or not), so a change that a reload already tried (a
// SIGHUP's) is not reported again. A file not followed yet is followed
// from now on, until the next Follow: a rejected configuration may name a
// file that is not there yet (a Secret volume that updates after the
// ConfigMap naming it), and its arrival must try the reload again.
func (w *fileWatch) Saw(files map[string]fileState) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen = make(map[string]fileState, len(files))
	}
	for p, st := range files {
		w.seen[p] = st
		delete(w.unsettled, p)
		w.pending = slices.DeleteFunc(w.pending, func(q string) bool { return q == p })
	}
	w.gen++
}

// Stop ends the goroutine, and returns when it has ended. Calling it again
// does nothing.
func (w *fileWatch) Stop() {
	if w == nil {
		return
	}
	w.once.Do(func() {
		close(w.done)
		<-w.exited
	})
}
