package h5

import (
	"fmt"
	"strings"
	"unsafe"
)

// SetAttr sets the attribute name on the group or dataset at objPath ("" or
// "/" for the file's root group), replacing any attribute of that name. If
// nothing exists at objPath, a group is created there (with its intermediate
// groups). value is one of:
//
//	string               a fixed-length NUL-terminated string (it must not contain NUL)
//	int, int64           a 64-bit signed integer
//	float64              a 64-bit float
//	[]int, []int64       a 1-D array of 64-bit signed integers
//	[]float64            a 1-D array of 64-bit floats
//	[]string             a 1-D array of fixed-length strings
func (f *File) SetAttr(objPath, name string, value any) error {
	const op = "set attribute"
	p, err := cleanPath(objPath)
	if err != nil {
		return &Error{op, f.Path(), objPath, err}
	}
	if name == "" {
		return &Error{op, f.Path(), p, wrap(ErrPath, "empty attribute name")}
	}
	lock()
	defer unlock()
	if err := f.check(op, p, true); err != nil {
		return err
	}
	obj, err := f.openObject(op, p, true)
	if err != nil {
		return err
	}
	defer cClose(obj)
	bad := func(e error) error { return &Error{op, f.path, p, fmt.Errorf("attribute %q: %w", name, e)} }
	ok := true
	switch v := value.(type) {
	case string:
		buf, size, err := packStrings([]string{v})
		if err != nil {
			return bad(err)
		}
		ok = cAttrSetStrings(obj, name, false, 1, size, buf)
	case []string:
		buf, size, err := packStrings(v)
		if err != nil {
			return bad(err)
		}
		ok = cAttrSetStrings(obj, name, true, len(v), size, buf)
	case int:
		x := int64(v)
		ok = cAttrSet(obj, name, Int64, false, 1, unsafe.Pointer(&x))
	case int64:
		ok = cAttrSet(obj, name, Int64, false, 1, unsafe.Pointer(&v))
	case float64:
		ok = cAttrSet(obj, name, Float64, false, 1, unsafe.Pointer(&v))
	case []int:
		x := make([]int64, len(v))
		for i, e := range v {
			x[i] = int64(e)
		}
		ok = cAttrSet(obj, name, Int64, true, len(x), nonNil(x))
	case []int64:
		ok = cAttrSet(obj, name, Int64, true, len(v), nonNil(v))
	case []float64:
		ok = cAttrSet(obj, name, Float64, true, len(v), nonNil(v))
	default:
		return bad(wrap(ErrType, fmt.Sprintf("value of type %s; SetAttr takes string, int, int64, float64, []int, []int64, []float64 or []string", typeName(value))))
	}
	if !ok {
		return bad(libErr(""))
	}
	return nil
}

// nonNil points at s's first element, or at a dummy for an empty s: HDF5
// refuses a NULL buffer even when there is nothing to write.
func nonNil[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return unsafe.Pointer(new(T))
	}
	return unsafe.Pointer(&s[0])
}

// packStrings lays ss out as NUL-terminated strings of one fixed size.
func packStrings(ss []string) (buf []byte, size int, err error) {
	size = 1
	for _, s := range ss {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, 0, wrap(ErrType, fmt.Sprintf("string %q contains a NUL byte", s))
		}
		size = max(size, len(s)+1)
	}
	buf = make([]byte, max(1, len(ss))*size)
	for i, s := range ss {
		copy(buf[i*size:], s)
	}
	return buf, size, nil
}

// openObject opens the object at p, creating a group there if create and
// nothing exists. Call with the lock held; the caller closes the result.
func (f *File) openObject(op, p string, create bool) (hid, error) {
	switch e := cExists(f.id, p); {
	case e < 0:
		return -1, &Error{op, f.path, p, libErr("")}
	case e == 0 && !create:
		return -1, &Error{op, f.path, p, ErrNotFound}
	case e == 0:
		if err := f.requireAbsent(op, p); err != nil {
			return -1, err
		}
		id := cGroupCreate(f.id, p)
		if id < 0 {
			return -1, &Error{op, f.path, p, libErr("creating the group")}
		}
		return id, nil
	}
	id := cObjOpen(f.id, p)
	if id < 0 {
		return -1, &Error{op, f.path, p, libErr("")}
	}
	return id, nil
}

