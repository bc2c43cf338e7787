// shim.c: see shim.h. Plain HDF5 1.10 C API, also valid for 1.12 and 1.14
// (only calls whose signatures did not change between those versions).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"


typedef struct {
	char deepest[512];
	char api[128];
	int n;
} errwalk;

static herr_t errwalk_cb(unsigned n, const H5E_error2_t *e, void *data) {
	errwalk *w = data;
	(void)n;
	if (w->n == 0 && e->desc != NULL && e->desc[0] != '\0') {
		snprintf(w->deepest, sizeof w->deepest, "%s", e->desc);
	} else if (w->n == 0) {
		char msg[256];
		if (H5Eget_msg(e->min_num, NULL, msg, sizeof msg) > 0) {
			snprintf(w->deepest, sizeof w->deepest, "%s", msg);
		}
	}
	if (e->func_name != NULL) {
		snprintf(w->api, sizeof w->api, "%s", e->func_name); // the last one is the API call
	}
	w->n++;
	return 0;
}

// saved holds the first error seen since goep_begin or goep_errmsg: every
// HDF5 API call clears the error stack when it starts, so a failed call's
// errors must be copied out before the shim calls HDF5 again to clean up.
// The Go lock makes this static safe.
static errwalk saved;
static int have_saved;

// keep copies this thread's error stack into saved if it holds errors and
// nothing is saved yet. The shim calls it before every cleanup call.
static void keep(void) {
	if (have_saved || H5Eget_num(H5E_DEFAULT) <= 0) {
		return;
	}
	memset(&saved, 0, sizeof saved);
	// Upward: the deepest (most specific) error first, the API call last.
	H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, errwalk_cb, &saved);
	have_saved = saved.n > 0;
}

void goep_begin(void) {
	H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	H5Eclear2(H5E_DEFAULT);
	have_saved = 0;
}

void goep_errmsg(char *buf, size_t n) {
	keep();
	if (!have_saved) {
		snprintf(buf, n, "HDF5 call failed (no error on the HDF5 stack)");
	} else if (saved.deepest[0] == '\0') {
		snprintf(buf, n, "%s failed", saved.api);
	} else {
		snprintf(buf, n, "%s (%s)", saved.deepest, saved.api);
	}
	have_saved = 0;
	H5Eclear2(H5E_DEFAULT);
}

// Cleanup calls that first keep the error stack of a failed call.
static void k_pclose(hid_t id) {
	keep();
	H5Pclose(id);
}
static void k_sclose(hid_t id) {
	keep();
	H5Sclose(id);
}
static void k_tclose(hid_t id) {
	keep();
	H5Tclose(id);
}
static void k_aclose(hid_t id) {
	keep();
	H5Aclose(id);
}
static void k_gclose(hid_t id) {
	keep();
	H5Gclose(id);
}
static void k_oclose(hid_t id) {
	keep();
	H5Oclose(id);
}

static hid_t goep_fapl(void) {
	hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
	if (fapl < 0) {
		return fapl;
	}
	// Closing the file closes it for real (and flushes it), even if some
	// object were left open. Library version bounds stay at the default
	// (earliest): see doc.go.
	if (H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
		k_pclose(fapl);
		return -1;
	}
	return fapl;
}

hid_t goep_fcreate(const char *path) {
	hid_t fapl = goep_fapl();
	if (fapl < 0) {
		return fapl;
	}
	hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
	k_pclose(fapl);
	return f;
}

hid_t goep_fopen(const char *path, int rw) {
	hid_t fapl = goep_fapl();
	if (fapl < 0) {
		return fapl;
	}
	hid_t f = H5Fopen(path, rw ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl);
	k_pclose(fapl);
	return f;
}

int goep_is_hdf5(const char *path) { return (int)H5Fis_hdf5(path); }

herr_t goep_fflush(hid_t f) { return H5Fflush(f, H5F_SCOPE_GLOBAL); }

