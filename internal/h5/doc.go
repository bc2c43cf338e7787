// Package h5 reads and writes HDF5 files through a thin cgo layer over the
// system's HDF5 C library (pkg-config name "hdf5"; HDF5 1.10 or later). It
// covers what goep needs for per-step traces, checkpoints and benchmark
// results, and nothing more.
//
// # Files
//
// Create truncates or creates a file for writing, Open opens one read-only and
// OpenRW opens one to add to it. Close a File when done; closing also closes
// every Table opened from it. Flush (H5Fflush) hands everything written so far
// to the operating system: a writer killed after a Flush leaves a file that
// h5dump and Open read, with at least the rows flushed. (HDF5 itself promises
// this only for its SWMR mode; for the way goep writes, appending rows and
// setting attributes between flushes, the tests kill a writer and check it.
// Flush does not fsync: it protects against the death of the process, not of
// the machine.) For a file that must be whole
// or absent, such as a checkpoint, use WriteAtomic: it writes a temporary file
// next to the target and renames it into place only once it is complete and
// synced.
//
//	f, err := h5.Create("out/trace.h5")
//	...
//	loss, err := f.CreateTable("trace/loss", h5.Float64, nil, 0)
//	for step := range steps {
//		err = loss.Append([]float64{l})
//		...
//		err = f.Flush()
//	}
//	err = f.Close()
//
// # Objects and paths
//
// Groups and datasets are named by slash-separated paths ("results/ll/latency";
// a leading slash is optional, "" and "/" are the root group). Creating a
// dataset, a table or an attribute on a missing object creates the missing
// groups on the way (H5P_CRT_INTERMEDIATE_GROUP). List lists a group's members
// and Exists tests for an object.
//
// # Datasets and tables
//
// Element types are the DType values, Go float64, float32, int64, int32,
// uint64 and uint8, stored little-endian. Data is passed as a Go slice of the
// matching type in row-major (C) order with its shape as []int.
//
// WriteDataset writes a fixed dataset in one call (checkpoints). A Table
// (CreateTable, OpenTable) is a chunked dataset of shape [rows, rowShape...]
// whose first dimension is unlimited (H5S_UNLIMITED); Append adds whole rows.
// The Read functions (ReadFloat64, ...) read a whole dataset, Table or not,
// and return its data and shape. Types are never converted: reading a float32
// dataset with ReadFloat64, or appending []float32 to a float64 table, is an
// error wrapping ErrType; a length that does not fit the shape is an error
// wrapping ErrShape, naming the length.
//
// # Attributes
//
// SetAttr attaches a string, integer (stored as int64), float64, or a 1-D
// array of int64, float64 or strings to the root, a group or a dataset,
// replacing an attribute of the same name. AttrString, AttrStrings,
// AttrInt64, AttrInt64s, AttrFloat64 and AttrFloat64s read them back; an
// integer attribute is read by the Int64 functions whatever its stored integer
// width, a float attribute by the Float64 ones, and a mismatch is ErrType.
// AttrNames lists them. Strings are stored as fixed-length, NUL-terminated
// ASCII; variable-length strings written by other tools (h5py) are read too.
//
// # Errors
//
// HDF5's automatic printing of its error stack is turned off. Every error is
// an *Error naming the operation, the file and the object, and carrying the
// most specific message HDF5 left on its stack, for example
//
//	h5: open "out/ckpt.h5": not an HDF5 file or truncated: no HDF5 signature
//	h5: read "out/ckpt.h5" /w: wrong type: dataset is float32, not float64
//	h5: append "out/trace.h5" /trace/loss: bad shape: length 7 is not a multiple of the row length 3 (row shape [3])
//
// Test the cause with errors.Is against ErrNotHDF5, ErrLocked, ErrNotFound,
// ErrExist, ErrType, ErrShape, ErrPath, ErrReadOnly, ErrClosed, ErrHDF5, or an
// os error such as fs.ErrNotExist. A file that is not HDF5 or is truncated
// gives an error from Open (HDF5 checks the end of file recorded in the
// superblock); damage inside a file gives an error from the read that meets it.
// The tests cover both. HDF5's C library is not hardened against files crafted
// to crash it, so read files you trust. No function panics on bad input.
//
// # File format
//
// Files are written with HDF5's default library version bounds (the earliest
// format that can hold the data: superblock version 0). This is deliberate:
// with the latest format (H5Pset_libver_bounds LATEST), HDF5 1.10 marks the
// superblock of a file open for writing, and a file abandoned by a killed
// writer then stays marked, so h5dump refuses it ("unable to open file") until
// someone runs h5clear. In the default format a flushed file is readable as
// is; this was checked with h5dump 1.10.8 on a file flushed and abandoned with
// each setting, and the package's tests kill a writer and read its file with
// h5dump. The files are readable by HDF5 1.8 and later, h5py and h5dump.
//
// HDF5 1.10 also locks the files it opens: while a process holds a file open
// for writing, Open in another process (and h5dump) fails, with ErrLocked
// here, until the writer closes it or dies. Set HDF5_USE_FILE_LOCKING=FALSE
// in the reader's environment to read anyway (a live plot of a running trace,
// say): it then sees the file as of the writer's last Flush, at its own risk.
//
// # Concurrency and cgo
//
// The serial HDF5 library must not be entered from two threads at once, so
// every call into it, from every File, is serialised by one package-level
// mutex, held with the goroutine locked to its OS thread (HDF5's error stack is
// per thread). Files and Tables may be shared between goroutines, but calls do
// not run in parallel. Go memory is passed to C only for the duration of a
// call; C keeps no Go pointer, and every C string is freed. The exported API
// has no C types.
package h5