// AttrNames returns the names of the attributes of the group or dataset at
// objPath ("" or "/" for the root), sorted.
func (f *File) AttrNames(objPath string) ([]string, error) {
	const op = "list attributes"
	var names []string
	err := f.readObject(op, objPath, func(obj hid, p string) error {
		var ok bool
		if names, ok = cAttrNames(obj); !ok {
			return &Error{op, f.path, p, libErr("")}
		}
		return nil
	})
	return names, err
}

// readObject opens the group or dataset at objPath for reading, under the
// package lock, and runs read on it.
func (f *File) readObject(op, objPath string, read func(obj hid, p string) error) error {
	p, err := cleanPath(objPath)
	if err != nil {
		return &Error{op, f.Path(), objPath, err}
	}
	lock()
	defer unlock()
	if err := f.check(op, p, false); err != nil {
		return err
	}
	obj, err := f.openObject(op, p, false)
	if err != nil {
		return err
	}
	defer cClose(obj)
	return read(obj, p)
}

// AttrString reads a string attribute.
func (f *File) AttrString(objPath, name string) (string, error) {
	v, err := readAttr(f, objPath, name, attrString, true, func(obj hid, info attrInfo) ([]string, bool) {
		return cAttrReadStrings(obj, name, info)
	})
	if err != nil {
		return "", err
	}
	return v[0], nil
}

// AttrStrings reads a string attribute as a slice (one element for a scalar).
func (f *File) AttrStrings(objPath, name string) ([]string, error) {
	return readAttr(f, objPath, name, attrString, false, func(obj hid, info attrInfo) ([]string, bool) {
		return cAttrReadStrings(obj, name, info)
	})
}

// AttrInt64 reads an integer attribute (any stored integer type that int64
// holds exactly) holding one value.
func (f *File) AttrInt64(objPath, name string) (int64, error) {
	v, err := readAttr(f, objPath, name, attrInt, true, numeric[int64](name, Int64))
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// AttrInt64s reads an integer attribute as a slice (one element for a scalar).
func (f *File) AttrInt64s(objPath, name string) ([]int64, error) {
	return readAttr(f, objPath, name, attrInt, false, numeric[int64](name, Int64))
}

// AttrFloat64 reads a floating-point attribute (float32 or float64) holding
// one value. An integer attribute is an error (ErrType), not converted.
func (f *File) AttrFloat64(objPath, name string) (float64, error) {
	v, err := readAttr(f, objPath, name, attrFloat, true, numeric[float64](name, Float64))
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// AttrFloat64s reads a floating-point attribute as a slice (one element for a
// scalar).
func (f *File) AttrFloat64s(objPath, name string) ([]float64, error) {
	return readAttr(f, objPath, name, attrFloat, false, numeric[float64](name, Float64))
}

func numeric[T any](name string, d DType) func(hid, attrInfo) ([]T, bool) {
	return func(obj hid, info attrInfo) ([]T, bool) {
		out := make([]T, info.n)
		if info.n == 0 {
			return out, true
		}
		return out, cAttrRead(obj, name, d, unsafe.Pointer(&out[0]))
	}
}

func attrKindName(k attrKind) string {
	switch k {
	case attrFloat:
		return "a float"
	case attrInt:
		return "an integer"
	case attrString:
		return "a string"
	}
	return "of another type (or an integer too large for int64)"
}

// readAttr finds attribute name on objPath, checks that it is of kind want
// (and holds one value if scalar) and reads it with get.
func readAttr[T any](f *File, objPath, name string, want attrKind, scalar bool, get func(hid, attrInfo) ([]T, bool)) ([]T, error) {
	const op = "read attribute"
	var v []T
	err := f.readObject(op, objPath, func(obj hid, p string) error {
		bad := func(e error) error { return &Error{op, f.path, p, fmt.Errorf("attribute %q: %w", name, e)} }
		switch e := cAttrExists(obj, name); {
		case e < 0:
			return bad(libErr(""))
		case e == 0:
			return bad(ErrNotFound)
		}
		info, ok := cAttrInfo(obj, name)
		if !ok {
			return bad(libErr(""))
		}
		if info.kind != want {
			return bad(wrap(ErrType, fmt.Sprintf("it is %s, not %s", attrKindName(info.kind), attrKindName(want))))
		}
		if scalar && info.n != 1 {
			return bad(wrap(ErrShape, fmt.Sprintf("it holds %d values, not 1", info.n)))
		}
		if v, ok = get(obj, info); !ok {
			return bad(libErr("reading it"))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}