herr_t goep_close(hid_t id) {
	switch (H5Iget_type(id)) {
	case H5I_FILE:
		return H5Fclose(id);
	case H5I_GROUP:
		return H5Gclose(id);
	case H5I_DATASET:
		return H5Dclose(id);
	case H5I_DATATYPE:
		return H5Tclose(id);
	case H5I_DATASPACE:
		return H5Sclose(id);
	case H5I_ATTR:
		return H5Aclose(id);
	case H5I_GENPROP_LST:
		return H5Pclose(id);
	default:
		return H5Oclose(id);
	}
}

int goep_exists(hid_t loc, const char *path) {
	if (path[0] == '\0') {
		return 1;
	}
	size_t n = strlen(path);
	char *p = malloc(n + 1);
	if (p == NULL) {
		return -1;
	}
	memcpy(p, path, n + 1);
	// Check each prefix: H5Lexists fails (rather than answering 0) when an
	// intermediate group is missing.
	int ret = 1;
	for (size_t i = 0; i <= n; i++) {
		if (p[i] != '/' && p[i] != '\0') {
			continue;
		}
		char c = p[i];
		p[i] = '\0';
		htri_t e = H5Lexists(loc, p, H5P_DEFAULT);
		if (e > 0) {
			e = H5Oexists_by_name(loc, p, H5P_DEFAULT); // not a dangling link
		}
		if (e > 0 && c == '/') {
			// An intermediate component must be a group: "a/b" does not
			// exist under a dataset "a" (H5Lexists would fail).
			hid_t o = H5Oopen(loc, p, H5P_DEFAULT);
			if (o < 0) {
				e = -1;
			} else {
				e = H5Iget_type(o) == H5I_GROUP;
				H5Oclose(o);
			}
		}
		p[i] = c;
		if (e <= 0) {
			ret = (int)e;
			break;
		}
	}
	free(p);
	return ret;
}

int goep_obj_kind(hid_t loc, const char *path) {
	hid_t o = H5Oopen(loc, path, H5P_DEFAULT);
	if (o < 0) {
		return -1;
	}
	H5I_type_t t = H5Iget_type(o);
	k_oclose(o);
	switch (t) {
	case H5I_GROUP:
		return GOEP_OBJ_GROUP;
	case H5I_DATASET:
		return GOEP_OBJ_DATASET;
	default:
		return GOEP_OBJ_OTHER;
	}
}

hid_t goep_oopen(hid_t loc, const char *path) { return H5Oopen(loc, path, H5P_DEFAULT); }

static hid_t lcpl_intermediate(void) {
	hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
	if (lcpl < 0) {
		return lcpl;
	}
	if (H5Pset_create_intermediate_group(lcpl, 1) < 0) {
		k_pclose(lcpl);
		return -1;
	}
	return lcpl;
}

hid_t goep_gcreate(hid_t loc, const char *path) {
	hid_t lcpl = lcpl_intermediate();
	if (lcpl < 0) {
		return lcpl;
	}
	hid_t g = H5Gcreate2(loc, path, lcpl, H5P_DEFAULT, H5P_DEFAULT);
	k_pclose(lcpl);
	return g;
}

// growbuf collects NUL-separated names.
typedef struct {
	char *buf;
	size_t len, cap, count;
	int failed;
} growbuf;

static int growbuf_add(growbuf *g, const char *s, size_t n) {
	if (g->len + n + 1 > g->cap) {
		size_t c = g->cap ? g->cap : 256;
		while (g->len + n + 1 > c) {
			c *= 2;
		}
		char *b = realloc(g->buf, c);
		if (b == NULL) {
			g->failed = 1;
			return -1;
		}
		g->buf = b;
		g->cap = c;
	}
	memcpy(g->buf + g->len, s, n);
	g->buf[g->len + n] = '\0';
	g->len += n + 1;
	g->count++;
	return 0;
}

