package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// fileRefPrefix starts a reference to a file's content in a config value:
// ${file:PATH}.
const fileRefPrefix = "file:"

// maxFileRef bounds the file a ${file:PATH} reference reads: it holds one
// value (a secret, a password), not a document, and a reference to a log
// or a device by mistake must not be read whole on every load.
const maxFileRef = 64 << 10

// expander resolves the references in config values (see expand).
type expander struct {
	// env looks variables up; it is never nil.
	env func(string) (string, bool)
	// dir is the config file's directory: a relative ${file:PATH} is
	// read from there, wherever the process was started.
	dir string
	// files records the state of every file a reference named, read or
	// not, by absolute path: what the watcher compares the files with.
	files map[string]fileState
}

// fileState is what reading a referenced file found: the SHA-256 of its
// content, or why it could not be read. Two reads of an unchanged file
// give equal states; the content itself is not kept.
type fileState struct {
	sum [sha256.Size]byte
	err string
}

// readFileRef returns the content of the file that ${file:PATH} names
// (PATH as written, relative to the config file's directory unless
// absolute), without one trailing "\n" or "\r\n" (what echo, an editor or
// kubectl create secret --from-file leave), and the path it was read at.
// A file that is missing or unreadable, a directory or another file that
// is not a regular one, and one larger than maxFileRef are errors naming
// the path and never the content. Every file named is recorded in x.files.
func (x *expander) readFileRef(p string) (val, read string, err error) {
	switch {
	case p == "":
		return "", "", errors.New("${file:} names no file (want ${file:/path/to/file})")
	case strings.Contains(p, "${"):
		// "${file:${DIR}/x}" ends at the first "}": the path would be "${DIR".
		return "", "", fmt.Errorf("${file:%s…}: a file path cannot hold a ${…} reference; write the path out (a relative one starts at the config file's directory)", p)
	}
	read = p
	if !filepath.IsAbs(p) {
		read = filepath.Join(x.dir, p)
	}
	b, rerr := readRefFile(read)
	st := stateOf(b, rerr)
	if rerr != nil {
		where := read
		if read != p {
			where = fmt.Sprintf("%s (%s)", read, p)
		}
		err = fmt.Errorf("${file:%s}: cannot read %s: %w", p, where, rerr)
	}
	if abs, aerr := filepath.Abs(read); aerr == nil {
		x.files[abs] = st
	} else {
		x.files[read] = st
	}
	if err != nil {
		return "", read, err
	}
	s := string(b)
	if t, ok := strings.CutSuffix(s, "\r\n"); ok {
		s = t
	} else {
		s = strings.TrimSuffix(s, "\n")
	}
	return s, read, nil
}

// Errors of readRefFile, beside those of the file system.
var (
	errRefDir       = errors.New("it is a directory (name the file in it that holds the value, e.g. a Secret's key)")
	errRefIrregular = errors.New("not a regular file")
	errRefTooLarge  = fmt.Errorf("larger than %d KiB (a referenced file holds one value)", maxFileRef>>10)
)

// afterRefStat runs between readRefFile's Stat and its Open: a test's hook.
var afterRefStat = func(string) {}

// readRefFile reads the regular file at path, up to maxFileRef bytes. An
// error from the file system is returned without the path (the caller
// names it once).
func readRefFile(path string) ([]byte, error) { return readRegular(path, maxFileRef) }

// readRegular reads the regular file at path, and fails with
// errRefTooLarge when it is longer than limit bytes (limit < 0: no
// limit). It never blocks on a FIFO: one is refused (errRefIrregular), as
// a directory is (errRefDir). An error from the file system is returned
// without the path.
func readRegular(path string, limit int64) ([]byte, error) {
	// Stat first: opening a FIFO would block.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, bare(err)
	}
	switch {
	case fi.IsDir():
		return nil, errRefDir
	case !fi.Mode().IsRegular():
		return nil, errRefIrregular
	}
	afterRefStat(path)
	// Open without blocking and check again what was opened: the path
	// may have been swapped for a FIFO since the Stat.
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, bare(err)
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, errRefIrregular
	}
	var r io.Reader = fh
	if limit >= 0 {
		r = io.LimitReader(fh, limit+1)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, bare(err)
	}
	if limit >= 0 && int64(len(b)) > limit {
		return nil, errRefTooLarge
	}
	return b, nil
}

