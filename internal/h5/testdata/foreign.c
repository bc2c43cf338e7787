// foreign.c writes foreign.h5, a file with types that package h5 does not
// write itself, as h5py or other tools might: variable-length strings,
// 32-bit and unsigned integers, float32 attributes and an int16 dataset.
//
//	gcc -o /tmp/foreign foreign.c $(pkg-config --cflags --libs hdf5) && /tmp/foreign foreign.h5
#include <hdf5.h>

static void attr(hid_t loc, const char *name, hid_t type, hid_t space, const void *buf) {
	hid_t a = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
	H5Awrite(a, type, buf);
	H5Aclose(a);
}

int main(int argc, char **argv) {
	hid_t f = H5Fcreate(argc > 1 ? argv[1] : "foreign.h5", H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
	hid_t scalar = H5Screate(H5S_SCALAR);
	hsize_t two = 2;
	hid_t pair = H5Screate_simple(1, &two, NULL);

	hid_t vls = H5Tcopy(H5T_C_S1);
	H5Tset_size(vls, H5T_VARIABLE);
	const char *one[1] = {"variable length"};
	attr(f, "vlen", vls, scalar, one);
	const char *both[2] = {"alpha", "beta, gamma"};
	attr(f, "vlens", vls, pair, both);

	int i32[2] = {-3, 7};
	attr(f, "i32", H5T_NATIVE_INT, pair, i32);
	unsigned u32 = 4000000000u;
	attr(f, "u32", H5T_NATIVE_UINT, scalar, &u32);
	unsigned long long u64 = 1;
	attr(f, "u64", H5T_NATIVE_ULLONG, scalar, &u64);
	float f32 = 0.25f;
	attr(f, "f32", H5T_NATIVE_FLOAT, scalar, &f32);

	hid_t fixed = H5Tcopy(H5T_C_S1);
	H5Tset_size(fixed, 4);
	H5Tset_strpad(fixed, H5T_STR_NULLPAD);
	attr(f, "nullpad", fixed, scalar, "full");

	short i16[2] = {1, 2};
	hid_t d = H5Dcreate2(f, "i16", H5T_STD_I16LE, pair, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
	H5Dwrite(d, H5T_NATIVE_SHORT, H5S_ALL, H5S_ALL, H5P_DEFAULT, i16);
	H5Dclose(d);

	H5Tclose(fixed);
	H5Tclose(vls);
	H5Sclose(pair);
	H5Sclose(scalar);
	return H5Fclose(f) < 0;
}