char *goep_link_names(hid_t loc, const char *path, size_t *len, size_t *count) {
	*len = 0;
	*count = 0;
	hid_t g = H5Gopen2(loc, path, H5P_DEFAULT);
	if (g < 0) {
		return NULL;
	}
	H5G_info_t info;
	if (H5Gget_info(g, &info) < 0) {
		k_gclose(g);
		return NULL;
	}
	growbuf gb;
	memset(&gb, 0, sizeof gb);
	for (hsize_t i = 0; i < info.nlinks; i++) {
		ssize_t n = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, NULL, 0, H5P_DEFAULT);
		if (n < 0) {
			gb.failed = 1;
			break;
		}
		char *name = malloc((size_t)n + 1);
		if (name == NULL) {
			gb.failed = 1;
			break;
		}
		if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, (size_t)n + 1,
				       H5P_DEFAULT) < 0) {
			free(name);
			gb.failed = 1;
			break;
		}
		int r = growbuf_add(&gb, name, (size_t)n);
		free(name);
		if (r < 0) {
			break;
		}
	}
	k_gclose(g);
	if (gb.failed) {
		free(gb.buf);
		return NULL;
	}
	if (gb.buf == NULL) {
		gb.buf = malloc(1); // an empty group: a valid, empty result
		if (gb.buf == NULL) {
			return NULL;
		}
	}
	*len = gb.len;
	*count = gb.count;
	return gb.buf;
}

static hid_t mem_type(int code) {
	switch (code) {
	case GOEP_F64:
		return H5T_NATIVE_DOUBLE;
	case GOEP_F32:
		return H5T_NATIVE_FLOAT;
	case GOEP_I64:
		return H5T_NATIVE_INT64;
	case GOEP_I32:
		return H5T_NATIVE_INT32;
	case GOEP_U64:
		return H5T_NATIVE_UINT64;
	case GOEP_U8:
		return H5T_NATIVE_UINT8;
	}
	return -1;
}

// file_type: the type stored in files, little-endian IEEE and two's
// complement whatever the host.
static hid_t file_type(int code) {
	switch (code) {
	case GOEP_F64:
		return H5T_IEEE_F64LE;
	case GOEP_F32:
		return H5T_IEEE_F32LE;
	case GOEP_I64:
		return H5T_STD_I64LE;
	case GOEP_I32:
		return H5T_STD_I32LE;
	case GOEP_U64:
		return H5T_STD_U64LE;
	case GOEP_U8:
		return H5T_STD_U8LE;
	}
	return -1;
}

// type_code maps a stored type to the code that reads it without conversion
// of meaning: floats by size, integers by size and sign. 0 for anything else.
static int type_code(hid_t t) {
	H5T_class_t c = H5Tget_class(t);
	size_t sz = H5Tget_size(t);
	if (c == H5T_FLOAT) {
		if (sz == 8) {
			return GOEP_F64;
		}
		if (sz == 4) {
			return GOEP_F32;
		}
		return 0;
	}
	if (c == H5T_INTEGER) {
		H5T_sign_t s = H5Tget_sign(t);
		if (s == H5T_SGN_2 && sz == 8) {
			return GOEP_I64;
		}
		if (s == H5T_SGN_2 && sz == 4) {
			return GOEP_I32;
		}
		if (s == H5T_SGN_NONE && sz == 8) {
			return GOEP_U64;
		}
		if (s == H5T_SGN_NONE && sz == 1) {
			return GOEP_U8;
		}
		return 0;
	}
	return 0;
}

hid_t goep_dcreate(hid_t loc, const char *path, int code, int rank, const hsize_t *dims,
		   const hsize_t *maxdims, const hsize_t *chunk) {
	hid_t ft = file_type(code);
	if (ft < 0) {
		return -1;
	}
	hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, maxdims);
	if (space < 0) {
		return -1;
	}
	hid_t lcpl = lcpl_intermediate();
	hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
	hid_t d = -1;
	if (lcpl >= 0 && dcpl >= 0 && (chunk == NULL || H5Pset_chunk(dcpl, rank, chunk) >= 0)) {
		d = H5Dcreate2(loc, path, ft, space, lcpl, dcpl, H5P_DEFAULT);
	}
	if (dcpl >= 0) {
		k_pclose(dcpl);
	}
	if (lcpl >= 0) {
		k_pclose(lcpl);
	}
	k_sclose(space);
	return d;
}

