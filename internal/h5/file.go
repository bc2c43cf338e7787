package h5

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// File is an open HDF5 file. Its methods may be called from several
// goroutines; they are serialised with every other call into HDF5.
type File struct {
	path   string
	id     hid
	rw     bool
	closed bool
	tables map[string]*Table // open tables by object path, closed with the file
}

// Create creates the file at path, truncating any existing file, and opens it
// read-write.
func Create(path string) (*File, error) {
	lock()
	defer unlock()
	id := cFileCreate(path)
	if id < 0 {
		return nil, &Error{"create", path, "", libErr("")}
	}
	return &File{path: path, id: id, rw: true, tables: map[string]*Table{}}, nil
}

// Open opens an existing file read-only.
func Open(path string) (*File, error) { return open(path, false) }

// OpenRW opens an existing file read-write, to add to it or append to its
// tables.
func OpenRW(path string) (*File, error) { return open(path, true) }

func open(path string, rw bool) (*File, error) {
	op := "open"
	// Ask the OS first: its errors (missing file, permission) are clearer
	// than HDF5's and keep errors.Is(err, fs.ErrNotExist) working.
	flag := os.O_RDONLY
	if rw {
		flag = os.O_RDWR
	}
	osf, err := os.OpenFile(path, flag, 0)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, &Error{op, path, "", err}
	}
	osf.Close()
	lock()
	defer unlock()
	id := cFileOpen(path, rw)
	if id < 0 {
		msg := lastError()
		switch {
		case cIsHDF5(path) == 0:
			lastError() // clear
			err = wrap(ErrNotHDF5, "no HDF5 signature")
		case strings.Contains(msg, "unable to lock file") && strings.Contains(msg, "errno = 11"):
			err = wrap(ErrLocked, "a writer has it open; HDF5_USE_FILE_LOCKING=FALSE reads anyway: "+msg)
		case strings.Contains(msg, "unable to lock file"):
			err = wrap(ErrHDF5, "file locking failed; where the file system has no locks, set HDF5_USE_FILE_LOCKING=FALSE: "+msg)
		default:
			err = wrap(ErrNotHDF5, msg)
		}
		return nil, &Error{op, path, "", err}
	}
	return &File{path: path, id: id, rw: rw, tables: map[string]*Table{}}, nil
}

// Path returns the path the file was opened with.
func (f *File) Path() string {
	if f == nil {
		return ""
	}
	return f.path
}

// Close closes the file and every Table opened from it. Closing a closed File
// does nothing and returns nil.
func (f *File) Close() error {
	lock()
	defer unlock()
	if f == nil || f.closed {
		return nil
	}
	f.closed = true
	var err error
	for name, t := range f.tables {
		if !cClose(t.id) && err == nil {
			err = &Error{"close", f.path, name, libErr("")}
		}
		t.id = -1
	}
	f.tables = nil
	if !cClose(f.id) && err == nil {
		err = &Error{"close", f.path, "", libErr("")}
	}
	return err
}

// Flush writes everything HDF5 holds in memory for this file to the operating
// system (H5Fflush), so that a process killed afterwards leaves a file that
// readers open with what was written up to the flush. It does not fsync: it
// protects against a crash of the process, not of the machine. Flush on a
// read-only file does nothing.
func (f *File) Flush() error {
	lock()
	defer unlock()
	if err := f.check("flush", "", false); err != nil {
		return err
	}
	if !f.rw {
		return nil
	}
	if !cFlush(f.id) {
		return &Error{"flush", f.path, "", libErr("")}
	}
	return nil
}

// check returns an error if f cannot be used for op (write: op modifies the
// file). Call with the lock held.
func (f *File) check(op, obj string, write bool) error {
	if f == nil {
		return &Error{op, "", obj, ErrClosed}
	}
	if f.closed {
		return &Error{op, f.path, obj, ErrClosed}
	}
	if write && !f.rw {
		return &Error{op, f.path, obj, ErrReadOnly}
	}
	return nil
}

// cleanPath turns an object path ("results/ll/latency", "/a/b/", "" for the
// root) into the absolute form "/results/ll/latency" ("/" for the root).
func cleanPath(name string) (string, error) {
	t := strings.Trim(name, "/")
	if t == "" {
		return "/", nil
	}
	parts := strings.Split(t, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return "", wrap(ErrPath, fmt.Sprintf("%q: empty, . or .. component", name))
		}
	}
	return "/" + t, nil
}

// Exists reports whether the group or dataset at path exists ("" or "/" is
// the root group). It is false on a closed file or a malformed path.
func (f *File) Exists(path string) bool {
	p, err := cleanPath(path)
	if err != nil {
		return false
	}
	lock()
	defer unlock()
	if f.check("exists", p, false) != nil {
		return false
	}
	return cExists(f.id, p) > 0
}

// List returns the names of the members (groups and datasets) of the group at
// groupPath ("" or "/" for the root), sorted by name.
func (f *File) List(groupPath string) ([]string, error) {
	const op = "list"
	p, err := cleanPath(groupPath)
	if err != nil {
		return nil, &Error{op, f.Path(), groupPath, err}
	}
	lock()
	defer unlock()
	if err := f.check(op, p, false); err != nil {
		return nil, err
	}
	if err := f.requireKind(op, p, kindGroup); err != nil {
		return nil, err
	}
	names, ok := cLinkNames(f.id, p)
	if !ok {
		return nil, &Error{op, f.path, p, libErr("")}
	}
	return names, nil
}

// requireKind returns an error unless the object at p exists and is of kind
// k. Call with the lock held.
func (f *File) requireKind(op, p string, k objKind) error {
	switch e := cExists(f.id, p); {
	case e < 0:
		return &Error{op, f.path, p, libErr("")}
	case e == 0:
		return &Error{op, f.path, p, ErrNotFound}
	}
	got := cObjKind(f.id, p)
	if got == kindError {
		return &Error{op, f.path, p, libErr("")}
	}
	if got != k {
		want := "a group"
		if k == kindDataset {
			want = "a dataset"
		}
		return &Error{op, f.path, p, wrap(ErrType, fmt.Sprintf("%s, not %s", kindName(got), want))}
	}
	return nil
}

func kindName(k objKind) string {
	switch k {
	case kindGroup:
		return "a group"
	case kindDataset:
		return "a dataset"
	}
	return "a named datatype or other object"
}

// WriteAtomic writes a complete file at path, or nothing: it creates
// path+".tmp-<pid>" in the same directory, calls write with it, closes it,
// fsyncs it, renames it over path and fsyncs the directory. If anything
// fails (write's error included) it removes the temporary file and leaves an
// existing file at path untouched. write must not close the File.
func WriteAtomic(path string, write func(*File) error) (err error) {
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	f, err := Create(tmp)
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		// Also on a panic in write: no temporary file is left behind.
		if !renamed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("h5: write %q atomically: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return &Error{"write atomically", path, "", err}
	}
	if err := os.Rename(tmp, path); err != nil {
		return &Error{"write atomically", path, "", err}
	}
	renamed = true
	if err := syncDir(filepath.Dir(path)); err != nil {
		return &Error{"write atomically", path, "", fmt.Errorf("renamed, but syncing the directory: %w", err)}
	}
	return nil
}

func syncFile(path string) error {
	osf, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := osf.Sync(); err != nil {
		osf.Close()
		return err
	}
	return osf.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// Some file systems cannot sync a directory (EINVAL); nothing more to do there.
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}
