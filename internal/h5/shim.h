// shim.h: the small C layer under package h5. Every function here is called
// from Go with the package mutex held and the calling goroutine locked to its
// OS thread (the HDF5 error stack is per thread in a thread-safe build).
//
// Ownership: no function keeps a pointer it was given after it returns.
// Identifiers (hid_t) returned here are owned by the caller, who closes them
// with goep_close. Buffers returned by goep_attr_names, goep_link_names and
// goep_aread_vlstr are malloc'd here and freed by the caller with free (or
// goep_free_vlstr).
#ifndef GOEP_H5_SHIM_H
#define GOEP_H5_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <hdf5.h>

// Element type codes shared with Go (DType values).
enum {
	GOEP_F64 = 1,
	GOEP_F32 = 2,
	GOEP_I64 = 3,
	GOEP_I32 = 4,
	GOEP_U64 = 5,
	GOEP_U8 = 6,
	GOEP_STR = 7, // strings (attributes only)
};

// Object kinds returned by goep_obj_kind.
enum {
	GOEP_OBJ_OTHER = 0,
	GOEP_OBJ_GROUP = 1,
	GOEP_OBJ_DATASET = 2,
};

// goep_begin turns off HDF5's automatic error printing for this thread and
// clears its error stack. Go calls it each time it takes the package lock.
void goep_begin(void);

// goep_errmsg writes the most specific message on this thread's error stack
// (and the API call that failed) into buf, then clears the stack.
void goep_errmsg(char *buf, size_t n);

hid_t goep_fcreate(const char *path);
hid_t goep_fopen(const char *path, int rw);
int goep_is_hdf5(const char *path);
herr_t goep_fflush(hid_t f);
herr_t goep_close(hid_t id);

// goep_exists reports whether every component of path (relative to loc, no
// leading slash, "" for loc itself) exists and resolves to an object: 1 yes,
// 0 no, negative on error.
int goep_exists(hid_t loc, const char *path);
int goep_obj_kind(hid_t loc, const char *path);
hid_t goep_oopen(hid_t loc, const char *path);
hid_t goep_gcreate(hid_t loc, const char *path);
// goep_link_names returns the names of the members of group path,
// NUL-separated, in name order; *count is set to their number.
char *goep_link_names(hid_t loc, const char *path, size_t *len, size_t *count);

// Datasets. dims, maxdims and chunk have rank elements; chunk NULL makes a
// contiguous dataset; rank 0 makes a scalar.
hid_t goep_dcreate(hid_t loc, const char *path, int code, int rank,
		   const hsize_t *dims, const hsize_t *maxdims, const hsize_t *chunk);
hid_t goep_dopen(hid_t loc, const char *path);
// goep_dinfo fills the element code (0: a type package h5 does not read),
// rank, dims, maxdims (up to maxrank) and whether the layout is chunked.
herr_t goep_dinfo(hid_t d, int *code, int *rank, hsize_t *dims, hsize_t *maxdims,
		  int maxrank, int *chunked);
herr_t goep_dwrite_all(hid_t d, int code, const void *buf);
herr_t goep_dread_all(hid_t d, int code, void *buf);
// goep_append grows the first dimension of d from dims[0] by nrows and writes
// buf into the new rows. dims has rank elements (the current extent).
herr_t goep_append(hid_t d, int code, int rank, const hsize_t *dims, hsize_t nrows,
		   const void *buf);

// Attributes on object obj. goep_aset replaces any attribute of that name.
// rank 0 is a scalar, rank 1 an array of n elements.
// goep_aexists: 1 yes, 0 no, negative on error.
int goep_aexists(hid_t obj, const char *name);
herr_t goep_aset(hid_t obj, const char *name, int code, int rank, hsize_t n, const void *buf);
// goep_aset_str stores n fixed-length NUL-terminated strings of strsize
// bytes each (buf holds n*strsize bytes).
herr_t goep_aset_str(hid_t obj, const char *name, int rank, hsize_t n, size_t strsize,
		     const char *buf);
// goep_ainfo describes attribute name: its class code (GOEP_F64 for any float,
// GOEP_I64 for any integer that fits int64 losslessly, GOEP_STR for strings,
// 0 otherwise), rank, number of elements, element size and whether it is a
// variable-length string.
herr_t goep_ainfo(hid_t obj, const char *name, int *code, int *rank, hsize_t *n,
		  size_t *size, int *vlen);
// goep_aread reads attribute name converted to code (GOEP_F64 or GOEP_I64).
herr_t goep_aread(hid_t obj, const char *name, int code, void *buf);
// goep_aread_fixstr reads a fixed-length string attribute in its own type.
herr_t goep_aread_fixstr(hid_t obj, const char *name, void *buf);
// goep_aread_vlstr reads n variable-length strings into a malloc'd array;
// free it with goep_free_vlstr.
char **goep_aread_vlstr(hid_t obj, const char *name, hsize_t n);
void goep_free_vlstr(char **s, hsize_t n);
char *goep_attr_names(hid_t obj, size_t *len, size_t *count);

#endif