// bare is err without the path a *fs.PathError repeats.
func bare(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// referencedFiles returns the state of each file f's ${file:PATH}
// references read, by absolute path: the files a reload must follow.
func (f *File) referencedFiles() map[string]fileState {
	return f.files
}

// watchedFiles returns what serve follows for f: the referenced files and
// the configuration file itself (by absolute path, with the state of the
// text this load read), so an edit of the file reloads as SIGHUP does: a
// Kubernetes ConfigMap volume is updated in place, and nothing signals.
func (f *File) watchedFiles() map[string]fileState {
	out := maps.Clone(f.files)
	if f.source != "" {
		if out == nil {
			out = map[string]fileState{}
		}
		out[f.source] = f.sourceRead
	}
	return out
}

// configStateOf reads the configuration file at path (absolute) as Load
// does, whatever its size, and returns its state. A file that is not
// regular (Load follows none) is an error state, read without blocking.
func configStateOf(path string) fileState { return stateOf(readRegular(path, -1)) }

// fileStateOf reads the file at path (absolute) as a reference would, and
// returns its state.
func fileStateOf(path string) fileState { return stateOf(readRefFile(path)) }

// stateOf is the state of a read of readRefFile that returned b and err:
// the one definition the load and the watcher compare.
func stateOf(b []byte, err error) fileState {
	if err != nil {
		return fileState{err: err.Error()}
	}
	return fileState{sum: sha256.Sum256(b)}
}

// dropFileErrKeys returns ps without the problems of the values whose
// referenced files could not be read (see fileErrs): the file's problem
// explains them. A list written as one string ("secrets: ${file:x}") has
// its entry's problems under key[0].
func (f *File) dropFileErrKeys(ps Problems) Problems {
	if len(f.fileErrs) == 0 {
		return ps
	}
	return slices.DeleteFunc(ps, func(p Problem) bool {
		for k := range f.fileErrs {
			if keyWithin(p.Key, k) {
				return true
			}
		}
		return false
	})
}

// fileContentNotShown stands in a problem for what a ${file:PATH}
// reference read.
const fileContentNotShown = "<read from a ${file:} reference, not shown>"

// minHiddenContent is the shortest content hideFileContents looks for:
// a shorter one would match unrelated text of the message, and gives
// little away.
const minHiddenContent = 4

// hideFileContents returns ps with what the ${file:PATH} references of
// each problem's value read replaced by fileContentNotShown, and what its
// ${VAR} references read by "<${VAR}, not shown>", as written and as %q
// quotes it: such files and variables hold secrets, and a secret put
// under the wrong key ("window: ${file:db-password}", "window:
// ${STRIPE_WEBHOOK_SECRET}") must not reach a log.
func (f *File) hideFileContents(ps Problems) Problems {
	if len(f.fileContents) == 0 {
		return ps
	}
	for i, p := range ps {
		for k, contents := range f.fileContents {
			if !keyWithin(p.Key, k) && !keyWithin(k, p.Key) {
				continue
			}
			for _, c := range contents {
				if len(c.text) < minHiddenContent {
					continue
				}
				quoted := strconv.Quote(c.text)
				p.Msg = strings.ReplaceAll(p.Msg, quoted[1:len(quoted)-1], c.shownAs)
				p.Msg = strings.ReplaceAll(p.Msg, c.text, c.shownAs)
			}
		}
		ps[i] = p
	}
	return ps
}

// keyWithin reports whether the key path k is key or one of its list's
// entries ("secrets[0]" within "secrets").
func keyWithin(k, key string) bool {
	return k == key || strings.HasPrefix(k, key+"[")
}

// whyEmpty says why key's value is empty, in whole or in part: the
// environment variables it named that are not set, and the files it named
// that are empty; "" when neither.
func (f *File) whyEmpty(key string) string {
	var why []string
	if vars := f.unset[key]; len(vars) > 0 {
		why = append(why, fmt.Sprintf("environment variable %s is not set", strings.Join(vars, ", ")))
	}
	if files := f.emptyFiles[key]; len(files) > 0 {
		noun := "file"
		verb := "is"
		if len(files) > 1 {
			noun, verb = "files", "are"
		}
		why = append(why, fmt.Sprintf("%s %s %s empty", noun, strings.Join(files, ", "), verb))
	}
	return strings.Join(why, "; ")
}