hid_t goep_dopen(hid_t loc, const char *path) { return H5Dopen2(loc, path, H5P_DEFAULT); }

herr_t goep_dinfo(hid_t d, int *code, int *rank, hsize_t *dims, hsize_t *maxdims, int maxrank,
		  int *chunked) {
	hid_t t = H5Dget_type(d);
	if (t < 0) {
		return -1;
	}
	*code = type_code(t);
	k_tclose(t);
	hid_t s = H5Dget_space(d);
	if (s < 0) {
		return -1;
	}
	int r = H5Sget_simple_extent_ndims(s);
	if (r < 0 || r > maxrank) {
		k_sclose(s);
		return -1;
	}
	*rank = r;
	if (r > 0 && H5Sget_simple_extent_dims(s, dims, maxdims) < 0) {
		k_sclose(s);
		return -1;
	}
	k_sclose(s);
	hid_t p = H5Dget_create_plist(d);
	if (p < 0) {
		return -1;
	}
	*chunked = H5Pget_layout(p) == H5D_CHUNKED;
	k_pclose(p);
	return 0;
}

herr_t goep_dwrite_all(hid_t d, int code, const void *buf) {
	return H5Dwrite(d, mem_type(code), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
}

herr_t goep_dread_all(hid_t d, int code, void *buf) {
	return H5Dread(d, mem_type(code), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
}

herr_t goep_append(hid_t d, int code, int rank, const hsize_t *dims, hsize_t nrows,
		   const void *buf) {
	if (rank < 1 || rank > H5S_MAX_RANK) {
		return -1;
	}
	hsize_t newdims[H5S_MAX_RANK], start[H5S_MAX_RANK], count[H5S_MAX_RANK];
	for (int i = 0; i < rank; i++) {
		newdims[i] = dims[i];
		start[i] = 0;
		count[i] = dims[i];
	}
	newdims[0] = dims[0] + nrows;
	start[0] = dims[0];
	count[0] = nrows;
	if (H5Dset_extent(d, newdims) < 0) {
		return -1;
	}
	hid_t fs = H5Dget_space(d);
	if (fs < 0) {
		return -1;
	}
	herr_t ret = -1;
	hid_t ms = H5Screate_simple(rank, count, NULL);
	if (ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0) {
		ret = H5Dwrite(d, mem_type(code), ms, fs, H5P_DEFAULT, buf);
	}
	if (ms >= 0) {
		k_sclose(ms);
	}
	k_sclose(fs);
	return ret;
}

static herr_t attr_replace(hid_t obj, const char *name, hid_t ft, hid_t space, hid_t mt,
			   const void *buf) {
	htri_t e = H5Aexists(obj, name);
	if (e < 0) {
		return -1;
	}
	if (e > 0 && H5Adelete(obj, name) < 0) {
		return -1;
	}
	hid_t a = H5Acreate2(obj, name, ft, space, H5P_DEFAULT, H5P_DEFAULT);
	if (a < 0) {
		return -1;
	}
	herr_t ret = H5Awrite(a, mt, buf);
	if (H5Aclose(a) < 0) {
		ret = -1;
	}
	return ret;
}

static hid_t attr_space(int rank, hsize_t n) {
	if (rank == 0) {
		return H5Screate(H5S_SCALAR);
	}
	return H5Screate_simple(1, &n, NULL);
}

int goep_aexists(hid_t obj, const char *name) { return (int)H5Aexists(obj, name); }

herr_t goep_aset(hid_t obj, const char *name, int code, int rank, hsize_t n, const void *buf) {
	hid_t ft = file_type(code), mt = mem_type(code);
	if (ft < 0 || mt < 0) {
		return -1;
	}
	hid_t space = attr_space(rank, n);
	if (space < 0) {
		return -1;
	}
	herr_t ret = attr_replace(obj, name, ft, space, mt, buf);
	k_sclose(space);
	return ret;
}

herr_t goep_aset_str(hid_t obj, const char *name, int rank, hsize_t n, size_t strsize,
		     const char *buf) {
	hid_t t = H5Tcopy(H5T_C_S1);
	if (t < 0) {
		return -1;
	}
	herr_t ret = -1;
	if (H5Tset_size(t, strsize) >= 0 && H5Tset_strpad(t, H5T_STR_NULLTERM) >= 0) {
		hid_t space = attr_space(rank, n);
		if (space >= 0) {
			ret = attr_replace(obj, name, t, space, t, buf);
			k_sclose(space);
		}
	}
	k_tclose(t);
	return ret;
}

herr_t goep_ainfo(hid_t obj, const char *name, int *code, int *rank, hsize_t *n, size_t *size,
		  int *vlen) {
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
	if (a < 0) {
		return -1;
	}
	herr_t ret = -1;
	hid_t t = H5Aget_type(a);
	hid_t s = H5Aget_space(a);
	if (t >= 0 && s >= 0) {
		H5T_class_t c = H5Tget_class(t);
		*size = H5Tget_size(t);
		*vlen = 0;
		*code = 0;
		if (c == H5T_FLOAT) {
			*code = GOEP_F64;
		} else if (c == H5T_INTEGER) {
			// Any integer that int64 holds exactly: signed up to 64 bits,
			// unsigned up to 32.
			if (H5Tget_sign(t) == H5T_SGN_2 ? *size <= 8 : *size <= 4) {
				*code = GOEP_I64;
			}
		} else if (c == H5T_STRING) {
			*code = GOEP_STR;
			*vlen = H5Tis_variable_str(t) > 0;
		}
		int r = H5Sget_simple_extent_ndims(s);
		hssize_t np = H5Sget_simple_extent_npoints(s);
		if (r >= 0 && np >= 0) {
			*rank = r;
			*n = (hsize_t)np;
			ret = 0;
		}
	}
	if (s >= 0) {
		k_sclose(s);
	}
	if (t >= 0) {
		k_tclose(t);
	}
	k_aclose(a);
	return ret;
}

herr_t goep_aread(hid_t obj, const char *name, int code, void *buf) {
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
	if (a < 0) {
		return -1;
	}
	herr_t ret = H5Aread(a, mem_type(code), buf);
	k_aclose(a);
	return ret;
}

herr_t goep_aread_fixstr(hid_t obj, const char *name, void *buf) {
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
	if (a < 0) {
		return -1;
	}
	herr_t ret = -1;
	hid_t t = H5Aget_type(a);
	if (t >= 0) {
		ret = H5Aread(a, t, buf);
		k_tclose(t);
	}
	k_aclose(a);
	return ret;
}

char **goep_aread_vlstr(hid_t obj, const char *name, hsize_t n) {
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
	if (a < 0) {
		return NULL;
	}
	char **out = calloc(n ? n : 1, sizeof(char *));
	hid_t t = H5Tcopy(H5T_C_S1);
	herr_t ret = -1;
	if (out != NULL && t >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0) {
		ret = H5Aread(a, t, out);
	}
	if (t >= 0) {
		k_tclose(t);
	}
	k_aclose(a);
	if (ret < 0) {
		free(out);
		return NULL;
	}
	return out;
}

void goep_free_vlstr(char **s, hsize_t n) {
	for (hsize_t i = 0; i < n; i++) {
		H5free_memory(s[i]);
	}
	free(s);
}

static herr_t attr_name_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
	(void)loc;
	(void)info;
	return growbuf_add(data, name, strlen(name)) < 0 ? -1 : 0;
}

char *goep_attr_names(hid_t obj, size_t *len, size_t *count) {
	*len = 0;
	*count = 0;
	growbuf gb;
	memset(&gb, 0, sizeof gb);
	hsize_t idx = 0;
	if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_name_cb, &gb) < 0 || gb.failed) {
		free(gb.buf);
		return NULL;
	}
	if (gb.buf == NULL) {
		gb.buf = malloc(1);
		if (gb.buf == NULL) {
			return NULL;
		}
	}
	*len = gb.len;
	*count = gb.count;
	return gb.buf;
}
