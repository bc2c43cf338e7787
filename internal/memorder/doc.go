// Package memorder has the one memory-order primitive sync/atomic lacks: a
// release store. ep raises its flags with it (a flag announces the data
// stored before it), where atomic.StoreUint64, sequentially consistent, is
// an XCHG on amd64 that stalls until the store owns the reader's cache line.
//
// It is a package of its own because a package that uses cgo, as ep does,
// cannot hold Go assembly.
package memorder
